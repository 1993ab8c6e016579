"""Numbers derived from model outputs for people to look at: domain checks, regions, attention
summaries, replaying a decode session, and per-image evaluation records.

The explorer shows these; ``sat_core.evaluate`` can share ``evaluation_records``. Only numpy here
(and the decode functions of ``sat_core.decoding``): no Streamlit, no plotting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from sat_core.config import DecodeConfig, PreprocessConfig
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


# ---- evaluation records ---------------------------------------------------------------------------

@dataclass
class EvalImage:
    """What evaluation needs of one dataset image."""

    image_id: int
    filename: str
    path: str
    references: list[str]
    objects: list[dict[str, Any]] | None = None


@dataclass
class _Decoded:
    item: EvalImage
    words: list[str]
    alphas: np.ndarray  # (T, L) incl. the <end> step
    grid: tuple[int, int]
    crop: CropInfo
    logprob: float


def _decode_all(model, vocab, items, preprocess_cfg, cfg, batch_size) -> tuple[list[_Decoded], list[str]]:
    import torch

    from sat_core.decoding import beam_search
    from sat_core.errors import ImageError
    from sat_core.images import load_image, preprocess

    decoded, skipped = [], []
    for start in range(0, len(items), batch_size):
        tensors, kept, crops = [], [], []
        for item in items[start : start + batch_size]:
            try:
                tensor, crop = preprocess(load_image(item.path), preprocess_cfg)
            except ImageError as err:
                skipped.append(f"{item.filename}: {err}")
                continue
            tensors.append(tensor)
            kept.append(item)
            crops.append(crop)
        if not tensors:
            continue
        hyps = beam_search(model, torch.stack(tensors), vocab, cfg)  # (B, 3, S, S) -> B lists
        for item, crop, beams in zip(kept, crops, hyps):
            best = beams[0]
            decoded.append(_Decoded(item, best.words, best.alphas, best.grid, crop, best.logprob))
    return decoded, skipped


def _word_correctness(dec: _Decoded, grounding) -> list[dict[str, Any]]:
    """Per grounded word: the share of its α on the objects it names, and the uniform baseline."""
    from sat_core.grounding import word_kind
    from sat_core.world import rle_decode

    objects = {o["id"]: o for o in dec.item.objects or []}
    rows = []
    for t, ids in sorted(grounding.token_objects.items()):
        if not ids or t >= len(dec.words):
            continue
        mask = np.logical_or.reduce([rle_decode(objects[i]["mask"]) for i in ids])
        alpha = dec.alphas[t].reshape(dec.grid)  # (gh, gw): the step that produced word t
        share, baseline = correctness_on_crop(alpha, mask, dec.crop)
        rows.append({"index": t, "word": dec.words[t], "kind": word_kind(dec.words[t]),
                     "share": share, "baseline": baseline})
    return rows


def _record(dec: _Decoded, scores: dict[str, float]) -> tuple[dict[str, Any], Any]:
    from sat_core.grounding import ground

    record: dict[str, Any] = {
        "image_id": dec.item.image_id, "filename": dec.item.filename, "caption": " ".join(dec.words),
        "references": dec.item.references, "scores": scores, "logprob": dec.logprob,
        "errors": [], "error_counts": {}, "attention_correctness": None, "words": [],
        "n_objects": None,
    }
    if dec.item.objects is None:
        return record, None
    grounding = ground(dec.words, dec.item.objects)
    words = _word_correctness(dec, grounding)
    record.update(
        errors=grounding.labels, error_counts=grounding.errors, words=words,
        n_objects=len(dec.item.objects),
        attention_correctness=float(np.mean([w["share"] for w in words])) if words else None,
        grounded={k: v for k, v in grounding.to_dict().items()
                  if k not in ("parsed", "matches", "token_objects", "errors", "labels")},
    )
    return record, grounding


def evaluation_records(
    model: Any,
    vocab: Any,
    items: Sequence[EvalImage],
    preprocess_cfg: PreprocessConfig,
    cfg: DecodeConfig | None = None,
    *,
    batch_size: int = 32,
) -> dict[str, Any]:
    """Decode every image, score it (BLEU/ROUGE-L/CIDEr, no METEOR), ground it against its scene.

    Returns ``{"corpus", "grounded", "word_types", "records", "skipped"}``; each record has
    image_id, filename, caption, references, scores, errors (labels), error_counts,
    attention_correctness (mean share of α on the named objects over grounded words, or None),
    words (per grounded word: index, word, kind, share, baseline), n_objects, logprob.
    """
    from sat_core.grounding import aggregate
    from sat_core.metrics import caption_metrics

    cfg = cfg or DecodeConfig()
    decoded, skipped = _decode_all(model, vocab, list(items), preprocess_cfg, cfg, batch_size)
    if not decoded:
        raise SatError("No image could be evaluated: " + ("; ".join(skipped[:3]) or "the list is empty."))
    refs = {d.item.image_id: d.item.references for d in decoded}
    report = caption_metrics(refs, {d.item.image_id: " ".join(d.words) for d in decoded}, meteor=False)
    records, groundings = [], []
    for dec in decoded:
        record, grounding = _record(dec, report.per_image[dec.item.image_id])
        records.append(record)
        if grounding is not None:
            groundings.append(grounding)
    return {
        "corpus": report.corpus,
        "grounded": aggregate(groundings) if groundings else {},
        "word_types": word_type_correctness(records),
        "records": records,
        "skipped": skipped,
    }


# ---- summaries of records -------------------------------------------------------------------------

def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def word_type_correctness(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per word kind (shape, colour, …): grounded words, mean α share on their objects, mean baseline."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        for word in record.get("words") or []:
            kinds.setdefault(word["kind"], []).append(word)
    return [
        {"kind": kind, "words": len(rows), "attention_on_object": _mean([r["share"] for r in rows]),
         "uniform_baseline": _mean([r["baseline"] for r in rows])}
        for kind, rows in sorted(kinds.items())
    ]


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
