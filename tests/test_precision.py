"""The precision switch: auto detects bf16 hardware; bf16 paths run on CPU (the CUDA ones, minus the GPU).

Every bf16 test here forces ``precision="bf16"``, so it runs on any CPU (slowly where bf16 is emulated)
and exercises the code a GPU would run under autocast: hard attention's sampled context, (h, c) kept
in fp32, weights and optimizer state in fp32, the loss in fp32.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from sat_core import precision
from sat_core.config import DecodeConfig, HardAttentionConfig, TrainConfig
from sat_core.decoding import DecodeSession, beam_search, sample_hard, score_caption
from sat_core.errors import SatError
from sat_core.training.losses import MovingBaseline, caption_loss
from sat_core.models.attention import attend
from sat_core.models.captioner import Captioner
from tests.conftest import tiny_config
from tests.test_decoding import _images, _peaked_model


@pytest.mark.parametrize("flags, vendor, expected", [
    ({"avx512f", "avx512_bf16"}, "AuthenticAMD", "bf16"),  # Zen 4: bf16 products measured 2.4× fp32
    ({"avx512f", "avx512_bf16"}, "GenuineIntel", "fp32"),  # Xeon with AMX hidden: measured 0.5–0.75×
    ({"amx_bf16", "amx_tile", "avx512_bf16"}, "GenuineIntel", "bf16"),
    ({"avx2", "avx512f"}, "AuthenticAMD", "fp32"), (set(), "", "fp32")])
def test_auto_follows_the_cpu_flags_and_vendor(monkeypatch, flags, vendor, expected):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(precision, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(precision, "cuda_has_bf16", lambda: True)
    assert precision.resolve("cpu", "auto") == expected
    assert precision.resolve("cuda", "auto") == "bf16"
    assert precision.resolve("cpu", "fp32") == "fp32" and precision.resolve("cpu", "bf16") == "bf16"
    assert precision.describe_cpu().endswith(f"auto = {expected}")


def test_cpu_flags_and_vendor_are_read_not_guessed():
    with open("/proc/cpuinfo") as f:
        text = f.read()
    has = " avx512_bf16" in text or " amx_bf16" in text
    assert precision.cpu_has_bf16() == has
    vendor = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("vendor_id")), "")
    assert precision.cpu_vendor() == vendor


def test_unknown_precision_is_refused():
    with pytest.raises(SatError, match="precision must be one of"):
        precision.resolve("cpu", "fp16")
    with pytest.raises(SatError, match="precision"):
        DecodeConfig(precision="half")
    with pytest.raises(SatError, match="precision"):
        TrainConfig(precision="fp8")


def test_autocast_switches_matrix_products_only():
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    with precision.autocast("cpu", "bf16") as used:
        assert used == "bf16"
        assert (x @ w).dtype == torch.bfloat16
        assert torch.softmax(x, 1).dtype == torch.float32
    with precision.autocast("cpu", "fp32") as used:
        assert used == "fp32" and (x @ w).dtype == torch.float32


def test_strict_fp32_turns_tf32_off_inside_the_block_and_restores_it():
    backends = torch.backends
    saved = backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32
    try:
        backends.cudnn.allow_tf32 = backends.cuda.matmul.allow_tf32 = True
        with precision.strict_fp32():
            assert (backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32) == (False, False)
        assert (backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32) == (True, True)
        with pytest.raises(RuntimeError), precision.strict_fp32():
            raise RuntimeError("inside")
        assert (backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32) == (True, True)
    finally:
        backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp32_on_cuda_runs_without_tf32():
    with precision.autocast("cuda", "fp32") as resolved:
        assert resolved == "fp32"
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32


def test_old_train_configs_with_amp_still_load():
    assert TrainConfig.from_dict({"amp": True}).precision == "auto"
    assert TrainConfig.from_dict({"amp": False}).precision == "fp32"


def test_hard_attention_samples_under_autocast():
    """The sampled context row must take the annotation in the context's dtype (index_put used to fail)."""
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(2, 5, 4)  # (B, L, D)
    alpha = torch.softmax(torch.randn(4, 5, generator=g), 1)  # (N = 2 images × 2 rows, L)
    sample = torch.tensor([True, False, False, True])
    for given in (feats, feats.bfloat16()):  # fp32 annotations: the bf16 context used to refuse them
        with precision.autocast("cpu", "bf16"):
            ctx, loc, logp = attend(given, alpha, sample=sample, generator=g)
        assert ctx.dtype == torch.bfloat16 and loc[1] == -1 and loc[2] == -1
        assert torch.equal(ctx[0], feats[0, loc[0]].bfloat16()) and torch.equal(ctx[3], feats[1, loc[3]].bfloat16())
        assert logp.dtype == torch.float32 and logp[0] == pytest.approx(float(torch.log(alpha[0, loc[0]])))


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_bf16_training_step_on_cpu(vocab, attention):
    """Forward + loss under bf16 autocast, backward and Adam outside: fp32 weights, grads, state and loss."""
    torch.manual_seed(0)
    every_row_samples = HardAttentionConfig(mix_soft_prob=0.0)
    model = Captioner(tiny_config(len(vocab), attention=attention, dropout=0.1, hard=every_row_samples)).train()
    optimizer = torch.optim.Adam(model.decoder.parameters(), lr=1e-2)
    images = _images(3)
    captions = torch.tensor([[1, 4, 5, 8, 2], [1, 4, 6, 2, 0], [1, 7, 2, 0, 0]])  # (B, T+1)
    before = {k: v.clone() for k, v in model.decoder.state_dict().items()}
    hard = every_row_samples if attention == "hard" else None
    baseline = MovingBaseline(0.9)
    losses = []
    for _ in range(3):
        with precision.autocast("cpu", "bf16"):
            out = model(images, captions, generator=torch.Generator().manual_seed(1))
            parts = caption_loss(out, captions[:, 1:], dsa_lambda=0.0 if hard else 1.0, hard=hard, baseline=baseline)
        assert out.logits.dtype == torch.bfloat16 and out.alphas.dtype == torch.float32
        assert parts.total.dtype == torch.float32 and torch.isfinite(parts.total)
        optimizer.zero_grad()
        parts.total.backward()
        optimizer.step()
        losses.append(parts.nll)
    if attention == "hard":
        assert bool(out.sampled.all()) and parts.reinforce != 0.0 and baseline.value is not None
        assert torch.all(out.log_p_loc[captions[:, 1:] != 0] < 0)  # locations were sampled
    for name, p in model.decoder.named_parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32, name
    assert all(v.dtype == torch.float32 for s in optimizer.state.values() for v in s.values() if v.dim())
    assert any(not torch.equal(before[k], v) for k, v in model.decoder.state_dict().items())
    assert losses[-1] < losses[0]  # the likelihood improves in bf16


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_recurrent_state_stays_fp32_under_bf16(vocab, attention):
    torch.manual_seed(0)
    model = Captioner(tiny_config(len(vocab), attention=attention)).eval()
    with torch.no_grad(), precision.autocast("cpu", "bf16"):
        feats = model.encode(_images(2)).feats
        prep, h, c = model.decoder.prepare(feats)
        assert prep.feats.dtype == torch.bfloat16  # cast once per image, here
        assert prep.proj.dtype == torch.float32 and h.dtype == c.dtype == torch.float32
        for t in range(3):
            out = model.decoder.step(torch.full((2,), vocab.start_id), h, c, prep,
                                     sample=torch.ones(2, dtype=torch.bool))
            h, c = out.h, out.c
            assert h.dtype == c.dtype == out.alpha.dtype == torch.float32
            torch.testing.assert_close(out.alpha.sum(1), torch.ones(2))


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_bf16_decoding_matches_fp32_on_a_clear_model(vocab, attention):
    """Beam search, sessions, scoring and sampling in bf16: same words as fp32 where the model is sure."""
    model = _peaked_model(vocab, attention=attention)
    images = _images(3)
    fp32 = beam_search(model, images, vocab, DecodeConfig(beam_size=3, max_len=12, precision="fp32"))
    bf16 = beam_search(model, images, vocab, DecodeConfig(beam_size=3, max_len=12, precision="bf16"))
    for a, b in zip(fp32, bf16):
        assert a[0].tokens == b[0].tokens
        assert b[0].logprob == pytest.approx(a[0].logprob, abs=0.05)
        np.testing.assert_allclose(b[0].alphas.sum(1), 1.0, atol=1e-5)
        np.testing.assert_allclose(b[0].alphas, a[0].alphas, atol=0.02)
    session = DecodeSession(model, vocab, images[0], DecodeConfig(max_len=12, precision="bf16"))
    session.run()
    greedy = beam_search(model, images[:1], vocab, DecodeConfig(beam_size=1, max_len=12, precision="bf16"))[0][0]
    assert [s.token for s in session.steps] == greedy.tokens
    scored = score_caption(model, vocab, images[0], greedy.words, precision="bf16")
    assert scored.logprob == pytest.approx(greedy.logprob, abs=0.05)
    if attention == "hard":
        cfg = DecodeConfig(max_len=12, precision="bf16")
        x = sample_hard(model, vocab, images[0], 3, seed=4, cfg=cfg)
        y = sample_hard(model, vocab, images[0], 3, seed=4, cfg=cfg)
        assert [h.tokens for h in x] == [h.tokens for h in y] and all(np.all(h.locations >= 0) for h in x)


def test_lean_teacher_forcing_gives_the_step_by_step_logits(vocab):
    """Captioner.forward's lean pass (embedding, deep output and the embedding's LSTM share over all
    B·T rows at once) against T calls of Decoder.step, for soft and for hard attention with samples."""
    captions = torch.tensor([[1, 4, 5, 8, 2, 0], [1, 4, 6, 9, 10, 2], [1, 7, 2, 0, 0, 0]])  # (B, T+1)
    for attention in ("soft", "hard"):
        torch.manual_seed(0)
        model = Captioner(tiny_config(len(vocab), attention=attention)).eval()
        dec = model.decoder
        with torch.no_grad():
            feats = model.encode(_images(3)).feats
            tf = model(None, captions, feats=feats)
            prep, h, c = dec.prepare(feats)
            steps = []
            for t in range(captions.shape[1] - 1):
                out = dec.step(captions[:, t], h, c, prep)
                h, c = out.h, out.c
                steps.append(out)
            torch.testing.assert_close(tf.logits, torch.stack([s.logits for s in steps], 1), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(tf.alphas, torch.stack([s.alpha for s in steps], 1), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(tf.betas, torch.stack([s.beta for s in steps], 1))
            if attention == "hard":  # sampled locations: the same draws from the same generator
                sample = torch.tensor([True, False, True])
                prep, h0, c0 = dec.prepare(feats)
                lean = dec.teacher_forced(captions[:, :-1], h0, c0, prep, sample=sample,
                                          generator=torch.Generator().manual_seed(3))
                g, h, c, logits, log_p = torch.Generator().manual_seed(3), h0, c0, [], []
                for t in range(captions.shape[1] - 1):
                    out = dec.step(captions[:, t], h, c, prep, sample=sample, generator=g)
                    h, c = out.h, out.c
                    logits.append(out.logits)
                    log_p.append(out.log_p_loc)
                torch.testing.assert_close(lean[0], torch.stack(logits, 1), rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(lean[3], torch.stack(log_p, 1))
                assert torch.all(lean[3][1] == 0) and torch.all(lean[3][0] < 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_cuda_bf16_training_step_and_decode(vocab, attention):
    torch.manual_seed(0)
    model = Captioner(tiny_config(len(vocab), attention=attention)).cuda().train()
    captions = torch.tensor([[1, 4, 5, 2], [1, 7, 2, 0]], device="cuda")
    with precision.autocast("cuda", "auto"):
        out = model(_images(2).cuda(), captions)
        parts = caption_loss(out, captions[:, 1:], dsa_lambda=1.0,
                             hard=HardAttentionConfig() if attention == "hard" else None, baseline=MovingBaseline())
    parts.total.backward()
    assert torch.isfinite(parts.total)
    hyps = beam_search(model, _images(2).cuda(), vocab, DecodeConfig(beam_size=3, precision="auto"))
    assert all(len(h) == 3 for h in hyps)


# ---- near-ties settled in fp32 ----------------------------------------------------------------------

def test_near_ties_are_ranked_by_their_fp32_scores(vocab):
    from sat_core import decoding
    from sat_core.decoding import beam

    model = _peaked_model(vocab)
    feats = decoding.encode_images(model, _images(2), precision="fp32")
    cfg = DecodeConfig(beam_size=3, length_norm=1.0, precision="fp32", fp32_ties=0.05)
    exact = beam_search(model, feats, vocab, cfg)
    results = []
    for hyps in exact:
        a, b, c = hyps
        assert a.finished and b.finished and c.finished and a.score > b.score and a.tokens != b.tokens
        # as if bf16's rounding had put b just above a, and c far below both
        results.append([dataclasses.replace(b, score=a.score + 1e-4, logprob=0.0),
                        dataclasses.replace(a, logprob=0.0),
                        dataclasses.replace(c, score=c.score - 1.0, logprob=-99.0)])
    beam._settle_ties_in_fp32(model, vocab, feats.feats, results, cfg, None)
    for got, want in zip(results, exact):
        assert [h.tokens for h in got] == [h.tokens for h in want]
        assert [h.logprob for h in got[:2]] == pytest.approx([h.logprob for h in want[:2]], abs=1e-5)
        assert got[0].score == pytest.approx(want[0].logprob / len(want[0].tokens), abs=1e-6)
        assert got[2].logprob == -99.0  # outside the margin: not scored again


@pytest.mark.parametrize("precision, ties, hard_mode, settled", [
    ("bf16", 0.005, "expect", True), ("fp32", 0.005, "expect", False), ("bf16", 0.0, "expect", False),
    ("bf16", 0.005, "sample", False),
])
def test_ties_are_settled_only_for_bf16_searches(vocab, monkeypatch, precision, ties, hard_mode, settled):
    from sat_core.decoding import beam

    calls = []
    monkeypatch.setattr(beam, "_settle_ties_in_fp32", lambda *args: calls.append(args))
    model = _peaked_model(vocab, attention="hard")
    cfg = DecodeConfig(beam_size=3, precision=precision, fp32_ties=ties, hard_mode=hard_mode)
    beam_search(model, _images(2), vocab, cfg)
    assert len(calls) == int(settled)


@pytest.mark.parametrize("device, has_bf16, asked, expected, scaler", [
    ("cuda", False, "auto", "fp16", True),  # a GPU without bf16 (V100, T4): fp16 behind a gradient scaler
    ("cuda", True, "auto", "bf16", False),
    ("cuda", True, "fp16", "fp16", True),
    ("cuda", False, "fp32", "fp32", False),
    ("cpu", False, "auto", None, False),  # a CPU keeps bf16 or fp32, as resolve() says
    ("cpu", False, "bf16", "bf16", False),
])
def test_training_runs_fp16_with_a_scaler_only_on_a_cuda_gpu_without_bf16_or_when_asked(
        monkeypatch, device, has_bf16, asked, expected, scaler):
    monkeypatch.setattr(precision, "cuda_has_bf16", lambda: has_bf16)
    resolved = precision.resolve_training(device, asked)
    assert resolved == (expected or precision.resolve(device, asked))
    if device == "cpu" or not torch.cuda.is_available():  # building a CUDA scaler needs no GPU, only the type
        assert (precision.grad_scaler(device, resolved) is not None) is scaler
    if device == "cuda":  # decoding never runs fp16: bf16 where the GPU has it, else fp32
        assert precision.resolve(device, "auto") == ("bf16" if has_bf16 else "fp32")


def test_fp16_training_on_a_cpu_is_refused_with_what_to_use():
    with pytest.raises(SatError, match="--precision fp16 trains on a CUDA GPU only.*bf16, fp32 or auto"):
        precision.resolve_training("cpu", "fp16")
    with pytest.raises(SatError, match="precision must be one of"):
        precision.resolve_training("cpu", "fp8")
