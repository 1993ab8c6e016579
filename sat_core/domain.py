"""How far an image is from a model's training images: colour statistics and a nearest-neighbour check.

The explorer warns when an uploaded image looks unlike the images the model was trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from sat_core.errors import SatError

_SAT_BINS = 8
_FEATURE_SIDE = 56  # px: box-downsampling first removes JPEG chroma noise and sensor noise
_COLOURED_MIN_SHARE = 0.005  # under this share of strongly coloured pixels an image counts as grey


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
    source: str = "the training images"  # what it was compared with

    @property
    def far(self) -> bool:
        return bool(self.reasons)


@dataclass
class DomainReference:
    """Colour statistics of a model's training images and the distance deemed 'far'.

    The trainer stores one in every checkpoint (``to_dict``), so the check compares an image with the
    data the model actually learnt from, and its message names that data.
    """

    features: np.ndarray  # (R, F)
    threshold: float
    source: str = "the training images"  # what the references are, for messages
    min_coloured_share: float = 0.0  # the least coloured reference image; 0: no colour check

    @classmethod
    def from_images(cls, images: Sequence[Image.Image], *, source: str = "the training images",
                    margin: float = 1.5) -> "DomainReference":
        """Threshold = margin × the largest leave-one-out nearest-neighbour distance among the references."""
        if len(images) < 2:
            raise SatError("A domain reference needs at least two images of the training data.")
        feats = np.stack([colour_features(im) for im in images])  # (R, F)
        dists = 0.5 * np.abs(feats[:, None] - feats[None]).sum(-1)  # (R, R)
        np.fill_diagonal(dists, np.inf)
        shares = [coloured_share(im) for im in images]
        return cls(feats, max(0.15, margin * float(dists.min(1).max())), source, float(min(shares)))

    def to_dict(self) -> dict[str, Any]:
        return {"features": np.round(self.features, 5).tolist(), "threshold": self.threshold,
                "source": self.source, "min_coloured_share": self.min_coloured_share}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DomainReference":
        return cls(np.asarray(data["features"], dtype=np.float64), float(data["threshold"]),
                   str(data.get("source", "the training images")), float(data.get("min_coloured_share", 0.0)))

    def check(self, image: Image.Image) -> DomainCheck:
        dist = float((0.5 * np.abs(self.features - colour_features(image)).sum(-1)).min())
        share = coloured_share(image)
        reasons = []
        if dist > self.threshold:
            reasons.append(
                f"its colour statistics are {dist:.2f} from the nearest of {len(self.features)} reference images "
                f"(threshold {self.threshold:.2f})"
            )
        if self.min_coloured_share >= _COLOURED_MIN_SHARE and share < _COLOURED_MIN_SHARE:
            reasons.append(f"it has almost no strongly coloured pixels ({100 * share:.2f} %), unlike every "
                           f"reference image (at least {100 * self.min_coloured_share:.1f} %)")
        return DomainCheck(dist, self.threshold, share, reasons, self.source)
