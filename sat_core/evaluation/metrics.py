"""Caption metrics: BLEU-1..4, METEOR, ROUGE-L and CIDEr from pycocoevalcap.

This is the one metrics path: training's validation hook, ``evaluation.evaluate`` and the
explorer all call :func:`caption_metrics`, so every number in the project comes from the
standard COCO caption evaluation code.

Inputs must already be tokenised: lowercase words joined by single spaces, the form the
vocabulary produces; by default we only lowercase and collapse whitespace, so the scores are
those of the captions the model actually produced. ``tokenizer="ptb"`` runs the COCO evaluation
server's own step first, Stanford's ``PTBTokenizer`` (Java): it splits clitics ("man's" -> "man
's") and drops punctuation, which matters for references typed with them (COCO's raw captions),
and gives figures comparable with papers that report COCO server numbers.

``coco_results`` / ``check_coco_results``: the captions as the COCO evaluation server takes them,
``[{"image_id": int, "caption": str}, …]``, one per image, and the checks pycocotools' ``loadRes``
relies on.

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
TOKENIZERS = ("plain", "ptb")  # plain: lowercase and whitespace only; ptb: the COCO server's PTBTokenizer
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


def _ptb_tokenised(gts: dict[Hashable, list[str]], res: dict[Hashable, list[str]]
                   ) -> tuple[dict[Hashable, list[str]], dict[Hashable, list[str]]]:
    """Both sides through pycocoevalcap's PTBTokenizer (one Java run), as the COCO server does."""
    if shutil.which("java") is None:
        raise SatError("--tokenizer ptb runs Stanford's PTBTokenizer, a Java program, and there is no `java` on the "
                       "PATH: install a Java runtime (e.g. apt-get install default-jre-headless) or use "
                       "--tokenizer plain.")
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    ids = list(gts)
    both = {("ref", i): [{"caption": c} for c in gts[i]] for i in ids}
    both.update({("hyp", i): [{"caption": c} for c in res[i]] for i in ids})
    try:
        tokenised = PTBTokenizer().tokenize(both)
    except (OSError, ValueError) as exc:  # it writes a temporary file beside its jar, then runs java
        raise SatError(f"The PTB tokenizer failed ({exc}); it needs write access to pycocoevalcap's tokenizer "
                       "folder and a working `java`. Use --tokenizer plain meanwhile.") from None
    out_gts = {i: [r for r in tokenised.get(("ref", i), []) if r] for i in ids}
    empty = [i for i, refs in out_gts.items() if not refs]
    if empty:
        raise SatError(f"After PTB tokenisation image {empty[0]!r} has no reference left (punctuation only); drop it "
                       "or fix its references.")
    return out_gts, {i: tokenised.get(("hyp", i), [""])[:1] or [""] for i in ids}


def caption_metrics(
    references: Mapping[Hashable, list[str]],
    hypotheses: Mapping[Hashable, str],
    *,
    meteor: bool = True,
    tokenizer: str = "plain",
) -> MetricReport:
    """Score one hypothesis per image against its references with the COCO caption metrics.

    ``references``: image id -> reference captions; ``hypotheses``: image id -> one caption.
    With ``tokenizer="plain"`` both must be pre-tokenised (space-joined words); they are lowercased
    and whitespace is collapsed, nothing more. ``"ptb"``: the COCO server's PTBTokenizer (Java) runs
    on both first. The id sets must be equal (SatError otherwise). An empty hypothesis scores 0.
    CIDEr's document frequencies come from the scored set itself, so CIDEr of a single image is
    always 0. ``meteor=False`` skips the Java scorer.
    """
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    if tokenizer not in TOKENIZERS:
        raise SatError(f"tokenizer must be one of {', '.join(TOKENIZERS)}, not {tokenizer!r}.")
    gts, res = _prepare(references, hypotheses)
    if tokenizer == "ptb":
        gts, res = _ptb_tokenised(gts, res)
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


# ---- the COCO evaluation server's results format -------------------------------------------------------

def coco_results(captions: Mapping[Any, str]) -> list[dict[str, Any]]:
    """``[{"image_id": id, "caption": caption}, …]`` in the order given, checked by ``check_coco_results``."""
    results = [{"image_id": image_id, "caption": caption} for image_id, caption in captions.items()]
    check_coco_results(results)
    return results


def check_coco_results(results: Any, image_ids: Any = None) -> None:
    """Raise SatError unless ``results`` is what pycocotools' ``COCO.loadRes`` and the COCO caption server take:
    a non-empty list of objects with exactly ``image_id`` (an int, as COCO's ids are; a str for datasets whose ids
    are names) and ``caption`` (a str), one per image; with ``image_ids``, every id among them."""
    if not isinstance(results, list) or not results:
        raise SatError("A COCO results file is a non-empty JSON list of {\"image_id\": …, \"caption\": …} objects.")
    seen: set[Any] = set()
    for k, entry in enumerate(results):
        if not isinstance(entry, dict) or set(entry) != {"image_id", "caption"}:
            keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            raise SatError(f"Result {k} has {keys}; each result holds exactly image_id and caption.")
        image_id, caption = entry["image_id"], entry["caption"]
        if isinstance(image_id, bool) or not isinstance(image_id, (int, str)):
            raise SatError(f"Result {k}: image_id {image_id!r} is a {type(image_id).__name__}; COCO's ids are ints.")
        if not isinstance(caption, str):
            raise SatError(f"Result {k}: the caption of image {image_id!r} is a {type(caption).__name__}, not a string.")
        if image_id in seen:
            raise SatError(f"Image {image_id!r} has more than one caption; the COCO server scores one per image.")
        seen.add(image_id)
    if image_ids is not None and not seen <= set(image_ids):
        unknown = sorted(seen - set(image_ids), key=str)
        raise SatError(f"{len(unknown)} results name images the dataset does not have (e.g. {unknown[:3]}); "
                       "loadRes refuses them.")
