"""How far an image is from a model's training images: colour statistics and a nearest-neighbour check.

The explorer warns when an uploaded image looks unlike the images the model was trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from sat_core.errors import SatError

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
