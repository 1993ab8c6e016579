"""Caption metrics: BLEU-1..4, METEOR, ROUGE-L and CIDEr from pycocoevalcap.

This is the one metrics path: training's validation hook, ``evaluation.evaluate`` and the
explorer all call :func:`caption_metrics`, so every number in the project comes from the
standard COCO caption evaluation code.

Inputs must already be tokenised: lowercase words joined by single spaces, the form the
vocabulary produces. The COCO ``PTBTokenizer`` is deliberately not run — it needs Java and
rewrites tokens (drops punctuation, splits clitics), so scores would no longer match the
captions the model actually produced. We only lowercase and collapse whitespace here.

METEOR runs a Java program. Without ``java`` on the PATH it is skipped with a warning and left
out of the report. Its JVM takes ~12 s to start, so one process is kept per Python process
(a lazy singleton, shared by threads under a lock, killed at exit). SPICE is never called: it
downloads Stanford CoreNLP on first use.
"""

from __future__ import annotations

import atexit
import shutil
import threading
import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sat_core.errors import SatError

BLEU_KEYS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4")
METRIC_KEYS = (*BLEU_KEYS, "METEOR", "ROUGE-L", "CIDEr")

# A METEOR call that takes longer than this is treated as a hung JVM: the process is killed,
# METEOR is dropped from that report with a warning, and the next call starts a fresh JVM.
METEOR_TIMEOUT_S = 300.0

_meteor: Any = None  # pycocoevalcap Meteor instance, created on first use
_meteor_lock = threading.Lock()


@dataclass
class MetricReport:
    """Corpus-level scores and the per-image scores they are built from.

    ``corpus`` maps metric name (see ``METRIC_KEYS``) to a float; METEOR is absent when Java
    is unavailable or the METEOR process failed. ``per_image`` maps each image id to the same
    metric names. Corpus BLEU and METEOR pool counts over all images, so they are not the mean
    of the per-image values; ROUGE-L and CIDEr are.
    """

    corpus: dict[str, float]
    per_image: dict[Hashable, dict[str, float]]
    notes: list[str] = field(default_factory=list)  # why a metric is missing, for display

    def __str__(self) -> str:
        return "  ".join(f"{k} {v:.4f}" for k, v in self.corpus.items())


def normalise_caption(text: str) -> str:
    """Lowercase and collapse whitespace; no other tokenisation is applied."""
    return " ".join(str(text).lower().split())


def _prepare(
    references: Mapping[Hashable, list[str]], hypotheses: Mapping[Hashable, str]
) -> tuple[dict[Hashable, list[str]], dict[Hashable, list[str]]]:
    """Check ids and build pycocoevalcap's ``gts`` / ``res`` dicts in reference order."""
    if not references:
        raise SatError("No captions to score: the reference set is empty.")
    missing = [i for i in references if i not in hypotheses]
    extra = [i for i in hypotheses if i not in references]
    if missing or extra:
        raise SatError(
            "Image ids of hypotheses and references differ: "
            f"{len(missing)} without a hypothesis (e.g. {missing[:3]}), "
            f"{len(extra)} without references (e.g. {extra[:3]}). "
            "Score exactly one hypothesis per referenced image."
        )
    gts: dict[Hashable, list[str]] = {}
    res: dict[Hashable, list[str]] = {}
    for image_id, refs in references.items():
        if isinstance(refs, str):
            raise SatError(f"References for image {image_id!r} must be a list of strings, got one string.")
        # Empty references would score as a one-token sentence "" and confuse METEOR's input.
        cleaned = [r for r in (normalise_caption(r) for r in refs) if r]
        if not cleaned:
            raise SatError(f"Image {image_id!r} has no non-empty reference caption; drop it or add one.")
        gts[image_id] = cleaned
        # An empty hypothesis stays empty: pycocoevalcap 1.2 scores it 0 everywhere (checked in
        # tests, METEOR included) and a placeholder word would change the corpus BLEU/METEOR.
        hypothesis = hypotheses[image_id]
        if not isinstance(hypothesis, str):
            raise SatError(f"Hypothesis for image {image_id!r} must be a string, got {type(hypothesis).__name__}.")
        res[image_id] = [normalise_caption(hypothesis)]
    return gts, res


def _meteor_instance() -> Any:
    """The process-wide Meteor scorer; call with ``_meteor_lock`` held."""
    global _meteor
    if _meteor is None:
        from pycocoevalcap.meteor.meteor import Meteor

        _meteor = Meteor()
    return _meteor


def _drop_meteor() -> None:
    """Kill the METEOR JVM and forget it; call with ``_meteor_lock`` held."""
    global _meteor
    meteor, _meteor = _meteor, None
    if meteor is None:
        return
    # pycocoevalcap's compute_score does not release its own lock when it raises, and its
    # __del__ acquires that lock: release it so garbage collection cannot deadlock.
    if meteor.lock.locked():
        meteor.lock.release()
    try:
        meteor.meteor_p.kill()
        meteor.meteor_p.wait(timeout=10)
    except Exception:  # already dead: nothing left to clean up
        pass


@atexit.register
def close_meteor() -> None:
    """Stop the METEOR JVM (registered at exit; safe to call any time)."""
    if _meteor_lock.acquire(timeout=5):
        try:
            _drop_meteor()
        finally:
            _meteor_lock.release()


def _meteor_scores(
    gts: dict[Hashable, list[str]], res: dict[Hashable, list[str]]
) -> tuple[float, list[float]] | None:
    """Corpus and per-image METEOR, or None (with a warning) when it cannot run."""
    if shutil.which("java") is None:
        warnings.warn("METEOR skipped: no `java` on PATH (install a JRE to get METEOR).", stacklevel=3)
        return None
    with _meteor_lock:
        meteor = _meteor_instance()
        # A hung JVM would block readline() forever; killing it turns that into EOF -> error.
        watchdog = threading.Timer(METEOR_TIMEOUT_S, meteor.meteor_p.kill)
        watchdog.start()
        try:
            score, scores = meteor.compute_score(gts, res)
            return float(score), [float(s) for s in scores]
        except Exception as exc:  # the JVM died, timed out or answered garbage
            _drop_meteor()
            warnings.warn(f"METEOR skipped: the METEOR process failed ({exc!r}).", stacklevel=3)
            return None
        finally:
            watchdog.cancel()


def caption_metrics(
    references: Mapping[Hashable, list[str]],
    hypotheses: Mapping[Hashable, str],
    *,
    meteor: bool = True,
) -> MetricReport:
    """Score one hypothesis per image against its references with the COCO caption metrics.

    ``references``: image id -> reference captions; ``hypotheses``: image id -> one caption.
    Both must be pre-tokenised (space-joined words); they are lowercased and whitespace is
    collapsed, nothing more. The id sets must be equal (SatError otherwise). An empty
    hypothesis scores 0. CIDEr's document frequencies come from the scored set itself, so
    CIDEr of a single image is always 0. ``meteor=False`` skips the Java scorer.
    """
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    gts, res = _prepare(references, hypotheses)
    ids = list(gts)
    corpus: dict[str, float] = {}
    per_image: dict[Hashable, dict[str, float]] = {i: {} for i in ids}

    def record(name: str, score: float, scores: Any) -> None:
        corpus[name] = float(score)
        for image_id, value in zip(ids, scores, strict=True):
            per_image[image_id][name] = float(value)

    bleu, bleu_per_n = Bleu(4).compute_score(gts, res, verbose=0)  # verbose=0: no prints
    for name, score, scores in zip(BLEU_KEYS, bleu, bleu_per_n, strict=True):
        record(name, score, scores)
    notes: list[str] = []
    if meteor:
        meteor_result = _meteor_scores(gts, res)
        if meteor_result is None:
            notes.append("METEOR skipped (Java missing or the METEOR process failed).")
        else:
            record("METEOR", *meteor_result)
    record("ROUGE-L", *Rouge().compute_score(gts, res))
    record("CIDEr", *Cider().compute_score(gts, res))
    return MetricReport(corpus=corpus, per_image=per_image, notes=notes)
