"""A transformation suite over a scenes split: the same scenes, shifted in ways the world never draws.

    python -m sat_core.transforms --data data/scenes/dataset.json --out data/scenes_suite [--split test]

Each transform is a pure function ``(image (H, W, 3) uint8, objects) -> (image, objects)`` that changes
the pixels and the object records together (masks, bbox, full_bbox, foot, centroid, area), so grounded
figures stay meaningful on the transformed images:

- ``hflip``      the mirror image; "a left of b" becomes "a' right of b'", every other relation unchanged
- ``zoom_out``   the image scaled to 70 % and centred on a canvas filled from its edge colours
- ``brightness`` every pixel × 0.6
- ``jpeg``       JPEG at quality 20, decoded again
- ``crop``       the central 80 % resized back to the full size; objects with less than ``MIN_KEPT``
                 of their visible pixels inside the crop are dropped
- ``grayscale``  luminance (ITU-R 601, as PIL's "L") in all three channels

``write_suite`` writes one folder per transform, each a Karpathy-format dataset of the split (same file
names, ids and schema). Transforms that move objects regenerate the references from the transformed
objects with ``captions.describe`` (the source's caption order, seeded per image), so flipped
references state mirrored relations and cropped ones never name a dropped object; photometric transforms
leave the objects as they are and keep the source's references, so their figures differ from the test
split's by the pixels alone. As in the generator's records, ``full_bbox`` is the whole sprite's box within
the image and ``foot`` its bottom row, which a crop may push below the image.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from sat_core.data.masks import rle_decode, rle_encode
from sat_core.errors import DatasetError
from sat_core.worlds.references import CAPTIONS_PER_IMAGE
from sat_core.worlds.writer import SHIPPED_CAPTION_ORDER

ZOOM_OUT = 0.7  # the scaled image's side, as a share of the canvas
BRIGHTNESS = 0.6
JPEG_QUALITY = 20
CROP = 0.8  # the kept central window's side, as a share of the image
MIN_KEPT = 0.5  # a cropped object keeps at least this share of its visible pixels, else it is dropped

Objects = list[dict[str, Any]]
Transform = Callable[[np.ndarray, Objects], tuple[np.ndarray, Objects]]
Box = tuple[int, int, int, int]  # x0, y0, x1, y1 (exclusive ends)


# ---- object records ---------------------------------------------------------------------------------

def _with_mask(obj: dict[str, Any], mask: np.ndarray, **changed: Any) -> dict[str, Any]:
    """``obj`` with its visible mask replaced, and bbox, centroid and area recomputed from it."""
    ys, xs = np.nonzero(mask)
    return {**obj, **changed,
            "bbox": [int(xs.min()), int(ys.min()), int(xs.max() - xs.min() + 1), int(ys.max() - ys.min() + 1)],
            "centroid": [round(float(xs.mean()), 2), round(float(ys.mean()), 2)],
            "area": int(mask.sum()), "mask": rle_encode(mask)}


def _resize_mask(mask: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """A bool mask resized to (w, h) as the image is (bilinear), kept where at least half covered."""
    from PIL import Image

    resized = Image.fromarray(mask.astype(np.float32), "F").resize(size, Image.Resampling.BILINEAR)
    return np.asarray(resized) >= 0.5


def _rescale(image: np.ndarray, objects: Objects, window: Box, dest: Box, *, min_kept: float = 0.0) -> tuple[
        np.ndarray, Objects]:
    """The ``window`` of the image resized onto the ``dest`` rectangle of a canvas of the same size, the rest of
    the canvas filled from the resized image's edge colours; objects follow. An object keeping less than
    ``min_kept`` of its visible pixels inside the window, or none after resizing, is dropped."""
    from PIL import Image

    H, W = image.shape[:2]
    (x0, y0, x1, y1), (dx0, dy0, dx1, dy1) = window, dest
    size = (dx1 - dx0, dy1 - dy0)  # (w, h) of the resized window
    inner = np.asarray(Image.fromarray(image[y0:y1, x0:x1]).resize(size, Image.Resampling.BILINEAR))
    out = np.pad(inner, ((dy0, H - dy1), (dx0, W - dx1), (0, 0)), mode="edge")  # (H, W, 3)
    kx, ky = size[0] / (x1 - x0), size[1] / (y1 - y0)

    def to_x(x: float) -> int:
        return round(dx0 + (x - x0) * kx)

    def to_y(y: float) -> int:
        return round(dy0 + (y - y0) * ky)

    moved = []
    for o in objects:
        mask = rle_decode(o["mask"])  # (H, W) bool
        inside = mask[y0:y1, x0:x1]
        if inside.sum() < max(min_kept * mask.sum(), 1):
            continue
        canvas = np.zeros((H, W), bool)
        canvas[dy0:dy1, dx0:dx1] = _resize_mask(inside, size)
        if not canvas.any():
            continue
        fx, fy, fw, fh = o["full_bbox"]  # the whole sprite's box within the image, as the generator keeps it
        left, top = max(to_x(fx), 0), max(to_y(fy), 0)
        right, bottom = min(to_x(fx + fw), W), min(to_y(fy + fh), H)
        moved.append(_with_mask(o, canvas, full_bbox=[left, top, right - left, bottom - top], foot=to_y(o["foot"])))
    return out, moved


# ---- the transforms -----------------------------------------------------------------------------------

def hflip(image: np.ndarray, objects: Objects) -> tuple[np.ndarray, Objects]:
    """The mirror image: pixel column x goes to W - 1 - x, a box [x, y, w, h] to [W - x - w, y, w, h]."""
    W = image.shape[1]
    flipped = []
    for o in objects:
        fx, fy, fw, fh = o["full_bbox"]
        flipped.append(_with_mask(o, np.fliplr(rle_decode(o["mask"])), full_bbox=[W - fx - fw, fy, fw, fh]))
    return np.ascontiguousarray(image[:, ::-1]), flipped


def zoom_out(image: np.ndarray, objects: Objects) -> tuple[np.ndarray, Objects]:
    """The image scaled to ``ZOOM_OUT`` of its size, centred on a canvas filled from its edge colours."""
    H, W = image.shape[:2]
    h, w = round(H * ZOOM_OUT), round(W * ZOOM_OUT)
    top, left = (H - h) // 2, (W - w) // 2
    return _rescale(image, objects, (0, 0, W, H), (left, top, left + w, top + h))


def crop(image: np.ndarray, objects: Objects) -> tuple[np.ndarray, Objects]:
    """The central ``CROP`` of the image resized back to its size; objects mostly outside are dropped."""
    H, W = image.shape[:2]
    h, w = round(H * CROP), round(W * CROP)
    top, left = (H - h) // 2, (W - w) // 2
    return _rescale(image, objects, (left, top, left + w, top + h), (0, 0, W, H), min_kept=MIN_KEPT)


def brightness(image: np.ndarray, objects: Objects) -> tuple[np.ndarray, Objects]:
    """Every pixel × ``BRIGHTNESS``."""
    return np.clip(np.rint(image * BRIGHTNESS), 0, 255).astype(np.uint8), objects


def jpeg(image: np.ndarray, objects: Objects, quality: int = JPEG_QUALITY) -> tuple[np.ndarray, Objects]:
    """The image saved as JPEG at ``quality`` (the suite's: ``JPEG_QUALITY``) and decoded again."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    buffer.seek(0)
    return np.asarray(Image.open(buffer).convert("RGB")), objects


def grayscale(image: np.ndarray, objects: Objects) -> tuple[np.ndarray, Objects]:
    """Luminance (PIL's "L": 0.299 R + 0.587 G + 0.114 B) in all three channels."""
    from PIL import Image

    luminance = np.asarray(Image.fromarray(image).convert("L"))  # (H, W)
    return np.repeat(luminance[..., None], 3, axis=2), objects


@dataclass(frozen=True)
class Shift:
    """One transform of the suite; ``moves_objects``: its references are regenerated from the new objects."""

    name: str
    apply: Transform
    moves_objects: bool


SUITE = (Shift("hflip", hflip, True), Shift("zoom_out", zoom_out, True), Shift("brightness", brightness, False),
         Shift("jpeg", jpeg, False), Shift("crop", crop, True), Shift("grayscale", grayscale, False))
NAMES = tuple(s.name for s in SUITE)


# ---- writing the suite --------------------------------------------------------------------------------

def references(objects: Objects, place: str, *, seed: int, imgid: int, caption_order: str) -> list[dict[str, Any]]:
    """Reference captions of the transformed objects (``captions.describe``), seeded by the image alone,
    so every transform that leaves the same objects gets the same references."""
    from sat_core.worlds.scenes.captions import describe

    return describe(objects, place, np.random.default_rng([seed, imgid]), caption_order=caption_order)


def _entry(source: dict[str, Any], image: np.ndarray, objects: Objects, shift: Shift, doc: dict[str, Any]) -> dict[
        str, Any]:
    """The transformed image's dataset record: the source's, with the new objects (and references)."""
    imgid = source["imgid"]
    entry = {**source, "objects": objects}
    if shift.moves_objects:
        caps = references(objects, source.get("place"), seed=int(doc.get("seed") or 0), imgid=imgid,
                          caption_order=doc.get("caption_order", SHIPPED_CAPTION_ORDER))
        entry["sentences"] = [{"tokens": c["tokens"], "raw": c["raw"], "imgid": imgid,
                               "sentid": imgid * CAPTIONS_PER_IMAGE + k, "links": c["links"]}
                              for k, c in enumerate(caps)]
        entry["sentids"] = [s["sentid"] for s in entry["sentences"]]
    return entry


def _read(dataset_json: Path, split: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    try:
        doc = json.loads(Path(dataset_json).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DatasetError(f"Cannot read the dataset {dataset_json} ({err}); generate a scenes world with "
                           "python -m sat_core.world --kind scenes.") from None
    entries = [e for e in doc.get("images", []) if e.get("split") == split]
    if not entries or not all(e.get("objects") and "full_bbox" in e["objects"][0] for e in entries):
        raise DatasetError(f"{dataset_json} has no {split} scenes with objects; the transformation suite needs a "
                           "scenes world (python -m sat_core.world --kind scenes).")
    return doc, entries


def write_suite(dataset_json: str | Path, images_root: str | Path, out_dir: str | Path, split: str = "test",
                *, names: tuple[str, ...] = NAMES, jpeg_quality: int = JPEG_QUALITY) -> dict[str, Path]:
    """Write ``out_dir/<transform>/dataset.json`` and its images for each transform of the suite, over the
    ``split`` of a scenes dataset whose images lie under ``images_root``; returns name -> dataset.json path.
    ``jpeg_quality`` replaces the suite's quality 20 (to see how recall falls with compression, on validation).

    An image whose every object a crop drops is left out of that transform's set (listed in its
    dataset.json under ``dropped``)."""
    from PIL import Image

    if not 1 <= jpeg_quality <= 95:
        raise DatasetError(f"JPEG quality {jpeg_quality} is outside 1–95 (PIL's range; 20 is the suite's).")
    doc, entries = _read(Path(dataset_json), split)
    shifts = [replace(s, apply=partial(jpeg, quality=jpeg_quality)) if s.name == "jpeg" else s
              for s in SUITE if s.name in names]
    out_dir = Path(out_dir)
    written: dict[str, list[dict[str, Any]]] = {s.name: [] for s in shifts}
    dropped: dict[str, list[str]] = {s.name: [] for s in shifts}
    try:
        for s in shifts:
            (out_dir / s.name / split).mkdir(parents=True, exist_ok=True)
        for source in entries:
            path = Path(images_root) / source.get("filepath", "") / source["filename"]
            try:
                pixels = np.asarray(Image.open(path).convert("RGB"))  # (H, W, 3)
            except OSError as err:
                raise DatasetError(f"Cannot read the image {path} ({err}); pass the dataset's images folder.") from None
            for s in shifts:
                image, objects = s.apply(pixels, source["objects"])
                if not objects:
                    dropped[s.name].append(source["filename"])
                    continue
                Image.fromarray(image).save(out_dir / s.name / split / source["filename"], format="PNG",
                                            compress_level=1)
                written[s.name].append(_entry(source, image, objects, s, doc))
        paths = {}
        header = {k: v for k, v in doc.items() if k != "images"}
        for s in shifts:
            paths[s.name] = out_dir / s.name / "dataset.json"
            paths[s.name].write_text(json.dumps(
                {**header, "transform": s.name, "source": str(dataset_json), "split": split,
                 "dropped": dropped[s.name], "images": written[s.name]}, separators=(",", ":")))
    except OSError as err:
        raise DatasetError(f"Cannot write the suite under {out_dir} ({err}); check free space and permissions.") \
            from None
    return paths
