"""Beam search gives back the recorded results (tests/data/beam_reference.json, see tests/beam_reference.py):
tokens exactly, scores to 1e-5, batched and one image at a time, beam 1, 3 and 5, with and without length
normalisation."""

from __future__ import annotations

import json

import pytest
import torch

from sat_core.config import DecodeConfig
from sat_core.decoding import beam, beam_search
from sat_core.models.encoder import Annotations
from tests import beam_reference as ref

RECORDED = json.loads(ref.REFERENCE.read_text())["cases"]
CASES = [c for c in ref.cases() if ref.case_name(c) in RECORDED]
SAMPLED = ("hard_mode", "sample_words")  # seeded draws: one image alone draws other numbers than the batch
SEARCHED = [c for c in CASES if not any(k in c for k in SAMPLED)]


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


@pytest.mark.parametrize("case", SEARCHED, ids=_ids)
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


@pytest.fixture
def fixed_rows(monkeypatch):
    """The search as on a GPU: every image keeps its K rows until the whole batch is done (finished ones
    masked), one row count from the second step to the last."""
    monkeypatch.setattr(beam, "_fixed_rows", lambda device: True)


@pytest.mark.parametrize("case", SEARCHED, ids=_ids)
def test_fixed_rows_with_finished_images_masked_give_the_recorded_results(models, case, fixed_rows):
    if case["model"] not in models:
        pytest.skip("checkpoints/shapes_soft is not shipped")
    model = models[case["model"]][0]
    rows_seen, step = [], model.decoder.step

    def counting_step(tokens, *args, **kwargs):
        rows_seen.append(tokens.shape[0])
        return step(tokens, *args, **kwargs)

    model.decoder.step = counting_step
    try:
        results = ref.run_case(case, models)
    finally:
        del model.decoder.step
    B, K = len(results), case["beam_size"]
    assert rows_seen[0] == B and set(rows_seen[1:]) <= {B * K}, rows_seen
    for i, (hyps, rec) in enumerate(zip(results, RECORDED[ref.case_name(case)])):
        _check(hyps, rec, f"image {i}, fixed rows")


@pytest.mark.parametrize("beam_size", [1, 3, 5])
def test_fixed_rows_equal_leaving_rows_in_bf16(models, fixed_rows, monkeypatch, beam_size):
    """bf16 (its exact re-scoring and the fp32 settling of near-ties) gives the same captions either way."""
    model, vocab, feats = models["soft"]
    cfg = DecodeConfig(beam_size=beam_size, max_len=ref.MAX_LEN, length_norm=1.0, precision="bf16")
    fixed = beam_search(model, feats, vocab, cfg)
    monkeypatch.setattr(beam, "_fixed_rows", lambda device: False)
    leaving = beam_search(model, feats, vocab, cfg)
    for a, b in zip(fixed, leaving):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


@pytest.mark.parametrize("case", SEARCHED, ids=_ids)
def test_steps_replayed_over_static_buffers_give_the_recorded_results(models, case):
    """``graph="on"``: steps 1… as one function over static buffers (a GPU replays it as a CUDA graph), batched
    and one image at a time."""
    if case["model"] not in models:
        pytest.skip("checkpoints/shapes_soft is not shipped")
    feats = models[case["model"]][2]
    recorded = RECORDED[ref.case_name(case)]
    for i, (hyps, rec) in enumerate(zip(ref.run_case(case, models, graph="on"), recorded)):
        _check(hyps, rec, f"image {i}, replayed")
    for i, rec in enumerate(recorded[:2]):
        alone = ref.run_case(case, models, Annotations(feats.feats[i : i + 1], feats.grid), graph="on")
        _check(alone[0], rec, f"image {i} alone, replayed")


def test_rewriting_the_reference_keeps_a_tiny_case_only_while_the_search_agrees_with_it():
    """``python -m tests.beam_reference`` keeps a recorded case whose new results differ by rounding alone, and
    writes anew one whose tokens or numbers moved past the test's tolerance."""
    recorded = RECORDED["model=soft-beam_size=3-length_norm=0.0"]
    rounded = json.loads(json.dumps(recorded))
    rounded[0][0]["logprob"] += 2e-6
    assert ref.agrees(recorded, rounded)
    for change in ({"logprob": recorded[0][0]["logprob"] + 1e-4}, {"tokens": [*recorded[0][0]["tokens"], 4]},
                   {"finished": not recorded[0][0]["finished"]}):
        moved = json.loads(json.dumps(recorded))
        moved[0][0].update(change)
        assert not ref.agrees(recorded, moved), change
    assert not ref.agrees(recorded, recorded[:-1])  # an image fewer
