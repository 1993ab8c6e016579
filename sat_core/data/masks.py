"""Object masks as run-length codes: the format of a dataset.json's ``objects[i]["mask"]``.

Row-major (COCO's uncompressed RLE is column-major): ``counts`` alternate background / foreground runs over
the flattened (H, W) mask, starting with a possibly empty background run; ``size`` is [H, W]. The worlds
write them, evaluation, supervised attention and the explorer read them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sat_core.errors import DatasetError


def rle_encode(mask: np.ndarray) -> dict[str, Any]:
    """Row-major RLE: alternating background/foreground run lengths, background first."""
    flat = np.asarray(mask, bool).ravel()
    edges = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    runs = np.diff(np.concatenate([[0], edges, [flat.size]])).tolist()
    if flat.size and flat[0]:
        runs = [0] + runs
    return {"size": [int(s) for s in np.shape(mask)], "counts": [int(r) for r in runs]}


def rle_decode(rle: dict[str, Any]) -> np.ndarray:
    """Inverse of rle_encode -> (H, W) bool."""
    try:
        h, w = (int(v) for v in rle["size"])
        counts = np.asarray(rle["counts"], dtype=np.int64)
    except (KeyError, TypeError, ValueError) as err:
        raise DatasetError(
            f"Bad mask RLE {str(rle)[:80]!r}: {err}; regenerate the dataset.") from err
    if (counts < 0).any() or counts.sum() != h * w:
        raise DatasetError(f"Mask RLE counts do not add up to {h}x{w}; regenerate the dataset.")
    values = np.arange(counts.size) % 2 == 1
    return np.repeat(values, counts).reshape(h, w)
