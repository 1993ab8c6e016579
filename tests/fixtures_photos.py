"""A Karpathy-format set of real-looking photos the tests make themselves: crops and tints of the photos
that ship with scikit-image, in a flat images/ folder, described the way Flickr8k's files are."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

# (skimage photo, what it shows, five reference captions)
PHOTOS = {
    "chelsea": ["a cat sitting on the floor", "an orange cat looks up", "a tabby cat on a wooden floor",
                "the cat is sitting", "a cat looking at the camera"],
    "coffee": ["a cup of coffee on a saucer", "a white cup of coffee", "coffee in a cup on a table",
               "a cup with a spoon", "a hot cup of coffee"],
    "astronaut": ["an astronaut in a white suit", "a woman in a space suit smiles", "an astronaut with a flag",
                  "a smiling astronaut", "a woman wearing a space suit"],
    "rocket": ["a rocket on the launch pad", "a white rocket ready to launch", "the rocket stands on the pad",
               "a space rocket under a blue sky", "a rocket at the launch site"],
}


def _photo(name: str) -> np.ndarray:
    from skimage import data

    return getattr(data, name)()


def make_photo_set(folder: Path, per_photo: int = 6, test_per_photo: int = 2, seed: int = 0) -> Path:
    """``folder/dataset_photos.json`` + ``folder/images/*.jpg``; returns the JSON path.

    Each photo gives ``per_photo`` random crops with a random tint: the first ``test_per_photo`` are test
    images, one is val, the rest train. Entries carry Flickr-style ``filepath``/``filename``.
    """
    rng = np.random.default_rng(seed)
    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, captions in PHOTOS.items():
        photo = _photo(name)
        h, w = photo.shape[:2]
        for k in range(per_photo):
            side = int(min(h, w) * rng.uniform(0.6, 0.95))
            top, left = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
            crop = photo[top : top + side, left : left + side].astype(np.float64)
            tint = rng.uniform(0.85, 1.15, size=3)
            crop = np.clip(crop * tint, 0, 255).astype(np.uint8)
            filename = f"{name}_{k:03d}.jpg"
            Image.fromarray(crop).resize((96, 96)).save(images / filename, quality=90)
            split = "test" if k < test_per_photo else "val" if k == test_per_photo else "train"
            entries.append({"filepath": "images", "filename": filename, "imgid": len(entries), "split": split,
                            "sentences": [{"tokens": c.split(), "raw": c} for c in captions]})
    path = folder / "dataset_photos.json"
    path.write_text(json.dumps({"dataset": "photos", "images": entries}))
    return path
