"""Beam search gives back the recorded results (tests/data/beam_reference.json, see tests/beam_reference.py):
tokens exactly, scores to 1e-5, batched and one image at a time, beam 1, 3 and 5, with and without length
normalisation."""

from __future__ import annotations

import json

import pytest
import torch

from sat_core.models.encoder import Annotations
from tests import beam_reference as ref

RECORDED = json.loads(ref.REFERENCE.read_text())["cases"]
CASES = [c for c in ref.cases() if ref.case_name(c) in RECORDED]
SAMPLED = ("hard_mode", "sample_words")  # seeded draws: one image alone draws other numbers than the batch


@pytest.fixture(scope="module")
def models():
    return ref.load_models()


def _check(hyps, recorded, where: str) -> None:
    assert [h.tokens for h in hyps] == [r["tokens"] for r in recorded], where
    for h, r in zip(hyps, recorded):
        assert h.finished == r["finished"], where
        assert h.logprob == pytest.approx(r["logprob"], abs=1e-5), where
        assert h.score == pytest.approx(r["score"], abs=1e-5), where
        assert [int(x) for x in h.locations] == r["locations"], where
        assert float(h.betas.sum()) == pytest.approx(r["beta_sum"], abs=1e-5), where
        assert ref.as_record(h)["alpha_digest"] == pytest.approx(r["alpha_digest"], abs=1e-5), where


def _ids(case) -> str:
    return ref.case_name(case)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_batched_search_gives_the_recorded_results(models, case):
    if case["model"] not in models:
        pytest.skip("checkpoints/shapes_soft is not shipped")
    results = ref.run_case(case, models)
    recorded = RECORDED[ref.case_name(case)]
    assert len(results) == len(recorded)
    for i, (hyps, rec) in enumerate(zip(results, recorded)):
        _check(hyps, rec, f"image {i}")


@pytest.mark.parametrize("case", [c for c in CASES if not any(k in c for k in SAMPLED)], ids=_ids)
def test_one_image_at_a_time_gives_the_recorded_results(models, case):
    if case["model"] not in models:
        pytest.skip("checkpoints/shapes_soft is not shipped")
    feats = models[case["model"]][2]
    recorded = RECORDED[ref.case_name(case)]
    for i, rec in enumerate(recorded):
        alone = ref.run_case(case, models, Annotations(feats.feats[i : i + 1], feats.grid))
        _check(alone[0], rec, f"image {i} alone")


def test_the_reference_holds_varied_searches():
    """The recorded cases are worth holding to: hypotheses end at many steps, some only at the cap."""
    lengths = {(r["steps"], r["finished"]) for case in RECORDED.values() for hyps in case for r in hyps}
    assert len({n for n, done in lengths if done}) >= 5
    assert any(not done for _, done in lengths)
    assert torch.tensor([len(hyps) for case in RECORDED.values() for hyps in case]).min() >= 1
