"""What the shipped models say about real photos: scikit-image's sample photos, one table.

    python -m explorer.dev.photos [--checkpoints checkpoints/scenes_soft checkpoints/scenes_hard] [--beam N]

Prints a Markdown table: each photo, what it shows, each checkpoint's best caption (beam search with
the beam and length normalisation it was evaluated with, as in the explorer; the checkpoint's own
preprocessing) and whether the out-of-domain check would warn (the colour statistics and the encoder's
mean annotations of the checkpoint's training images, stored in it; "encoder 2.3×": how many times
farther the photo lies from its nearest training image than the loneliest training image from the rest). The photos ship with scikit-image, so the
table is reproducible offline.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from sat_core.caption import caption_files
from sat_core.checkpoint import load_checkpoint
from sat_core.evaluation.domain import DomainReference, mean_annotations
from sat_core.data.images import load_image, preprocess

REPO_ROOT = Path(__file__).resolve().parents[2]
# scikit-image sample -> what the photo shows (the scenes world's word for it, where it has one)
PHOTOS = {
    "chelsea": "a cat",
    "coffee": "a cup of coffee",
    "stereo_motorcycle": "a motorcycle",
    "astronaut": "a person (astronaut)",
    "rocket": "a rocket",
}


def photo(name: str) -> Image.Image:
    from skimage import data

    pixels = getattr(data, name)()
    if isinstance(pixels, tuple):  # stereo_motorcycle: (left, right, disparity)
        pixels = pixels[0]
    return Image.fromarray(np.asarray(pixels)).convert("RGB")


def table(checkpoints: list[Path], folder: Path, beam: int | None = None) -> str:
    sources = []
    for name in PHOTOS:
        path = folder / f"{name}.png"
        photo(name).save(path)
        sources.append(str(path))
    columns = {}
    for ckpt in checkpoints:
        loaded = load_checkpoint(ckpt)
        cfg = loaded.decode_defaults()  # as the explorer decodes
        cfg = cfg if beam is None else dataclasses.replace(cfg, beam_size=beam)
        results, failed = caption_files(loaded, sources, cfg)
        if failed:
            raise SystemExit(f"{ckpt}: {failed}")
        stored = (loaded.config.get("training") or {}).get("domain")
        reference = DomainReference.from_dict(stored) if stored else None
        cells = []
        for src, result in zip(sources, results):
            warn = ""
            if reference is not None:
                image = load_image(src)
                annotation = mean_annotations(loaded.model, preprocess(image, loaded.preprocess)[0][None])[0]
                check = reference.check(image, annotation)
                seen = "" if check.annotation_ratio is None else f", encoder {check.annotation_ratio:.1f}×"
                warn = f" ({'⚠ out of domain' if check.far else 'in domain'}{seen})"
            cells.append(f"“{result.best.caption}”{warn}")
        columns[ckpt.name] = cells
    head = "| photo | shows | " + " | ".join(columns) + " |"
    rows = [head, "| " + " | ".join(["---"] * (2 + len(columns))) + " |"]
    for k, (name, shows) in enumerate(PHOTOS.items()):
        rows.append(f"| `{name}` | {shows} | " + " | ".join(col[k] for col in columns.values()) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m explorer.dev.photos", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", nargs="+", type=Path,
                        default=[REPO_ROOT / "checkpoints" / n for n in ("scenes_soft", "scenes_hard")])
    parser.add_argument("--beam", type=int, default=None,
                        help="beam size (default: each checkpoint's own, as the explorer decodes)")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "sat-explorer-photos",
                        help="folder the photos are written to (default: a folder in the system's temp dir)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    print(table(args.checkpoints, args.out, args.beam))


if __name__ == "__main__":
    main()
