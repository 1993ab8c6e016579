"""Numbers derived from model outputs for people to look at: domain checks, regions, attention
summaries, replaying a decode session, and summaries (per word kind, per slice) of evaluation records.

The explorer shows these. The records themselves come from ``sat_core.evaluate`` (the one place they
are computed). Only numpy here: no Streamlit, no plotting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from sat_core.errors import SatError
from sat_core.images import CropInfo

# ---- how far an image is from the synthetic training images -------------------------------------

_SAT_BINS = 8
_FEATURE_SIDE = 56  # px: box-downsampling first removes JPEG chroma noise and sensor noise
_COLOURED_MIN_SHARE = 0.005  # every synthetic scene holds at least one saturated shape (>1.5 % px)


def colour_features(image: Image.Image) -> np.ndarray:
    """Saturation histogram (8 bins) + share of near-black and near-white pixels, summing to ~1.

    The synthetic world is low-saturation textured backgrounds plus a few fully saturated shapes;
    photos fill the middle of the saturation range and have deep shadows and highlights.
    """
    small = image.convert("RGB").resize((_FEATURE_SIDE, _FEATURE_SIDE), Image.Resampling.BOX)
    hsv = np.asarray(small.convert("HSV"), dtype=np.float64) / 255.0  # (S, S, 3)
    hist, _ = np.histogram(hsv[..., 1], bins=_SAT_BINS, range=(0.0, 1.0))
    value = hsv[..., 2]
    return np.concatenate([hist / hist.sum(), [(value < 0.12).mean(), (value > 0.96).mean()]])


def coloured_share(image: Image.Image) -> float:
    """Share of strongly coloured pixels (HSV saturation > 0.5 and value > 0.3)."""
    hsv = np.asarray(image.convert("RGB").convert("HSV"), dtype=np.float64) / 255.0  # (H, W, 3)
    return float(((hsv[..., 1] > 0.5) & (hsv[..., 2] > 0.3)).mean())


@dataclass
class DomainCheck:
    distance: float  # total-variation distance of colour_features to the nearest reference image
    threshold: float
    coloured_share: float
    reasons: list[str]  # empty when the image looks like the training data

    @property
    def far(self) -> bool:
        return bool(self.reasons)


@dataclass
class DomainReference:
    """Colour statistics of reference (training-like) images and the distance deemed 'far'."""

    features: np.ndarray  # (R, F)
    threshold: float

    @classmethod
    def from_images(cls, images: Sequence[Image.Image], *, margin: float = 1.5) -> "DomainReference":
        """Threshold = margin × the largest leave-one-out nearest-neighbour distance among the references."""
        if len(images) < 2:
            raise SatError("A domain reference needs at least two images of the training data.")
        feats = np.stack([colour_features(im) for im in images])  # (R, F)
        dists = 0.5 * np.abs(feats[:, None] - feats[None]).sum(-1)  # (R, R)
        np.fill_diagonal(dists, np.inf)
        return cls(feats, max(0.15, margin * float(dists.min(1).max())))

    def check(self, image: Image.Image) -> DomainCheck:
        dist = float((0.5 * np.abs(self.features - colour_features(image)).sum(-1)).min())
        share = coloured_share(image)
        reasons = []
        if dist > self.threshold:
            reasons.append(
                f"its colour statistics are {dist:.2f} from the nearest training-like image "
                f"(threshold {self.threshold:.2f})"
            )
        if share < _COLOURED_MIN_SHARE:
            reasons.append(f"it has almost no strongly coloured pixels ({100 * share:.2f} %), unlike every synthetic scene")
        return DomainCheck(dist, self.threshold, share, reasons)


# ---- attention summaries --------------------------------------------------------------------------

@dataclass
class AlphaSummary:
    max: float
    argmax: tuple[int, int]  # (row, col) of the grid
    entropy: float  # nats
    effective_regions: float  # exp(entropy): how many cells the attention is spread over
    total: float  # Σ_i α_i (1 unless an intervention or a bug changed it)


def alpha_summary(alpha_grid: np.ndarray) -> AlphaSummary:
    """Peak, where it is, entropy and exp(entropy) of one α map (gh, gw)."""
    alpha = np.asarray(alpha_grid, dtype=np.float64)
    flat = alpha.reshape(-1)  # (L,)
    p = flat / flat.sum() if flat.sum() > 0 else flat
    entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    row, col = np.unravel_index(int(flat.argmax()), alpha.shape)
    return AlphaSummary(float(flat.max()), (int(row), int(col)), entropy, math.exp(entropy), float(flat.sum()))


def doubly_stochastic_penalty(alphas: np.ndarray) -> float:
    """Σ_i (1 − Σ_t α_ti)² over the steps given (T, L): the paper's penalty before λ."""
    coverage = np.asarray(alphas, dtype=np.float64).reshape(len(alphas), -1).sum(0)  # (L,)
    return float(((1.0 - coverage) ** 2).sum())


# ---- regions and masks on the encoder's grid ------------------------------------------------------

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


def _resize_nearest(mask: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    h, w = mask.shape
    rows = np.arange(out_hw[0]) * h // out_hw[0]
    cols = np.arange(out_hw[1]) * w // out_hw[1]
    return mask[rows][:, cols]  # (h, w) -> out_hw


def mask_on_grid(mask: np.ndarray, crop: CropInfo, grid: tuple[int, int], *, min_cover: float = 0.25) -> np.ndarray:
    """Bool (gh, gw): grid cells at least ``min_cover`` covered by an original-image mask."""
    gh, gw = grid
    fine = _resize_nearest(mask_in_crop(mask, crop), (gh * 8, gw * 8))  # (8·gh, 8·gw)
    cover = fine.reshape(gh, 8, gw, 8).mean(axis=(1, 3))  # (gh, gw)
    return cover >= min_cover


def correctness_on_crop(alpha_grid: np.ndarray, mask: np.ndarray, crop: CropInfo) -> tuple[float, float]:
    """grounding.attention_correctness for a mask in original-image pixels, cut to the encoder's crop."""
    from sat_core.grounding import attention_correctness

    gh, gw = np.shape(alpha_grid)
    fine = _resize_nearest(mask_in_crop(mask, crop), (gh * 8, gw * 8))  # tiles into the grid exactly
    return attention_correctness(alpha_grid, fine)


def box_mask(size: tuple[int, int], box: tuple[int, int, int, int]) -> np.ndarray:
    """Bool (H, W) for an image of ``size`` (W, H), True inside the box (left, top, right, bottom)."""
    width, height = size
    left, top, right, bottom = box
    mask = np.zeros((height, width), dtype=bool)
    mask[max(0, top) : min(height, bottom), max(0, left) : min(width, right)] = True
    return mask


# ---- replaying a decode session -------------------------------------------------------------------

def sync_session(session: Any, n_steps: int, forced: Mapping[int, str]) -> None:
    """Bring a ``DecodeSession`` to ``n_steps`` steps where step t is ``forced[t]`` if given, else greedy.

    Keeps the longest prefix that already agrees, so one more step costs one decoder step.
    """
    keep = 0
    while keep < min(n_steps, len(session.steps)):
        step, want = session.steps[keep], forced.get(keep)
        if (want is None and step.forced) or (want is not None and (not step.forced or step.word != want)):
            break
        keep += 1
    while len(session.steps) > keep:
        session.back()
    while len(session.steps) < n_steps and not session.done:
        session.step(force=forced.get(len(session.steps)))


# ---- summaries of records -------------------------------------------------------------------------

def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def word_type_correctness(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Table rows per word kind over ``sat_core.evaluate`` records: words matched to one object, mean α
    share on it, mean uniform baseline, and whether the kind enters the headline attention correctness."""
    from sat_core.evaluate import NAMING_KINDS, correctness_by_kind

    by_kind = correctness_by_kind([w for r in records for w in r.get("words") or []])
    return [{"kind": kind, "words": row["n"], "attention_on_object": row["correctness"],
             "uniform_baseline": row["baseline"], "in_attention_correctness": kind in NAMING_KINDS}
            for kind, row in by_kind.items()]


@dataclass
class Slice:
    name: str
    records: list[Mapping[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "slice": self.name, "images": len(self.records),
            "CIDEr": _mean([r["scores"].get("CIDEr") for r in self.records]),
            "BLEU-4": _mean([r["scores"].get("BLEU-4") for r in self.records]),
            "attention_correctness": _mean([r.get("attention_correctness") for r in self.records]),
        }


def slice_metrics(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Mean per-image CIDEr, BLEU-4 and attention correctness over slices: all images, no error,
    each error label, and each number of objects in the scene."""
    slices = [Slice("all images", list(records)),
              Slice("no error", [r for r in records if not r.get("errors")])]
    labels = sorted({label for r in records for label in r.get("errors") or []})
    slices += [Slice(f"error: {label}", [r for r in records if label in (r.get("errors") or [])]) for label in labels]
    counts = sorted({r["n_objects"] for r in records if r.get("n_objects") is not None})
    slices += [Slice(f"{n} object{'s' * (n != 1)}", [r for r in records if r.get("n_objects") == n]) for n in counts]
    return [s.summary() for s in slices if s.records]
