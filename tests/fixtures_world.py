"""Tiny Karpathy-format datasets for training tests: a few synthetic-world images, hand-set captions.

``make_dataset`` renders images with ``sat_core.worlds`` and writes a split JSON whose captions the test
chooses, so a test knows exactly what a model that overfits must say. ``TINY_MODEL`` and ``train_args``
give the CLI flags for a model that trains in well under a second per epoch on one CPU core.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from sat_core.worlds.writer import generate

REPO_ROOT = Path(__file__).resolve().parents[1]

# One distinct short caption per image: easy to memorise, and each image needs its own.
CAPTIONS = [
    "a red circle",
    "two blue squares",
    "a green star left of a circle",
    "a yellow triangle",
]

TINY_MODEL = [
    "--small-channels", "8", "16", "16", "--embed-dim", "16", "--hidden-dim", "32", "--attn-dim", "16",
    "--dropout", "0", "--min-word-count", "1", "--batch-size", "8", "--image-size", "32",
    "--no-progress", "--device", "cpu", "--val-beam", "1", "--val-max-len", "8",
]


def make_dataset(
    root: str | Path,
    captions: list[list[str]] | list[str] | None = None,
    *,
    seed: int = 0,
    val_same_as_train: bool = True,
) -> tuple[Path, Path]:
    """Write ``root/dataset.json`` (+ images); return (json path, images folder).

    ``captions[i]`` is the caption (or the list of captions) of image i; every image goes into the
    train split and, with ``val_same_as_train``, again into val, so validation measures memorisation.
    """
    root = Path(root)
    captions = list(captions or CAPTIONS)
    generated = json.loads(generate(root / "world", len(captions), 0, 0, seed=seed, workers=1).read_text())
    images = []
    splits = ["train", "val"] if val_same_as_train else ["train"]
    for split in splits:
        for k, (record, caps) in enumerate(zip(generated["images"], captions)):
            caps = [caps] if isinstance(caps, str) else caps
            images.append({
                "filename": record["filename"], "filepath": record["filepath"], "split": split,
                "imgid": len(images),
                "sentences": [{"tokens": c.split(), "raw": c} for c in caps],
            })
    path = root / "dataset.json"
    path.write_text(json.dumps({"dataset": "tiny", "images": images}))
    return path, root / "world"


def train_args(data: Path, images: Path, out: Path, *extra: str) -> list[str]:
    """Flags for a tiny CPU run of ``sat_core.train`` on a dataset made by ``make_dataset``."""
    return ["--data", str(data), "--images", str(images), "--out", str(out), *TINY_MODEL, *extra]


def subprocess_env(**overrides: str) -> dict[str, str]:
    """Environment for ``python -m sat_core.train`` children: the repo importable, one thread each."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(overrides)
    return env


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
