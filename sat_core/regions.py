"""Regions on the encoder's grid: rectangles of cells, object masks cut to the crop the encoder saw.

Used by evaluation (attention correctness), by training (supervised attention's targets) and by the
explorer (interventions, mask outlines).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sat_core.data.images import CropInfo
from sat_core.errors import DatasetError, SatError

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


def cell_cover(mask: np.ndarray, crop: CropInfo, grid: tuple[int, int]) -> np.ndarray:
    """(gh, gw): the share of each grid cell's pixels inside an original-image mask, on the encoder's crop."""
    gh, gw = grid
    fine = mask_on_alpha_grid(np.asarray(mask, dtype=bool), crop, grid)  # (gh·c, gw·c')
    return fine.reshape(gh, fine.shape[0] // gh, gw, fine.shape[1] // gw).mean(axis=(1, 3))


def mask_on_grid(mask: np.ndarray, crop: CropInfo, grid: tuple[int, int], *, min_cover: float = 0.25) -> np.ndarray:
    """Bool (gh, gw): grid cells at least ``min_cover`` covered by an original-image mask."""
    return cell_cover(mask, crop, grid) >= min_cover


def box_mask(size: tuple[int, int], box: tuple[int, int, int, int]) -> np.ndarray:
    """Bool (H, W) for an image of ``size`` (W, H), True inside the box (left, top, right, bottom)."""
    width, height = size
    left, top, right, bottom = box
    mask = np.zeros((height, width), dtype=bool)
    mask[max(0, top) : min(height, bottom), max(0, left) : min(width, right)] = True
    return mask


# ---- regions drawn on the displayed crop (side × side px) ------------------------------------------

def _cell_centres(grid: tuple[int, int], side: float) -> tuple[np.ndarray, np.ndarray]:
    gh, gw = grid
    rows, cols = np.mgrid[0:gh, 0:gw]
    return (cols + 0.5) * side / gw, (rows + 0.5) * side / gh  # (gh, gw) x and y of each cell centre, px


def cells_in_box(grid: tuple[int, int], side: float, xs: Sequence[float], ys: Sequence[float]) -> np.ndarray:
    """Bool (gh, gw): cells whose centre lies in the box spanned by ``xs``, ``ys`` (px of the crop)."""
    cx, cy = _cell_centres(grid, side)
    return (cx >= min(xs)) & (cx <= max(xs)) & (cy >= min(ys)) & (cy <= max(ys))


def cells_in_polygon(grid: tuple[int, int], side: float, xs: Sequence[float], ys: Sequence[float]) -> np.ndarray:
    """Bool (gh, gw): cells whose centre lies inside the closed polygon (a lasso), by ray casting."""
    cx, cy = _cell_centres(grid, side)
    inside = np.zeros(cx.shape, dtype=bool)
    px, py = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    for (x0, y0), (x1, y1) in zip(zip(px, py), zip(np.roll(px, -1), np.roll(py, -1))):
        crosses = (y0 > cy) != (y1 > cy)  # the edge spans the horizontal ray from the centre
        with np.errstate(divide="ignore", invalid="ignore"):
            x_at = x0 + (cy - y0) * (x1 - x0) / (y1 - y0)
        inside ^= crosses & (cx < x_at)
    return inside


def cells_at_points(grid: tuple[int, int], side: float, xs: Sequence[float], ys: Sequence[float]) -> np.ndarray:
    """Bool (gh, gw): the cells under the given points (px of the crop); points outside are ignored."""
    gh, gw = grid
    region = np.zeros((gh, gw), dtype=bool)
    for x, y in zip(xs, ys):
        r, c = int(y * gh // side), int(x * gw // side)
        if 0 <= r < gh and 0 <= c < gw:
            region[r, c] = True
    return region


def format_cells(region: np.ndarray) -> str:
    """A region as runs of row-major cell indices, for links: "3-5,17" (empty: no cell)."""
    flat = np.flatnonzero(np.asarray(region, dtype=bool).reshape(-1))
    runs: list[str] = []
    start = prev = None
    for i in [*flat.tolist(), None]:
        if start is not None and (i is None or i != prev + 1):
            runs.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if i is not None and start is None:
            start = i
        prev = i
    return ",".join(runs)


def parse_cells(text: str, grid: tuple[int, int]) -> np.ndarray:
    """The inverse of ``format_cells``; SatError for text that does not name cells of this grid."""
    gh, gw = grid
    flat = np.zeros(gh * gw, dtype=bool)
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            first, _, last = part.partition("-")
            lo, hi = int(first), int(last or first)
            if not 0 <= lo <= hi < gh * gw:
                raise ValueError(part)
            flat[lo : hi + 1] = True
    except ValueError as err:
        raise SatError(f"{text!r} does not name cells of the {gh}×{gw} grid (row-major indices 0–{gh * gw - 1}).") from err
    return flat.reshape(gh, gw)
