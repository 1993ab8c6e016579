"""Regions on the encoder's grid: rectangles of cells, object masks cut to the crop the encoder saw.

Used by evaluation (attention correctness) and by the explorer (interventions, mask outlines).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sat_core.errors import DatasetError, SatError
from sat_core.grounding import attention_correctness
from sat_core.images import CropInfo

_GRID_CELL = 8  # px per grid cell when a mask has to be resampled to tile the α grid


def grid_region(grid: tuple[int, int], rows: Sequence[int], cols: Sequence[int]) -> np.ndarray:
    """Bool (gh, gw): the cells whose row is in ``rows`` and column in ``cols`` (a rectangle for ranges)."""
    gh, gw = grid
    bad = [r for r in rows if not 0 <= r < gh] + [c for c in cols if not 0 <= c < gw]
    if bad:
        raise SatError(f"Grid cells {bad} are outside the {gh}×{gw} grid; rows and columns start at 0.")
    region = np.zeros((gh, gw), dtype=bool)
    region[np.ix_(list(rows), list(cols))] = True
    return region


def mask_in_crop(mask: np.ndarray, crop: CropInfo) -> np.ndarray:
    """An object mask in original-image pixels (H, W) cut to the square the encoder saw."""
    return np.asarray(mask, dtype=bool)[crop.top : crop.bottom, crop.left : crop.right]  # (side, side)


def mask_on_alpha_grid(mask: np.ndarray, crop: CropInfo, grid: tuple[int, int]) -> np.ndarray:
    """An object mask in original-image pixels, cut to the encoder's crop, tiling the α grid exactly."""
    width, height = crop.original_size
    if mask.shape != (height, width):
        raise DatasetError(
            f"An object mask is {mask.shape[1]}x{mask.shape[0]} px but its image is {width}x{height}; "
            "the dataset's masks do not belong to its images. Regenerate the dataset."
        )
    cut = mask_in_crop(mask, crop)  # (side, side)
    gh, gw = grid
    if cut.shape[0] % gh == 0 and cut.shape[1] % gw == 0:
        return cut
    rows = np.arange(gh * _GRID_CELL) * cut.shape[0] // (gh * _GRID_CELL)
    cols = np.arange(gw * _GRID_CELL) * cut.shape[1] // (gw * _GRID_CELL)
    return cut[rows][:, cols]  # (gh·cell, gw·cell), nearest neighbour


def mask_on_grid(mask: np.ndarray, crop: CropInfo, grid: tuple[int, int], *, min_cover: float = 0.25) -> np.ndarray:
    """Bool (gh, gw): grid cells at least ``min_cover`` covered by an original-image mask."""
    gh, gw = grid
    fine = mask_on_alpha_grid(np.asarray(mask, dtype=bool), crop, grid)  # (gh·c, gw·c')
    cover = fine.reshape(gh, fine.shape[0] // gh, gw, fine.shape[1] // gw).mean(axis=(1, 3))  # (gh, gw)
    return cover >= min_cover


def correctness_on_crop(alpha_grid: np.ndarray, mask: np.ndarray, crop: CropInfo) -> tuple[float, float]:
    """grounding.attention_correctness for a mask in original-image pixels, cut to the encoder's crop."""
    return attention_correctness(alpha_grid, mask_on_alpha_grid(np.asarray(mask, dtype=bool), crop,
                                                                 np.shape(alpha_grid)))


def box_mask(size: tuple[int, int], box: tuple[int, int, int, int]) -> np.ndarray:
    """Bool (H, W) for an image of ``size`` (W, H), True inside the box (left, top, right, bottom)."""
    width, height = size
    left, top, right, bottom = box
    mask = np.zeros((height, width), dtype=bool)
    mask[max(0, top) : min(height, bottom), max(0, left) : min(width, right)] = True
    return mask
