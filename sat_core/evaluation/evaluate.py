"""Evaluate a checkpoint on a dataset split: caption metrics, grounded accuracy, attention statistics.

``python -m sat_core.evaluate`` is the command; ``evaluate`` / ``evaluate_images`` are the library calls.
Captions come from free-running decoding (``decoding.beam_search``, batched), metrics from
``metrics.caption_metrics``. On datasets whose images carry scene objects (the embedded worlds) it
also reports grounded accuracy (``grounding.ground``/``aggregate``), attention correctness — for
every generated shape, category, colour or size word matched to exactly one object, the share of
the α of the step that produced it inside that object's mask, next to the uniform baseline — and
per-image records for error analysis. α entropy per word is reported for every dataset, β per word kind for
gated (soft) models. This module is the one place evaluation records are computed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sat_core.evaluation import alpha, confidence
from sat_core.evaluation.caption_errors import WordStats, check_against_references
from sat_core.data.vocab import UNK
from sat_core.data.words import is_function_word
from sat_core.checkpoint import LoadedCheckpoint
from sat_core.precision import resolve
from sat_core.config import DecodeConfig
from sat_core.data.karpathy import ImageRecord, KarpathyData
from sat_core.decoding import (
    Hypothesis, ReferenceScore, beam_search, best_reference, check_search_errors, encode_images,
)
from sat_core.errors import DatasetError, ImageError
from sat_core.data.images import CropInfo, load_image, preprocess
from sat_core.models.encoder import Annotations
from sat_core.regions import mask_on_alpha_grid

# Words that name an object (attention correctness); count words ("a", "two") are left out:
# "a" is an article as much as a count, and "two" names two objects.
NAMING_KINDS = ("shape", "category", "colour", "size")
WORD_KINDS = ("shape", "category", "colour", "size", "count", "relation", "place", "function")


# A reference must beat the caption by more than this (nats per word, after length normalisation) to
# count as a search error: batched search and teacher forcing differ by float noise.
SEARCH_MARGIN = 1e-3

Progress = Callable[[int, int], None]  # (images done, images in all)


@dataclass
class Decoded:
    """One evaluated image: its dataset record, the best hypothesis and where the encoder looked."""

    index: int  # position in ``data.images``; the key for metrics
    record: ImageRecord
    hypothesis: Hypothesis
    crop: CropInfo
    reference: ReferenceScore | None = None  # the model's favourite reference (``search_errors``)
    references_scored: bool = False  # ``search_errors`` asked for (``reference`` None: none reachable)


# ---- decoding -------------------------------------------------------------------------------------

def decode_images(
    loaded: LoadedCheckpoint,
    data: KarpathyData,
    indices: Sequence[int],
    cfg: DecodeConfig,
    *,
    batch_size: int = 32,
    progress: Progress | None = None,
    search_errors: bool = False,
) -> tuple[list[Decoded], list[str]]:
    """Free-running decoding of ``data.images[i]`` for each index, in batches; returns (decoded, skipped).

    ``progress(done, total)`` is called after each batch (a progress bar in the CLI or the app).
    ``search_errors``: also score every image's references under the model (``best_reference``)."""
    if search_errors:
        check_search_errors(loaded.model, cfg)  # before any image is decoded
    decoded, skipped = [], []
    for start in range(0, len(indices), batch_size):
        tensors, kept = [], []
        for i in indices[start : start + batch_size]:
            try:
                tensor, crop = preprocess(load_image(data.images[i].path), loaded.preprocess)  # (3, S, S)
            except ImageError as err:
                skipped.append(str(err))
                continue
            tensors.append(tensor)
            kept.append((i, crop))
        if not tensors:
            continue
        images = torch.stack(tensors)  # (B, 3, S, S)
        # With search_errors the references are scored on the same annotations: encode once.
        inputs = encode_images(loaded.model, images, cfg.precision) if search_errors else images
        beams = beam_search(loaded.model, inputs, loaded.vocab, cfg)  # B lists of hypotheses
        for b, ((i, crop), hyps) in enumerate(zip(kept, beams)):
            record = data.images[i]
            reference = None
            if search_errors:
                refs = [" ".join(s) for s in record.sentences]
                one = Annotations(inputs.feats[b : b + 1], inputs.grid)  # (1, L, D)
                reference = best_reference(loaded.model, loaded.vocab, one, refs, cfg)
            decoded.append(Decoded(i, record, hyps[0], crop, reference, search_errors))
        if progress is not None:
            progress(min(start + batch_size, len(indices)), len(indices))
    if not decoded:
        raise DatasetError(
            f"None of the {len(indices)} images to evaluate could be read "
            f"({'; '.join(skipped[:2]) or 'none listed'}); check the images folder {data.images_dir}."
        )
    return decoded, skipped


def _split_indices(data: KarpathyData, split: str, limit: int | None) -> list[int]:
    return data.split(split)[:limit] if limit else data.split(split)


def decode_split(
    loaded: LoadedCheckpoint,
    data: KarpathyData,
    split: str,
    cfg: DecodeConfig,
    *,
    limit: int | None = None,
    batch_size: int = 32,
) -> tuple[list[Decoded], list[str]]:
    """``decode_images`` over the split (or its first ``limit`` images)."""
    return decode_images(loaded, data, _split_indices(data, split, limit), cfg, batch_size=batch_size)


# ---- per-word attention figures ---------------------------------------------------------------------

def word_attention(dec: Decoded, token_objects: dict[int, list[int]]) -> list[dict[str, Any]]:
    """Per generated word matched to exactly one object: share of its α on that object's mask, the uniform
    baseline (the mask's share of the image), the ceiling (the most any α on the grid could put on it), α's
    entropy and the mask's (``grounding.mask_entropy``: α spread over the object as the mask covers the cells),
    and where the rest of α went (``grounding.attention_elsewhere``): on the scene's other objects, and on the
    background beside the named one."""
    from sat_core.evaluation.grounding import (attention_ceiling, attention_correctness, attention_elsewhere, mask_entropy,
                                    word_kind)
    from sat_core.data.masks import rle_decode

    hyp = dec.hypothesis
    objects = {o["id"]: o for o in dec.record.objects or []}
    masks: dict[int, np.ndarray] = {}  # object id -> its mask on the α grid, decoded once per image

    def mask_of(i: int) -> np.ndarray:
        if i not in masks:
            masks[i] = mask_on_alpha_grid(rle_decode(objects[i]["mask"]), dec.crop, hyp.grid)
        return masks[i]

    rows = []
    for t, ids in sorted(token_objects.items()):
        if len(ids) != 1 or t >= len(hyp.words):
            continue
        mask, grid_alpha = mask_of(ids[0]), hyp.alphas[t].reshape(hyp.grid)  # α of step t
        others = np.zeros_like(mask)
        for i in objects:
            if i != ids[0]:
                others |= mask_of(i)
        share, baseline = attention_correctness(grid_alpha, mask)
        on_others, beside = attention_elsewhere(grid_alpha, mask, others)
        rows.append({"index": t, "word": hyp.words[t], "kind": word_kind(hyp.words[t]),
                     "object": ids[0], "share": share, "baseline": baseline,
                     "ceiling": attention_ceiling(hyp.grid, mask),
                     "entropy": float(alpha.entropy(hyp.alphas[t])), "mask_entropy": mask_entropy(hyp.grid, mask),
                     "on_other_objects": on_others, "beside_object": beside})
    return rows


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def mean_of_known(values: Sequence[float | None]) -> float | None:
    """The mean of the values that are known (None: not measured, or records written before a field was kept)."""
    return _mean([v for v in values if v is not None])


# ---- records and summaries ------------------------------------------------------------------------

def image_record(dec: Decoded, scores: dict[str, float], stats: WordStats) -> tuple[dict[str, Any], Any]:
    """The per-image record (JSON-ready) and its Grounding (None without scene objects).

    Keys: image_id, filename, caption, tokens, references, scores (CIDEr, BLEU-4), logprob, finished,
    alpha_entropy, n_objects; errors (labels): REFERENCE_LABELS from the references for every dataset
    (with first_error, hallucinated, missed, word_kinds), then on scenes with objects the grounding
    labels; from grounding (else empty / None): grounding
    (``Grounding.to_dict``: scores, error counts, token -> objects), words (``word_attention`` rows)
    and attention_correctness (mean share over the NAMING_KINDS words). ``eval_records.json`` and the
    explorer's error analysis hold exactly these records.
    """
    from sat_core.evaluation.grounding import ground

    hyp = dec.hypothesis
    entropy = alpha.entropy(hyp.alphas[: len(hyp.words)]) if hyp.words else np.zeros(0)
    check = check_against_references(hyp.words, dec.record.sentences, stats, finished=hyp.finished)
    record: dict[str, Any] = {
        "image_id": dec.record.id, "filename": dec.record.path.name, "caption": hyp.caption,
        "tokens": list(hyp.words), "references": [" ".join(s) for s in dec.record.sentences],
        "scores": {k: scores[k] for k in ("CIDEr", "BLEU-4")}, "logprob": hyp.logprob,
        "finished": hyp.finished, "errors": list(check.labels), "first_error": check.first_error,
        "hallucinated": check.hallucinated, "missed": check.missed, "word_kinds": check.kinds,
        "grounding": None, "words": [],
        "attention_correctness": None, "alpha_entropy": _mean(entropy),
        "n_objects": None if dec.record.objects is None else len(dec.record.objects),
    }
    if dec.reference is not None:
        ref = dec.reference
        record.update(best_reference={"caption": ref.caption, "score": ref.score, "reachable": ref.reachable},
                      search_error=(ref.caption != hyp.caption and ref.score > hyp.score + SEARCH_MARGIN))
    elif dec.references_scored:  # no reference beam search could have said (unknown words, too long)
        record.update(best_reference=None, search_error=None)
    if dec.record.objects is None:
        return record, None
    grounding = ground(hyp.words, dec.record.objects, getattr(dec.record, "place", None))
    words = word_attention(dec, grounding.token_objects)
    g = grounding.to_dict()
    g["token_objects"] = {str(t): ids for t, ids in g["token_objects"].items()}  # JSON keys are strings
    record.update(errors=record["errors"] + grounding.labels, grounding=g, words=words, attention_correctness=_mean(
        [w["share"] for w in words if w["kind"] in NAMING_KINDS]))
    return record, grounding


# The kinds of an embedded world's words (shape, colour, …) hold on that world's images only; every other word, and
# every word of another dataset, is content or function by the checkpoint's own word statistics (``WordStats``,
# learnt from its training captions): "astronaut" and, on a photo dataset, "red" are content, "the" and "in"
# function. A word there are no statistics for is "unclassified", not guessed.
SUMMARY_KINDS = (*WORD_KINDS[:-1], "content", "function", "unclassified")


def dataset_world(decoded: Sequence[Decoded]) -> Any:
    """The embedded world whose generator made these images (their records carry its objects), else None."""
    from sat_core import worlds

    objects = next((d.record.objects for d in decoded if d.record.objects), None)
    return worlds.of(objects) if objects else None


def summary_kind(word: str, stats: WordStats, world: Any = None) -> str:
    """The kind a word is summarised under: its kind in ``world`` (the data's embedded world, None for other
    data), else content / function by ``stats``; "unclassified" when nothing is known of it."""
    kind = world.word_kind(word) if world is not None else None
    if kind is not None and kind != "function":
        return kind
    if is_function_word(word):
        return "function"
    if not stats.counts or word == UNK:
        return "unclassified"
    return stats.kind(word)


def attention_summary(decoded: Sequence[Decoded], records: Sequence[dict[str, Any]],
                      stats: WordStats | None = None) -> dict[str, Any]:
    """α entropy per generated word over all words and per word kind (``summary_kind``); attention correctness over
    naming words, and their α's entropy against that of the objects' masks."""
    stats = stats or WordStats()
    alphas = [d.hypothesis.alphas[: len(d.hypothesis.words)] for d in decoded if d.hypothesis.words]
    L = decoded[0].hypothesis.alphas.shape[1]
    entropy = alpha.entropy(np.concatenate(alphas)) if alphas else np.zeros(0)
    world = dataset_world(decoded)
    kinds = [summary_kind(w, stats, world) for d in decoded for w in d.hypothesis.words]
    out: dict[str, Any] = {
        "n_words": int(entropy.size), "regions": L,
        "entropy_nats": _mean(entropy),
        "entropy_normalised": _mean(entropy / math.log(L)) if L > 1 else None,
        "entropy_by_kind": {k: {"n": len(es), "mean": _mean(es)} for k in SUMMARY_KINDS
                            if (es := [float(e) for e, kind in zip(entropy, kinds) if kind == k])},
    }
    words = [w for r in records for w in r["words"]]
    if any(d.record.objects is not None for d in decoded):
        naming = [w for w in words if w["kind"] in NAMING_KINDS]
        share, base = _mean([w["share"] for w in naming]), _mean([w["baseline"] for w in naming])
        ceiling = _mean([w["ceiling"] for w in naming])
        out.update(correctness=share, baseline=base, ceiling=ceiling, n_grounded_words=len(naming),
                   naming_entropy=mean_of_known([w.get("entropy") for w in naming]),
                   mask_entropy=mean_of_known([w.get("mask_entropy") for w in naming]),
                   on_other_objects=mean_of_known([w.get("on_other_objects") for w in naming]),
                   beside_object=mean_of_known([w.get("beside_object") for w in naming]),
                   ratio=share / base if share is not None and base else None,
                   by_kind=correctness_by_kind(words))
    return out


def correctness_by_kind(words: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per word kind present: words (rows of ``word_attention``), mean share of α on their object,
    mean uniform baseline, mean α entropy, mean entropy of the objects' masks and mean shares of α on the other
    objects and beside the named one (None in records from before they were kept). Only NAMING_KINDS enter the
    headline attention correctness."""
    return {k: {"n": len(ws), "correctness": _mean([w["share"] for w in ws]),
                "baseline": _mean([w["baseline"] for w in ws]),
                "entropy": mean_of_known([w.get("entropy") for w in ws]),
                "mask_entropy": mean_of_known([w.get("mask_entropy") for w in ws]),
                "on_other_objects": mean_of_known([w.get("on_other_objects") for w in ws]),
                "beside_object": mean_of_known([w.get("beside_object") for w in ws])}
            for k in WORD_KINDS if (ws := [w for w in words if w["kind"] == k])}


def beta_by_kind(decoded: Sequence[Decoded], stats: WordStats | None = None) -> dict[str, dict[str, float]]:
    """Mean gate β_t over the generated words of each kind (``summary_kind``; call only for gated models)."""
    stats, world = stats or WordStats(), dataset_world(decoded)
    values: dict[str, list[float]] = {}
    for d in decoded:
        for word, beta in zip(d.hypothesis.words, d.hypothesis.betas):
            values.setdefault(summary_kind(word, stats, world), []).append(float(beta))
    return {k: {"n": len(values[k]), "mean": float(np.mean(values[k]))} for k in SUMMARY_KINDS if k in values}


def score_decoded(decoded: Sequence[Decoded], *, gated: bool, stats: WordStats,
                  meteor: bool = True, tokenizer: str = "plain") -> dict[str, Any]:
    """Corpus metrics (``tokenizer``: ``metrics.TOKENIZERS``), grounded accuracy, attention figures, β by kind and
    records of decoded images."""
    from sat_core.evaluation.grounding import aggregate
    from sat_core.evaluation.metrics import caption_metrics

    refs = {d.index: [" ".join(s) for s in d.record.sentences] for d in decoded}
    report = caption_metrics(refs, {d.index: d.hypothesis.caption for d in decoded}, meteor=meteor,
                             tokenizer=tokenizer)
    records, groundings = [], []
    for d in decoded:
        record, grounding = image_record(d, report.per_image[d.index], stats)
        records.append(record)
        if grounding is not None:
            groundings.append(grounding)
    return {
        "corpus": report.corpus,
        "grounded": aggregate(groundings) if groundings else {},
        **({"search": search_summary(records)} if any("search_error" in r for r in records) else {}),
        "attention": attention_summary(decoded, records, stats),
        "beta_by_kind": beta_by_kind(decoded, stats) if gated else {},
        "notes": list(report.notes) + ([] if gated else ["no gate β in this model (hard attention or gate off)"]),
        "records": records,
    }


def search_summary(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Search errors against model errors: over the images with a reference beam search could have
    said, the share where one outscores its caption, overall and per error label of the caption;
    ``unreachable`` counts the images with none (every reference has unknown words or is too long)."""
    checked = [r for r in records if r.get("search_error") is not None]
    by_label: dict[str, dict[str, Any]] = {}
    for label in sorted({label for r in checked for label in r["errors"]}):
        having = [r for r in checked if label in r["errors"]]
        by_label[label] = {"n": len(having), "search_error_rate": _mean([float(r["search_error"]) for r in having])}
    return {"n": len(checked), "unreachable": sum(r.get("search_error", 0) is None for r in records),
            "search_error_rate": _mean([float(r["search_error"]) for r in checked]),
            "by_label": by_label}


def word_stats(loaded: LoadedCheckpoint, data: KarpathyData) -> WordStats:
    """The checkpoint's own word statistics (stored by the trainer from its training captions), else those of
    ``data``'s training captions (all of its references when it has no train split)."""
    stored = (loaded.config.get("training") or {}).get("word_stats")
    if stored:
        return WordStats.from_dict(stored)
    train = [r.sentences for r in data.images if r.split == "train"]
    return WordStats.from_references(train or [r.sentences for r in data.images],
                                     source=f"{data.json_path} ({'train split' if train else 'all splits'})")


def evaluate_images(
    loaded: LoadedCheckpoint,
    data: KarpathyData,
    indices: Sequence[int],
    cfg: DecodeConfig,
    *,
    meteor: bool = True,
    batch_size: int = 32,
    progress: Progress | None = None,
    search_errors: bool = False,
    tokenizer: str = "plain",
) -> dict[str, Any]:
    """Decode ``data.images[i]`` for each index and compute every evaluation figure and record."""
    decoded, skipped = decode_images(loaded, data, indices, cfg, batch_size=batch_size, progress=progress,
                                     search_errors=search_errors)
    scored = score_decoded(decoded, gated=bool(loaded.model.decoder.gated), stats=word_stats(loaded, data),
                           meteor=meteor, tokenizer=tokenizer)
    precision = resolve(next(loaded.model.parameters()).device, cfg.precision)
    unsure = confidence.summary(scored["records"], confidence.kept_reference(loaded.config))
    return {"checkpoint": str(loaded.path), "beam": cfg.beam_size, "max_len": cfg.max_len,
            "length_norm": cfg.length_norm, "precision": precision, "tokenizer": tokenizer,
            "n_images": len(decoded), "skipped": skipped, **scored, **({"confidence": unsure} if unsure else {})}


def evaluate(
    loaded: LoadedCheckpoint,
    data: KarpathyData,
    split: str,
    cfg: DecodeConfig,
    *,
    limit: int | None = None,
    meteor: bool = True,
    batch_size: int = 32,
    progress: Progress | None = None,
    search_errors: bool = False,
    tokenizer: str = "plain",
) -> dict[str, Any]:
    """Decode a split (or its first ``limit`` images) and compute every evaluation figure."""
    indices = _split_indices(data, split, limit)
    return {"split": split, "dataset": str(data.json_path),
            **evaluate_images(loaded, data, indices, cfg, meteor=meteor, batch_size=batch_size, progress=progress,
                              search_errors=search_errors, tokenizer=tokenizer)}


def read_records(path: str | Path) -> dict[str, Any]:
    """Records written by this module in either of its formats: ``--records`` (a list of records) or
    ``--out`` / a checkpoint's ``eval_records.json`` (an object holding ``records``)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path} is not a readable records JSON file ({exc}).") from None
    if isinstance(doc, list):
        doc = {"records": doc}
    records = doc.get("records") if isinstance(doc, dict) else None
    if not isinstance(records, list) or not all(isinstance(r, dict) and "image_id" in r for r in records):
        raise DatasetError(f"{path} holds no evaluation records (a list of objects with image_id, as written "
                           "by python -m sat_core.evaluate --records).")
    return doc
