"""Beam search's steps after the first as one step over static buffers (``sat_core.decoding.graph``): on a CPU the
function called as it is (``graph="on"``), on a GPU captured once as a CUDA graph and replayed. Either way the
hypotheses are those of the step-by-step search; tests/test_beam_reference.py holds both to recorded results."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from sat_core.config import DecodeConfig
from sat_core.decoding import beam_search, graph
from sat_core.models.encoder import Annotations
from tests import beam_reference as ref


def _same(a_results, b_results, tolerance: float = 1e-5) -> None:
    assert len(a_results) == len(b_results)
    for a, b in zip(a_results, b_results):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.finished for h in a] == [h.finished for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=tolerance)
        for x, y in zip(a, b):
            torch.testing.assert_close(torch.from_numpy(x.alphas), torch.from_numpy(y.alphas), atol=1e-5, rtol=0)


def _rows_per_step(model, run) -> tuple[list[int], int]:
    """(rows of each step, StaticSteps calls) while ``run`` decodes."""
    rows, calls, step, static_call = [], [0], model.decoder.step, graph.StaticSteps.__call__

    def counting_step(tokens, *args, **kwargs):
        rows.append(tokens.shape[0])
        return step(tokens, *args, **kwargs)

    def counting_call(self):
        calls[0] += 1
        return static_call(self)

    model.decoder.step = counting_step
    graph.StaticSteps.__call__ = counting_call
    try:
        run()
    finally:
        del model.decoder.step
        graph.StaticSteps.__call__ = static_call
    return rows, calls[0]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("length_norm", [0.0, 1.0])
@pytest.mark.parametrize("beam_size", [1, 3, 5])
@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_replayed_steps_give_the_step_by_step_hypotheses(attention, beam_size, length_norm, precision):
    model, vocab, feats = ref.tiny_model(attention), ref.tiny_vocab(), ref.tiny_annotations()
    cfg = DecodeConfig(beam_size=beam_size, max_len=ref.MAX_LEN, length_norm=length_norm, precision=precision)
    stepwise = beam_search(model, feats, vocab, dataclasses.replace(cfg, graph="off"))
    results: list = []
    rows, calls = _rows_per_step(model, lambda: results.extend(beam_search(model, feats, vocab,
                                                                             dataclasses.replace(cfg, graph="on"))))
    B = feats.feats.shape[0]
    assert rows[0] == B and set(rows[1:]) == {B * beam_size}  # one row count from step 1: what a graph needs
    assert calls == len(rows) - 1 >= 1  # every step after the first was the static one
    _same(results, stepwise)


def test_a_kept_step_serves_the_next_decode_of_its_shape_with_new_annotations_and_weights():
    """The static buffers are reloaded for each decode, and the step reads the weights where they lie (an
    optimizer's in-place update between two validations is seen)."""
    model, vocab, feats = ref.tiny_model("soft"), ref.tiny_vocab(), ref.tiny_annotations()
    cfg = DecodeConfig(beam_size=3, max_len=ref.MAX_LEN, precision="fp32", graph="on")
    beam_search(model, feats, vocab, cfg)
    kept = dict(graph._CACHE[model])
    other = Annotations(feats.feats.flip(0) * 0.5, feats.grid)  # (B, L, D) other images, same shape
    _same(beam_search(model, other, vocab, cfg), beam_search(model, other, vocab, dataclasses.replace(cfg, graph="off")))
    with torch.no_grad():
        model.decoder.L_o.weight.mul_(-1.0)  # in place, as an optimizer step
    changed = beam_search(model, other, vocab, cfg)
    assert dict(graph._CACHE[model]) == kept  # the same static step served all three
    _same(changed, beam_search(model, other, vocab, dataclasses.replace(cfg, graph="off")))
    assert [h.tokens for h in changed[0]] != [h.tokens for h in beam_search(
        ref.tiny_model("soft"), other, vocab, dataclasses.replace(cfg, graph="off"))[0]]


def test_interventions_and_sampling_run_step_by_step_whatever_graph_says():
    import numpy as np

    from sat_core.decoding import Intervention

    model, vocab, feats = ref.tiny_model("hard"), ref.tiny_vocab(), ref.tiny_annotations()
    region = np.zeros(ref.GRID, dtype=bool)
    region[:2] = True
    for cfg, kwargs in ((DecodeConfig(beam_size=3, graph="on"), {"intervention": Intervention(region)}),
                        (DecodeConfig(beam_size=3, graph="on", hard_mode="sample", seed=2), {}),
                        (DecodeConfig(beam_size=1, graph="on"), {"sample_words": True})):
        rows, calls = _rows_per_step(model, lambda: beam_search(model, feats, vocab, cfg, **kwargs))
        assert calls == 0 and len(rows) >= 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("beam_size", [1, 3, 5])
def test_a_cuda_graph_of_one_step_serves_the_whole_decode(beam_size, precision):
    model, vocab = ref.tiny_model("soft").cuda(), ref.tiny_vocab()
    cpu = ref.tiny_annotations()
    feats = Annotations(cpu.feats.cuda(), cpu.grid)
    for length_norm in (0.0, 1.0):
        cfg = DecodeConfig(beam_size=beam_size, max_len=ref.MAX_LEN, length_norm=length_norm, precision=precision)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a refused capture warns: here it fails the test
            replayed = beam_search(model, feats, vocab, cfg)  # graph "auto": captured on a GPU
        assert graph._CACHE[model], "the decode was not captured"
        assert all(run is not steps for steps, run in graph._CACHE[model].values()), "a step ran uncaptured"
        _same(replayed, beam_search(model, feats, vocab, dataclasses.replace(cfg, graph="off")))
        again = Annotations(feats.feats.flip(0), feats.grid)
        _same(beam_search(model, again, vocab, cfg), beam_search(model, again, vocab, dataclasses.replace(cfg, graph="off")))
        if precision == "fp32":  # the GPU's search is the CPU's
            _same(replayed, beam_search(model.cpu(), cpu, vocab, cfg), 1e-4)
            model.cuda()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_refused_capture_warns_and_runs_the_step_uncaptured(monkeypatch):
    def refuse(steps):
        raise RuntimeError("capture refused")

    monkeypatch.setattr(graph, "captured", refuse)
    model, vocab, cpu = ref.tiny_model("soft").cuda(), ref.tiny_vocab(), ref.tiny_annotations()
    feats = Annotations(cpu.feats.cuda(), cpu.grid)
    cfg = DecodeConfig(beam_size=3, max_len=ref.MAX_LEN, precision="fp32")
    with pytest.warns(RuntimeWarning, match="could not capture"):
        replayed = beam_search(model, feats, vocab, cfg)
    _same(replayed, beam_search(model, feats, vocab, dataclasses.replace(cfg, graph="off")))
