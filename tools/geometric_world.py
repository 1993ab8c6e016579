"""A copy of a scenes world whose training pictures are zoomed out onto their edge colours and/or mirrored.

    python tools/geometric_world.py --data data/scenes/dataset.json --out data/scenes_zoom --zoom 0.3 [--flip 0.5]

Each training picture draws, from its own generator seeded by (--seed, imgid), whether it is mirrored (share
--flip), whether it is zoomed out (share --zoom) and to what scale (--lo to --hi of the canvas, placed anywhere on
it); the suite's transforms (sat_core.worlds.scenes.transforms) move the pixels and the object records together,
and a mirrored scene's references are described again from its mirrored objects. Validation and test pictures,
and untouched training ones, are hard links to the source's. A recipe experiment (docs/EXPERIMENTS.md,
2026-11-28), not part of the world.
"""
import argparse
import json
import multiprocessing
import os
from pathlib import Path

import numpy as np
from PIL import Image

from sat_core.worlds.references import CAPTIONS_PER_IMAGE
from sat_core.worlds.scenes import transforms as T

ARGS = None


def one(entry):
    a = ARGS
    src = Path(a.images) / entry["filepath"] / entry["filename"]
    dst = Path(a.out) / entry["filepath"] / entry["filename"]
    if entry["split"] != "train":
        os.link(src, dst)
        return entry
    rng = np.random.default_rng([a.seed, entry["imgid"]])
    flip, zoom, scale, fx, fy = rng.random() < a.flip, rng.random() < a.zoom, rng.uniform(a.lo, a.hi), rng.random(), rng.random()
    if not (flip or zoom):
        os.link(src, dst)
        return entry
    image, objects = np.asarray(Image.open(src).convert("RGB")), entry["objects"]
    done = []
    if flip:
        image, objects = T.hflip(image, objects)
        done.append("hflip")
    if zoom:
        H, W = image.shape[:2]
        h, w = round(H * scale), round(W * scale)
        top, left = int(fy * (H - h)), int(fx * (W - w))
        image, moved = T._rescale(image, objects, (0, 0, W, H), (left, top, left + w, top + h))
        if len(moved) == len(objects):
            objects = moved
            done.append(f"zoom {scale:.2f}")
        else:  # an object vanished in the resize: keep the unzoomed picture
            image = np.asarray(Image.open(src).convert("RGB"))
            if flip:
                image, objects = T.hflip(image, entry["objects"])
    Image.fromarray(image).save(dst, format="PNG", compress_level=1)
    out = {**entry, "objects": objects, "geometric": done}
    if flip:
        imgid = entry["imgid"]
        caps = T.references(objects, entry.get("place"), seed=a.seed + 1000, imgid=imgid, caption_order="largest_first")
        out["sentences"] = [{"tokens": c["tokens"], "raw": c["raw"], "imgid": imgid,
                             "sentid": imgid * CAPTIONS_PER_IMAGE + k, "links": c["links"]} for k, c in enumerate(caps)]
        out["sentids"] = [s["sentid"] for s in out["sentences"]]
    return out


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--images")
    p.add_argument("--out", required=True)
    p.add_argument("--zoom", type=float, default=0.0)
    p.add_argument("--flip", type=float, default=0.0)
    p.add_argument("--lo", type=float, default=0.55)
    p.add_argument("--hi", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--workers", type=int, default=4)
    ARGS = p.parse_args()
    ARGS.images = ARGS.images or str(Path(ARGS.data).parent)
    doc = json.loads(Path(ARGS.data).read_text())
    for split in ("train", "val", "test"):
        (Path(ARGS.out) / split).mkdir(parents=True, exist_ok=True)
    with multiprocessing.Pool(ARGS.workers) as pool:
        images = pool.map(one, doc["images"], chunksize=64)
    doc["images"] = images
    (Path(ARGS.out) / "dataset.json").write_text(json.dumps(doc, separators=(",", ":")))
    n = sum(1 for e in images if e.get("geometric"))
    print(f"{ARGS.out}: {n} of {sum(e['split'] == 'train' for e in images)} training pictures changed", flush=True)


if __name__ == "__main__":
    main()
