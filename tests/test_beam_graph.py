"""One beam step at a fixed row count, replayed over static buffers for a whole decode, gives beam_search's
hypotheses: on a CPU as a plain function, on a GPU captured once as a CUDA graph and replayed (what a graph or
``torch.compile(mode="reduce-overhead")`` needs: the same tensors in and out at every step, no host copy)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from sat_core.config import DecodeConfig
from sat_core.decoding import beam, beam_search
from sat_core.decoding.steps import suppressed, top_log_probs
from sat_core.models.encoder import Annotations
from sat_core.precision import autocast
from tests import beam_reference as ref

Step = Callable[[], tuple[torch.Tensor, ...]]


def eager(step: Step, restore: Callable[[], None]) -> Step:
    return step


def cuda_graph(step: Step, restore: Callable[[], None]) -> Step:
    """``step`` captured once; each call replays it and returns the graph's own output tensors."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture stream, as torch.cuda.graph asks
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    restore()  # the warm-up really ran: undo what it recorded

    def replay() -> tuple[torch.Tensor, ...]:
        graph.replay()
        return outputs

    return replay


@torch.no_grad()
def replayed_decode(model, feats: Annotations, vocab, cfg: DecodeConfig, capture) -> list:
    """beam_search (soft or expected attention, fp32) with every step after the first one function over
    static buffers, handed to ``capture`` once and then called until every image is done."""
    device, K, B = feats.feats.device, cfg.beam_size, feats.feats.shape[0]
    dec, end_id = model.eval().decoder, vocab.end_id
    n_top = min(2 * K, len(vocab))
    banned = torch.tensor(suppressed(vocab, cfg, 1), device=device)
    trace, ends, active = beam._Trace(), beam._Ends.empty(B, K, device), torch.arange(B, device=device)
    with autocast(device, "fp32", cache=False):
        prep, h, c = dec.prepare(feats.feats)
        out = dec.step(torch.full((B,), vocab.start_id, device=device), h, c, prep)  # t = 0: one row per image
        first = torch.tensor(suppressed(vocab, cfg, 0), device=device)
        words_, logp = top_log_probs(model, out, first, n_top)
        rows, words, scores = beam._select(logp, words_, K, end_id, 0, ends, active)
        trace.alphas.append(out.alpha), trace.betas.append(out.beta), trace.locations.append(out.location)
        trace.parents.append(rows), trace.words.append(words)
        static = {"tokens": words.clone(), "h": out.h[rows], "c": out.c[rows], "scores": scores,  # our own buffers
                  "t": torch.ones((), dtype=torch.long, device=device)}

        def step() -> tuple[torch.Tensor, ...]:
            o = dec.step(static["tokens"], static["h"], static["c"], prep)  # (B·K, …) at every step
            row_words, lp = top_log_probs(model, o, banned, n_top)
            r, w, s = beam._select(lp + static["scores"].view(-1, 1), row_words, K, end_id, static["t"], ends, active)
            return o.alpha, o.beta, o.location, r, w, s, o.h[r], o.c[r]

        state = (ends.t, ends.row, ends.logprob, ends.count, ends.done)
        saved = [x.clone() for x in state]
        restore = lambda: [x.copy_(y) for x, y in zip(state, saved)]  # noqa: E731
        run, at_cap = capture(step, restore), False
        for t in range(1, cfg.max_len):
            static["t"].fill_(t)
            alpha, beta, loc, r, w, s, h, c = (x.clone() for x in run())
            trace.alphas.append(alpha), trace.betas.append(beta), trace.locations.append(loc)
            if bool(ends.done.all()):
                break
            trace.parents.append(r), trace.words.append(w)
            for name, value in (("tokens", w), ("h", h), ("c", c), ("scores", s)):
                static[name].copy_(value)
        else:
            at_cap = not bool(ends.done.all())
    last = beam._Last(active, static["scores"], at_cap=at_cap or cfg.max_len == 1)
    return beam._results(ends, trace, last, vocab, feats.grid, cfg)


def _same(replayed, searched, tolerance: float = 1e-5) -> None:
    for a, b in zip(replayed, searched):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.finished for h in a] == [h.finished for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=tolerance)


@pytest.mark.parametrize("length_norm", [0.0, 1.0])
@pytest.mark.parametrize("beam_size", [1, 3, 5])
def test_a_step_over_static_buffers_replayed_gives_the_searched_hypotheses(monkeypatch, beam_size, length_norm):
    monkeypatch.setattr(beam, "_fixed_rows", lambda device: True)
    model, vocab, feats = ref.tiny_model("soft"), ref.tiny_vocab(), ref.tiny_annotations()
    cfg = DecodeConfig(beam_size=beam_size, max_len=ref.MAX_LEN, length_norm=length_norm, precision="fp32")
    _same(replayed_decode(model, feats, vocab, cfg, eager), beam_search(model, feats, vocab, cfg))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("beam_size", [1, 3, 5])
def test_a_cuda_graph_of_one_step_serves_the_whole_decode(beam_size):
    model, vocab = ref.tiny_model("soft").cuda(), ref.tiny_vocab()
    cpu = ref.tiny_annotations()
    feats = Annotations(cpu.feats.cuda(), cpu.grid)
    for length_norm in (0.0, 1.0):
        cfg = DecodeConfig(beam_size=beam_size, max_len=ref.MAX_LEN, length_norm=length_norm, precision="fp32")
        searched = beam_search(model, feats, vocab, cfg)
        _same(replayed_decode(model, feats, vocab, cfg, cuda_graph), searched)
        _same(searched, beam_search(model.cpu(), cpu, vocab, cfg), 1e-4)  # the GPU's search is the CPU's
        model.cuda()
