"""Captions and attention checked against the objects of a synthetic world's image: the interface evaluation uses.

``ground`` hands a caption to the world that wrote the image's objects (``sat_core.worlds.of``) and gets back
that world's grounding (matched mentions, scores, error labels); ``aggregate`` averages groundings over a
dataset whatever their world. ``attention_correctness`` and its companions measure how much of an α map
falls on an object's mask: they need masks, not a world.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from sat_core import worlds
from sat_core.worlds import word_kind

__all__ = ["ERROR_LABELS", "aggregate", "attention_ceiling", "attention_correctness", "attention_elsewhere", "ground",
           "mask_entropy", "word_kind"]


def ground(tokens: Sequence[Any], objects: list[dict[str, Any]], place: str | None = None) -> Any:
    """The caption ``tokens`` matched against the image's ``objects`` by the world that wrote them (``place``:
    the scenes world's); the result has ``precision``, ``recall``, per-attribute accuracies, ``errors`` (label ->
    occurrences), ``token_objects`` (mention token -> object ids) and ``to_dict()``."""
    return worlds.of(objects).ground(tokens, objects, place)


ERROR_LABELS = worlds.error_labels()
_SCORES = ("precision", "recall", "colour_accuracy", "shape_accuracy", "size_accuracy",
           "count_accuracy", "relation_accuracy", "category_accuracy", "place_accuracy")


def aggregate(groundings: Iterable[Any]) -> dict[str, float]:
    """Dataset means: each score over the captions where it is defined (key absent if none),
    'relations_stated' = share of captions stating a relation, '<label>_rate' = share of captions
    with that error, 'n' = number of captions."""
    rows = [g if isinstance(g, dict) else g.to_dict() for g in groundings]
    out: dict[str, float] = {"n": len(rows)}
    for key in _SCORES:
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            out[key] = float(np.mean(values))
    if rows:  # the share of captions that state at least one relation (accuracy counts only those)
        out["relations_stated"] = float(np.mean([bool(r["parsed"]["relations"]) for r in rows]))
    for label in ERROR_LABELS:
        flags = [bool(r["errors"].get(label)) for r in rows]
        out[f"{label}_rate"] = float(np.mean(flags)) if flags else 0.0
    return out


def attention_correctness(alpha_grid: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    """(share of α inside the mask, uniform baseline = mask area / image area).

    Each cell's α is spread evenly over its pixels (no smoothing), so the share is
    Σ_cells α_c · (mask pixels in c / pixels in c) / Σ α. H and W must be multiples of gh and gw;
    α need not sum to 1.
    """
    alpha = np.asarray(alpha_grid, dtype=np.float64)
    mask = np.asarray(mask, dtype=bool)
    if alpha.ndim != 2 or mask.ndim != 2:
        raise ValueError(
            f"Expected α (gh, gw) and mask (H, W); got {alpha.shape} and {mask.shape}.")
    gh, gw = alpha.shape
    if (alpha < 0).any() or not np.isfinite(alpha).all() or alpha.sum() <= 0:
        raise ValueError("α must be finite, non-negative and not all zero.")
    inside = float(np.sum(alpha * _coverage(mask, gh, gw)) / np.sum(alpha))
    return inside, float(mask.mean())


def attention_elsewhere(alpha_grid: np.ndarray, mask: np.ndarray, others: np.ndarray) -> tuple[float, float]:
    """Where α went that is not on the named object: (share on the scene's other objects, share on the background
    beside it — cells within one cell of a cell the object touches, in the part of them no object covers). The
    rest of α, 1 − correctness − these two, lies on background farther away. ``others``: the other objects'
    masks together (H, W), pixels of the named object's mask not counted; α as in ``attention_correctness``."""
    alpha = np.asarray(alpha_grid, dtype=np.float64)
    gh, gw = alpha.shape
    named = _coverage(np.asarray(mask, dtype=bool), gh, gw)
    other = _coverage(np.asarray(others, dtype=bool) & ~np.asarray(mask, dtype=bool), gh, gw)
    touched = np.pad(named > 0, 1)  # (gh + 2, gw + 2)
    near = np.zeros((gh, gw), dtype=bool)
    for dy in range(3):
        for dx in range(3):
            near |= touched[dy : dy + gh, dx : dx + gw]  # the 3×3 neighbourhood of each touched cell
    background = np.clip(1.0 - named - other, 0.0, 1.0)
    total = alpha.sum()
    return float(np.sum(alpha * other) / total), float(np.sum(alpha * near * background) / total)


def attention_ceiling(grid: tuple[int, int], mask: np.ndarray) -> float:
    """The most attention correctness any α on a (gh, gw) grid can reach for this mask: all of α on the
    cell the mask covers most. Below 1 where the object fills no cell whole (a small or thin object)."""
    return float(_coverage(np.asarray(mask, dtype=bool), *grid).max())


def mask_entropy(grid: tuple[int, int], mask: np.ndarray) -> float | None:
    """The entropy in nats of α spread over the object as its mask covers the (gh, gw) cells (Liu et al.'s
    target for supervised attention): what α fitting the mask exactly would have; None for an empty mask."""
    cover = _coverage(np.asarray(mask, dtype=bool), *grid).ravel()
    if cover.sum() == 0:
        return None
    q = cover[cover > 0] / cover.sum()
    return float(-(q * np.log(q)).sum())


def _coverage(mask: np.ndarray, gh: int, gw: int) -> np.ndarray:
    """Share of each grid cell's pixels inside the mask, (gh, gw); the mask must tile into the grid."""
    h, w = mask.shape
    if h % gh or w % gw:
        raise ValueError(f"Mask {h}x{w} does not tile into the {gh}x{gw} attention grid.")
    return mask.reshape(gh, h // gh, gw, w // gw).mean(axis=(1, 3))
