"""Sampled captions through the one decode loop (``beam_search(..., sample_words=True)``): what self-critical
training draws. Each word comes from the step's distribution, the hypothesis' log p is that of the words drawn,
a seed repeats a draw, and no caption is empty."""

from __future__ import annotations

import pytest
import torch

from sat_core.config import DecodeConfig
from sat_core.decoding import beam_search
from sat_core.errors import SatError
from sat_core.models.encoder import Annotations

CFG = DecodeConfig(beam_size=1, max_len=6, precision="fp32")


def _annotations(model, n: int, seed: int = 0) -> Annotations:
    torch.manual_seed(seed)
    with torch.no_grad():
        one = model.encode(torch.randn(1, 3, 112, 112))
    return Annotations(one.feats.expand(n, -1, -1), one.grid)  # n rows of one image


def test_a_seed_repeats_a_draw_and_another_seed_draws_otherwise(tiny_model, vocab):
    inputs = _annotations(tiny_model, 8)
    draw = lambda seed: [h[0].tokens for h in beam_search(  # noqa: E731
        tiny_model, inputs, vocab, CFG, generator=torch.Generator().manual_seed(seed), sample_words=True)]
    assert draw(1) == draw(1)
    assert draw(1) != draw(2)
    assert len({tuple(t) for t in draw(1)}) > 1  # the rows of one image draw their own captions


def test_the_first_word_follows_the_model_s_distribution(tiny_model, vocab):
    """4,000 one-word draws for one image: each word's share is its probability among the words allowed."""
    n = 4000
    inputs = _annotations(tiny_model, n)
    hyps = beam_search(tiny_model, inputs, vocab, DecodeConfig(beam_size=1, max_len=1, precision="fp32"),
                       generator=torch.Generator().manual_seed(0), sample_words=True)
    counts = torch.bincount(torch.tensor([h[0].tokens[0] for h in hyps]), minlength=len(vocab)).float()
    with torch.no_grad():
        prep, h, c = tiny_model.decoder.prepare(inputs.feats[:1])
        out = tiny_model.decoder.step(torch.tensor([vocab.start_id]), h, c, prep)
    logits = out.logits[0].float().clone()
    logits[[vocab.pad_id, vocab.start_id, vocab.end_id, vocab.unk_id]] = -float("inf")  # never a first word
    p = torch.softmax(logits, 0)
    assert counts[[vocab.pad_id, vocab.start_id, vocab.end_id, vocab.unk_id]].sum() == 0
    assert (counts / n - p).abs().max() < 0.03


def test_a_sample_s_log_probability_is_its_words_and_no_caption_is_empty(tiny_model, vocab):
    """hypothesis.logprob = Σ_t log p(w_t) under the distribution drawn from (banned words left out): what a
    teacher-forced pass over the sample gives with the same words banned."""
    inputs = _annotations(tiny_model, 16)
    hyps = [h[0] for h in beam_search(tiny_model, inputs, vocab, CFG, generator=torch.Generator().manual_seed(3),
                                      sample_words=True)]
    assert all(len(h.words) >= 1 for h in hyps)
    T = max(len(h.tokens) for h in hyps)
    tokens = torch.tensor([h.tokens + [vocab.pad_id] * (T - len(h.tokens)) for h in hyps])  # (16, T)
    captions = torch.cat([torch.full((16, 1), vocab.start_id), tokens], 1)
    with torch.no_grad():
        logits = tiny_model(None, captions, feats=inputs.feats[:1], image_index=torch.zeros(16, dtype=torch.long)).logits
    logits[:, :, [vocab.pad_id, vocab.start_id, vocab.unk_id]] = -float("inf")
    logits[:, 0, vocab.end_id] = -float("inf")
    logp = torch.log_softmax(logits.float(), -1).gather(2, tokens.unsqueeze(2)).squeeze(2)
    forced = torch.where(tokens != vocab.pad_id, logp, 0.0).sum(1)
    assert [h.logprob for h in hyps] == pytest.approx(forced.tolist(), abs=1e-4)


def test_sampling_draws_one_caption_per_row(tiny_model, vocab):
    with pytest.raises(SatError, match="beam size 1"):
        beam_search(tiny_model, _annotations(tiny_model, 1), vocab, DecodeConfig(beam_size=2), sample_words=True)
