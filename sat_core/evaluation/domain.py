"""How far an image is from a model's training images: two nearest-neighbour checks and a JPEG check.

The explorer warns when an uploaded image looks unlike the images the model was trained on: by its
colour statistics, and by what the model's own encoder makes of it (its mean annotation vector).
Colour catches photos against the flat shapes world; the encoder catches them against the scenes
world, whose textured places and lighting cover a photo's colour statistics. Heavy JPEG compression is
warned about whatever the training images were: its 8×8 blocks stand out, and the models name fewer
objects on such pictures (docs/EXPERIMENTS.md, 2026-11-28).
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
_GREY_REFERENCE_BIN0 = 0.995  # a reference whose saturation histogram lies this much in its lowest bin is grey
GREY_REFERENCES_MAX = 0.25  # a grey image is warned about while fewer of the references than this are grey
ANNOTATION_MARGIN = 1.2  # warn when the nearest training image is this many times farther than usual
# Warn when luminance changes this many times more across JPEG's block borders than inside the blocks: the lowest
# of 1.4, 1.5, … 2.2 that warns about at most 1 % of the 400 validation scenes as rendered. There it warns about
# 77 % of them re-encoded at quality 50, 98 % at 30 and 99 % at 20, where the paper models' recall has fallen by
# 0.02–0.03, 0.02–0.04 and 0.03–0.07 (docs/EXPERIMENTS.md, 2026-11-28).
BLOCKINESS_WARN = 1.6
_BLOCK = 8  # JPEG's block side in px
_BLOCKINESS_SIDE = 1024  # px: the central window (on the block grid) that is measured in a larger image
_ENCODE_BATCH = 16


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


def blockiness(image: Image.Image) -> float:
    """Mean |luminance step| across the 8-px block borders over the mean step inside the blocks, rows and
    columns averaged: about 1 for a picture never JPEG-compressed or saved at quality 90 or more. The scenes
    world's smooth surfaces read 1.8 at quality 50 and 2.6 at 20 (medians); a textured photograph reads less
    at the same quality (1.3–1.5 at 50, 1.7–2.1 at 20). Measured on the image as it came, whose block grid
    starts at its top-left pixel; a larger image is measured on its central window of at most 1024 px a
    side, cut on that grid."""
    grey = np.asarray(image.convert("L"), dtype=np.float32)  # (H, W)
    for axis in (0, 1):
        size = grey.shape[axis]
        if size > _BLOCKINESS_SIDE:
            start = (size - _BLOCKINESS_SIDE) // 2 // _BLOCK * _BLOCK
            grey = grey.take(np.arange(start, start + _BLOCKINESS_SIDE), axis=axis)
    if min(grey.shape) < 2 * _BLOCK:  # no block lies between two borders: nothing to compare
        return 1.0
    ratios = []
    for plane in (grey, grey.T):  # steps along rows, then along columns
        steps = np.abs(np.diff(plane, axis=1))  # (H, W - 1): steps[:, x] lies between columns x and x + 1
        border = np.arange(steps.shape[1]) % _BLOCK == _BLOCK - 1
        ratios.append(float(steps[:, border].mean()) / max(float(steps[:, ~border].mean()), 0.5))
    return float(np.mean(ratios))


def mean_annotations(model: Any, tensors: Any) -> np.ndarray:
    """(B, D) mean over the grid of ``model``'s annotation vectors for preprocessed images (B, 3, S, S)."""
    import torch

    device = next(model.parameters()).device
    rows = []
    with torch.no_grad():
        for batch in torch.as_tensor(tensors).split(_ENCODE_BATCH):
            feats = model.encode(batch.to(device)).feats  # (b, L, D)
            rows.append(feats.float().mean(1).cpu())
    return torch.cat(rows).numpy().astype(np.float64)


@dataclass
class AnnotationReference:
    """Mean annotation vectors of training images, as the checkpoint's own encoder makes them.

    Distances are Euclidean after scaling each dimension by its spread over the references. ``reach`` is
    the largest leave-one-out nearest-neighbour distance among them: how far the loneliest training
    image is from the rest. An image whose nearest reference lies more than ``margin`` × ``reach`` away
    is unlike anything the model was trained on.
    """

    features: np.ndarray  # (R, D)
    scale: np.ndarray  # (D,)
    reach: float
    margin: float = ANNOTATION_MARGIN

    @classmethod
    def from_features(cls, features: np.ndarray, margin: float = ANNOTATION_MARGIN) -> "AnnotationReference":
        feats = np.asarray(features, dtype=np.float64)
        if feats.ndim != 2 or len(feats) < 2:
            raise SatError("An annotation reference needs the mean annotations of at least two training images.")
        scale = feats.std(0) + 1e-6
        scaled = feats / scale
        dists = np.sqrt(((scaled[:, None] - scaled[None]) ** 2).sum(-1))  # (R, R)
        np.fill_diagonal(dists, np.inf)
        return cls(feats, scale, max(float(dists.min(1).max()), 1e-6), margin)

    def ratio(self, annotation: np.ndarray) -> float:
        """Distance to the nearest reference, in units of ``reach`` (above ``margin``: far)."""
        vec = np.asarray(annotation, dtype=np.float64).reshape(-1)
        if vec.shape[0] != self.features.shape[1]:
            raise SatError(f"A mean annotation of {vec.shape[0]} dimensions cannot be compared with references "
                           f"of {self.features.shape[1]}: they come from another encoder.")
        return float(np.sqrt((((self.features - vec) / self.scale) ** 2).sum(-1)).min() / self.reach)

    def to_dict(self) -> dict[str, Any]:
        return {"features": np.round(self.features, 5).tolist(), "scale": np.round(self.scale, 6).tolist(),
                "reach": self.reach, "margin": self.margin}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "AnnotationReference":
        return cls(np.asarray(data["features"], dtype=np.float64), np.asarray(data["scale"], dtype=np.float64),
                   float(data["reach"]), float(data.get("margin", ANNOTATION_MARGIN)))


@dataclass
class DomainCheck:
    distance: float  # total-variation distance of colour_features to the nearest reference image
    threshold: float
    coloured_share: float
    reasons: list[str]  # empty when the image looks like the training data
    source: str = "the training images"  # what it was compared with
    annotation_ratio: float | None = None  # AnnotationReference.ratio; None when not checked
    blockiness: float | None = None  # ``blockiness`` of the image; None when not checked

    @property
    def far(self) -> bool:
        return bool(self.reasons)

    @property
    def compressed_only(self) -> bool:
        """Warned about for heavy JPEG compression alone: the content may well be familiar."""
        return len(self.reasons) == 1 and self.blockiness is not None and self.blockiness > BLOCKINESS_WARN


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
    annotations: AnnotationReference | None = None  # the same images through the model's encoder

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
        out = {"features": np.round(self.features, 5).tolist(), "threshold": self.threshold,
               "source": self.source, "min_coloured_share": self.min_coloured_share}
        if self.annotations is not None:
            out["annotations"] = self.annotations.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DomainReference":
        annotations = data.get("annotations")
        return cls(np.asarray(data["features"], dtype=np.float64), float(data["threshold"]),
                   str(data.get("source", "the training images")), float(data.get("min_coloured_share", 0.0)),
                   AnnotationReference.from_dict(annotations) if annotations else None)

    def check(self, image: Image.Image, annotation: np.ndarray | None = None) -> DomainCheck:
        """Compare ``image`` with the references; ``annotation`` (its mean annotation vector, from
        ``mean_annotations`` with the checkpoint's model) adds the encoder's view when the reference has one."""
        features = colour_features(image)
        dist = float((0.5 * np.abs(self.features - features).sum(-1)).min())
        share = coloured_share(image)
        reasons = []
        if dist > self.threshold:
            reasons.append(
                f"its colour statistics are {dist:.2f} from the nearest of {len(self.features)} reference images "
                f"(threshold {self.threshold:.2f})"
            )
        if share < _COLOURED_MIN_SHARE:
            reasons += self._grey_reasons(share, bool(features[0] >= _GREY_REFERENCE_BIN0))
        blocks = blockiness(image)
        if blocks > BLOCKINESS_WARN:
            reasons.append(
                f"it is heavily JPEG-compressed: its 8×8 blocks show, the luminance changing {blocks:.1f}× as much "
                f"across their borders as inside them (it warns above {BLOCKINESS_WARN:.1f}×); on such pictures the "
                "scenes models name fewer of the objects")
        ratio = None
        if self.annotations is not None and annotation is not None:
            ratio = self.annotations.ratio(annotation)
            if ratio > self.annotations.margin:
                reasons.append(
                    f"what the model's encoder makes of it lies {ratio:.2f}× as far from the nearest of "
                    f"{len(self.annotations.features)} reference images as the loneliest reference image "
                    f"lies from the rest (it warns above {self.annotations.margin:.1f}×)")
        return DomainCheck(dist, self.threshold, share, reasons, self.source, ratio, blocks)

    def grey_references(self) -> int:
        """How many reference images are grey (their saturation histogram all in its lowest bin)."""
        return int((self.features[:, 0] >= _GREY_REFERENCE_BIN0).sum())

    def _grey_reasons(self, share: float, grey_image: bool) -> list[str]:
        """A colourless image's reason to warn: the references were coloured, every one or most. A model that
        saw some grey pictures still reads colour words off colour, so on a grey one they are guesses. Against
        references some of which are grey, only a grey image counts (``grey_image``: its saturation all in the
        lowest bin, as a grey reference's), not a merely drab one."""
        if self.min_coloured_share >= _COLOURED_MIN_SHARE:
            return [f"it has almost no strongly coloured pixels ({100 * share:.2f} %), unlike every "
                    f"reference image (at least {100 * self.min_coloured_share:.1f} %)"]
        grey, total = self.grey_references(), len(self.features)
        if grey_image and grey < GREY_REFERENCES_MAX * total:
            return [f"it is grey (only {100 * share:.2f} % of its pixels strongly coloured), like just {grey} of the "
                    f"{total} reference images: the colours its caption names are guesses"]
        return []
