"""sat_core.evaluation.metrics against pycocoevalcap called directly on the same captions."""

from __future__ import annotations

import shutil
import threading
import warnings

import pytest

from sat_core.evaluation import metrics
from sat_core.errors import SatError
from sat_core.evaluation.metrics import METRIC_KEYS, caption_metrics

pytest.importorskip("pycocoevalcap")
needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="METEOR needs java")

# 6 images x 3 references; hypotheses range from exact copies to unrelated words.
REFS = {
    "img0": ["a dog runs across the green grass", "a brown dog running on grass", "the dog is running in a field"],
    "img1": ["a man rides a red bicycle down the street", "a person riding a bike", "a cyclist on a city road"],
    "img2": ["two cats sleep on a sofa", "a pair of cats lying on a couch", "cats resting on the sofa"],
    "img3": [
        "a plate of food with rice and vegetables", "a meal on a white plate", "rice and greens on a dish"
    ],
    "img4": ["a red bus parked by the road", "a double decker bus on the street", "a bus waiting at a stop"],
    "img5": ["a child flying a kite on the beach", "a kid with a kite near the sea", "a small boy plays with a kite"],
}
HYPS = {
    "img0": "a dog runs across the green grass",
    "img1": "a man riding a bike on the street",
    "img2": "a cat on a couch",
    "img3": "a plate of food",
    "img4": "a train on the tracks",
    "img5": "a boy flying a kite on the beach",
}


def _direct(refs: dict, hyps: dict, scorer) -> tuple:
    gts = {k: list(v) for k, v in refs.items()}
    res = {k: [hyps[k]] for k in refs}
    if scorer.method() == "Bleu":
        return scorer.compute_score(gts, res, verbose=0)
    return scorer.compute_score(gts, res)


@pytest.fixture(scope="module")
def report():
    # Computed once: the first METEOR call starts the JVM (~12 s); later tests reuse it.
    return caption_metrics(REFS, HYPS, meteor=shutil.which("java") is not None)


def test_bleu_rouge_cider_equal_pycocoevalcap(report) -> None:
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    bleu, bleu_per_n = _direct(REFS, HYPS, Bleu(4))
    for n in range(4):
        assert report.corpus[f"BLEU-{n + 1}"] == bleu[n]
        assert [report.per_image[k][f"BLEU-{n + 1}"] for k in REFS] == bleu_per_n[n]
    for name, scorer in (("ROUGE-L", Rouge()), ("CIDEr", Cider())):
        score, scores = _direct(REFS, HYPS, scorer)
        assert report.corpus[name] == score
        assert [report.per_image[k][name] for k in REFS] == list(scores)
    # The set must have varied overlap, or equality above would prove little.
    assert report.per_image["img0"]["BLEU-4"] > 0.9
    assert report.per_image["img4"]["BLEU-4"] < 0.1
    assert 0.0 < report.corpus["CIDEr"] < 10.0


@needs_java
def test_meteor_equals_pycocoevalcap(report) -> None:
    # The reference is pycocoevalcap's Meteor.compute_score on the raw dicts, run on the shared
    # JVM (a second JVM would cost another ~12 s; the jar and the call are the same).
    with metrics._meteor_lock:
        score, scores = _direct(REFS, HYPS, metrics._meteor_instance())
    assert report.corpus["METEOR"] == pytest.approx(score, abs=1e-6)
    for key, value in zip(REFS, scores):
        assert report.per_image[key]["METEOR"] == pytest.approx(value, abs=1e-6)
    assert set(report.corpus) == set(METRIC_KEYS)


def test_perfect_hypotheses_score_maximum() -> None:
    refs = {k: [v[0]] * 3 for k, v in REFS.items()}
    hyps = {k: v[0] for k, v in refs.items()}
    report = caption_metrics(refs, hyps, meteor=shutil.which("java") is not None)
    assert report.corpus["BLEU-4"] == pytest.approx(1.0, abs=1e-6)
    assert report.corpus["BLEU-1"] == pytest.approx(1.0, abs=1e-6)
    assert report.corpus["ROUGE-L"] == pytest.approx(1.0)
    assert report.corpus["CIDEr"] == pytest.approx(10.0)
    if "METEOR" in report.corpus:
        assert report.corpus["METEOR"] == pytest.approx(1.0, abs=1e-3)


def test_without_java_meteor_is_skipped_with_warning(monkeypatch) -> None:
    monkeypatch.setattr(metrics.shutil, "which", lambda name: None)
    with pytest.warns(UserWarning, match="METEOR skipped"):
        report = caption_metrics(REFS, HYPS)
    assert "METEOR" not in report.corpus
    assert all("METEOR" not in scores for scores in report.per_image.values())
    assert set(report.corpus) == set(METRIC_KEYS) - {"METEOR"}
    assert report.notes


def test_meteor_false_skips_silently() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = caption_metrics(REFS, HYPS, meteor=False)
    assert "METEOR" not in report.corpus and not report.notes


def test_mismatched_ids_raise_sat_error() -> None:
    hyps = dict(HYPS)
    del hyps["img3"]
    hyps["other"] = "a dog"
    with pytest.raises(SatError, match=r"1 without a hypothesis.*img3.*1 without references.*other"):
        caption_metrics(REFS, hyps, meteor=False)


def test_bad_references_raise_sat_error() -> None:
    with pytest.raises(SatError, match="no non-empty reference"):
        caption_metrics({"a": ["", "  "]}, {"a": "a dog"}, meteor=False)
    with pytest.raises(SatError, match="empty"):
        caption_metrics({}, {}, meteor=False)
    with pytest.raises(SatError, match="list of strings"):
        caption_metrics({"a": "a dog"}, {"a": "a dog"}, meteor=False)


def test_single_image() -> None:
    report = caption_metrics({7: ["a dog on grass", "a dog"]}, {7: "a dog on grass"}, meteor=False)
    assert list(report.per_image) == [7]
    assert report.corpus["ROUGE-L"] == pytest.approx(1.0)
    # CIDEr's idf comes from the scored set: with one image every n-gram has idf 0.
    assert report.corpus["CIDEr"] == 0.0


def test_case_and_whitespace_are_normalised() -> None:
    messy_refs = {k: [f"  {r.upper()}  " for r in v] for k, v in REFS.items()}
    messy_hyps = {k: v.replace(" ", "   ").title() for k, v in HYPS.items()}
    assert caption_metrics(messy_refs, messy_hyps, meteor=False).corpus == caption_metrics(
        REFS, HYPS, meteor=False
    ).corpus


def test_empty_hypothesis_scores_zero(report) -> None:
    hyps = dict(HYPS, img1="")
    got = caption_metrics(REFS, hyps, meteor="METEOR" in report.corpus)
    assert set(got.per_image["img1"]) == set(report.corpus)
    assert all(value == 0.0 for value in got.per_image["img1"].values())
    # The other images keep their per-image scores (CIDEr's idf depends only on references).
    assert got.per_image["img0"]["CIDEr"] == report.per_image["img0"]["CIDEr"]
    assert got.corpus["BLEU-1"] < report.corpus["BLEU-1"]


@needs_java
def test_meteor_singleton_is_shared_across_threads(report) -> None:
    first = metrics._meteor_instance()
    results: list[float] = []

    def score() -> None:
        results.append(caption_metrics(REFS, HYPS).corpus["METEOR"])

    threads = [threading.Thread(target=score) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == [report.corpus["METEOR"]] * 3
    assert metrics._meteor_instance() is first


class _HungMeteor:
    """Stands in for pycocoevalcap's Meteor whose JVM never answers until killed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.killed = threading.Event()
        self.meteor_p = self  # the watchdog kills meteor_p

    def kill(self) -> None:
        self.killed.set()

    def wait(self, timeout: float | None = None) -> int:
        return -9

    def compute_score(self, gts, res):
        self.lock.acquire()  # like pycocoevalcap: taken and not released on error
        if not self.killed.wait(timeout=10):
            raise AssertionError("watchdog never fired")
        raise ValueError("could not convert string to float: b''")  # readline() at EOF


def test_hung_meteor_is_killed_and_dropped(monkeypatch) -> None:
    hung = _HungMeteor()
    monkeypatch.setattr(metrics, "_meteor", hung)
    monkeypatch.setattr(metrics, "METEOR_TIMEOUT_S", 0.2)
    monkeypatch.setattr(metrics.shutil, "which", lambda name: "/usr/bin/java")
    with pytest.warns(UserWarning, match="METEOR process failed"):
        report = caption_metrics(REFS, HYPS)
    assert hung.killed.is_set()
    assert "METEOR" not in report.corpus and "BLEU-4" in report.corpus
    assert metrics._meteor is None  # the next call starts a fresh JVM
    assert not hung.lock.locked()  # so its __del__ cannot deadlock
