"""Decoded images kept as uint8 rows: in RAM (``ImageStore``) or memory-mapped from disk (``data.cache``).

Both stores give a dataset image's (3, S, S) pixels by its index in ``KarpathyData.images`` (``get``, ``batch``,
``row_of``) and whole row ranges for a sequential pass (``rows``); ``normalise`` turns them into the encoder's
input. ``decode_rows`` is the one decoding loop both fill themselves with, ``workers`` threads at a time
(Pillow releases the GIL while it decodes and resizes).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sat_core.config import PreprocessConfig
from sat_core.data.images import load_image, resized_pixels
from sat_core.errors import ImageError

log = logging.getLogger(__name__)


def normalise(images: torch.Tensor, cfg: PreprocessConfig) -> torch.Tensor:
    """uint8 (B,3,S,S) from a store -> the encoder's float input, normalised like ``preprocess``."""
    mean = torch.tensor(cfg.mean, dtype=torch.float32, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(cfg.std, dtype=torch.float32, device=images.device).view(1, 3, 1, 1)
    return (images.float() / 255.0 - mean) / std  # (B, 3, S, S)


def decode_workers(workers: int = 0) -> int:
    """``workers`` threads, or with 0 the CPU cores this process may use shared among the ranks of its node."""
    if workers > 0:
        return workers
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))


def wanted_images(data: Any, splits: Sequence[str] | None) -> list[int]:
    """Indices of the images of ``splits`` (all of them with None) in ``data`` (a ``KarpathyData``), in file
    order: a store's rows."""
    return [i for i, rec in enumerate(data.images) if splits is None or rec.split in splits]


def decode_rows(paths: Sequence[Path], cfg: PreprocessConfig, workers: int,
                put: Callable[[int, np.ndarray], None], *, progress: bool = True) -> list[tuple[int, Path, str]]:
    """Decode every image and hand ``put(row, pixels)`` its uint8 (3, S, S) pixels from the worker thread that
    decoded it (rows are distinct, so ``put`` needs no lock). Returns (row, path, reason) of each image that
    could not be read, logged as it is met."""

    def work(row: int) -> tuple[int, str]:
        try:
            put(row, resized_pixels(load_image(paths[row]), cfg))
        except ImageError as exc:
            return row, str(exc)
        return row, ""

    failed: list[tuple[int, Path, str]] = []
    with ThreadPoolExecutor(max_workers=decode_workers(workers)) as pool:
        for row, reason in _progress(pool.map(work, range(len(paths))), len(paths), progress):
            if reason:
                log.warning("Skipping image %s: %s", paths[row], reason)
                failed.append((row, paths[row], reason))
    if failed:
        log.warning("%d of %d images could not be read; their captions are dropped.", len(failed), len(paths))
    return failed


def _progress(items: Any, total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(items, total=total, desc="decoding images", unit="img",
                disable=not enabled or not sys.stderr.isatty())


class ImageRows:
    """What every store answers: ``images`` (N, 3, S, S) uint8, ``row_of`` (dataset index -> row), ``skipped``."""

    cfg: PreprocessConfig
    images: torch.Tensor  # (N, 3, S, S) uint8
    row_of: dict[int, int]
    skipped: list[tuple[Path, str]]

    def __contains__(self, index: int) -> bool:
        return index in self.row_of

    def __len__(self) -> int:
        return len(self.row_of)

    def get(self, index: int) -> torch.Tensor:
        """The uint8 (3,S,S) image of ``data.images[index]`` (a view, not a copy)."""
        return self.images[self.row_of[index]]

    def batch(self, indices: Sequence[int]) -> torch.Tensor:
        """uint8 (U,3,S,S) for these image indices."""
        return self.images[[self.row_of[i] for i in indices]]  # (U, 3, S, S)

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows start…stop−1 of ``images`` (a sequential pass: the encoder's over every image)."""
        return self.images[start:stop]  # (stop − start, 3, S, S)


class ImageStore(ImageRows):
    """Every image of the chosen splits of ``data`` (a ``KarpathyData``) decoded once, resized and cropped, kept
    in RAM as uint8.

    ``store.get(index)`` gives the (3,S,S) uint8 image of ``data.images[index]``; images that
    cannot be read are left out, logged, and listed in ``store.skipped`` as (path, reason).
    Memory is 3·S² bytes an image (COCO's 123k images at S=224: 18 GB), decoded again at every start: pass
    ``splits`` to decode only what a run needs, or keep them on disk (``data.cache``, ``--cache DIR``).
    """

    def __init__(self, data: Any, cfg: PreprocessConfig, *, splits: Sequence[str] | None = None,
                 workers: int = 0, progress: bool = True) -> None:
        self.cfg = cfg
        wanted = wanted_images(data, splits)
        size = cfg.image_size
        pixels = torch.empty((len(wanted), 3, size, size), dtype=torch.uint8)  # (N, 3, S, S)

        def put(row: int, image: np.ndarray) -> None:
            pixels[row] = torch.from_numpy(image)

        failed = decode_rows([data.images[i].path for i in wanted], cfg, workers, put, progress=progress)
        self.skipped = [(path, reason) for _, path, reason in failed]
        kept = sorted(set(range(len(wanted))) - {row for row, _, _ in failed})
        for j, row in enumerate(kept):  # close the gaps in place: no second copy of every image
            if j != row:
                pixels[j] = pixels[row]
        self.images = pixels[: len(kept)]  # (N', 3, S, S)
        self.row_of = {wanted[row]: j for j, row in enumerate(kept)}
