"""The fused CPU loops (sat_core/native): the same values as the PyTorch code they replace, and a clean fallback."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sat_core import native
from sat_core.config import DecodeConfig
from sat_core.decoding import beam_search
from sat_core.decoding.steps import top_log_probs as _top_log_probs
from sat_core.models.attention_fast import _scores
from sat_core.models.captioner import Captioner
from tests.conftest import tiny_config

needs_native = pytest.mark.skipif(not native.available(), reason="no C compiler here: the PyTorch code runs")
ROOT = Path(__file__).resolve().parents[1]


@needs_native
@pytest.mark.parametrize("B, k, L, A", [(3, 5, 196, 512), (2, 1, 7, 13), (1, 3, 49, 100)])
def test_attention_scores_equal_the_pytorch_block(B, k, L, A):
    g = torch.Generator().manual_seed(B * k + A)
    proj = 3 * torch.randn(B, L, A, generator=g)
    wh = 3 * torch.randn(B, k, 1, A, generator=g)
    proj[0, 0, :4] = torch.tensor([-80.0, 80.0, -31.0, 31.0])  # beyond the clamp: σ is 0 or 1 to fp32
    w = torch.randn(A, generator=g)
    fused = native.attention_scores(proj, wh, w)
    eager = _scores(proj, wh, w, False, 4)
    assert fused.shape == (B, k, L)
    torch.testing.assert_close(fused, eager, rtol=0, atol=2e-5 * A ** 0.5)


@needs_native
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("B, k, L, A", [(3, 5, 196, 512), (2, 1, 7, 13)])
def test_attention_scores_backward_equals_autograd_of_the_block(B, k, L, A, accumulate):
    g = torch.Generator().manual_seed(B + k + A)
    proj = (3 * torch.randn(B, L, A, generator=g)).requires_grad_()
    wh = (3 * torch.randn(B, k, 1, A, generator=g)).requires_grad_()
    w = torch.randn(A, generator=g).requires_grad_()
    grad_e = torch.randn(B, k, L, generator=g)
    grad_e[0, 0, :3] = 0  # rows with no gradient still write their (zero) share
    (torch.sigmoid(proj.unsqueeze(1) + wh) @ w * grad_e).sum().backward()
    before = torch.randn(B, L, A, generator=g)
    buffer = before.clone()
    grad_wh, grad_w = native.attention_scores_backward(proj.detach(), wh.detach(), w.detach(), grad_e, buffer,
                                                       accumulate)
    tol = {"rtol": 1e-4, "atol": 1e-5 * L ** 0.5}
    torch.testing.assert_close(buffer, proj.grad + before if accumulate else proj.grad, **tol)
    torch.testing.assert_close(grad_wh, wh.grad.view(B, k, A), **tol)
    torch.testing.assert_close(grad_w, w.grad, rtol=1e-4, atol=1e-4 * (B * k * L) ** 0.5)
    with pytest.raises(ValueError, match="contiguous fp32"):
        native.attention_scores_backward(proj.detach(), wh.detach(), w.detach(), grad_e, buffer.double(), False)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 5])
def test_training_context_and_its_gradients_equal_bmm(dtype, k):
    """attend() under autograd on a CPU runs the context product in the fused loops: the same context and
    gradients as torch.bmm (α kept in fp32 where bmm rounds it to bf16: within bf16's rounding)."""
    from sat_core.models.attention import attend

    g = torch.Generator().manual_seed(k)
    B, L, D = 3, 49, 67
    feats = torch.randn(B, L, D, generator=g).to(dtype).requires_grad_()
    alpha = torch.softmax(torch.randn(B * k, L, generator=g), 1).requires_grad_()
    alpha.data[0, :5] = 0  # cells without attention are skipped, not lost
    weights = torch.randn(B * k, D, generator=g)
    results = []
    for switch in (contextlib.nullcontext, native.disabled):
        feats.grad = alpha.grad = None
        with switch():
            context = attend(feats, alpha)[0]
        (context.float() * weights).sum().backward()
        assert context.dtype == dtype and context.shape == (B * k, D)
        results.append((context.float().detach(), alpha.grad.clone(), feats.grad.float().clone()))
    tol = {"rtol": 0, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for fused, plain in zip(*results):
        assert fused.abs().max() > 0
        torch.testing.assert_close(fused, plain, **tol)
    # The gradient for α is exact in the loops (fp32 sums of the bf16 values), where bmm rounds it;
    # the context's gradient arrives in the context's dtype.
    grad = weights.view(B, k, D).to(dtype).float()
    exact = torch.einsum("bld,bkd->bkl", feats.detach().float(), grad).reshape(B * k, L)
    torch.testing.assert_close(results[0][1], exact, rtol=1e-5, atol=1e-4)


@needs_native
@pytest.mark.parametrize("V", [500, 5000])  # 5000: a row read in three pieces, its max found in the last
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_words_are_torch_topk_without_the_banned_and_the_normaliser_is_logsumexp(dtype, V):
    g = torch.Generator().manual_seed(0)
    N, n = 6, 7
    logits = (4 * torch.randn(N, V, generator=g)).to(dtype)
    banned = torch.zeros(V, dtype=torch.bool)
    banned[[0, 2, 3]] = True
    logits[1, 2] = 50.0  # a banned word that would win: never chosen, still in the normaliser
    logits[4, V - 1] = 40.0  # the row's max in its last word
    top, words, row_max, total = native.top_words(logits, banned, n)
    allowed = logits.float().masked_fill(banned, -float("inf"))
    ref_top, ref_words = allowed.topk(n, dim=1)
    assert torch.equal(top, ref_top)
    assert not banned[words].any()
    assert torch.equal(logits.float().gather(1, words), top)  # each value is its word's
    if dtype == torch.float32:  # no ties: the same words in the same order
        assert torch.equal(words, ref_words)
    assert row_max[1] == 50.0 and row_max[4] == 40.0 and words[4, 0] == V - 1
    lse = torch.logsumexp(logits.float().double(), 1)
    torch.testing.assert_close(row_max.double() + total.log(), lse, rtol=0, atol=1e-5)


@needs_native
def test_top_words_pad_with_minus_infinity_past_the_allowed_words():
    logits = torch.tensor([[1.0, 5.0, 3.0, 2.0]])
    banned = torch.tensor([False, True, False, True])
    top, words, _, _ = native.top_words(logits, banned, 3)
    assert top[0, :2].tolist() == [3.0, 1.0] and words[0, :2].tolist() == [2, 0]
    assert top[0, 2] == -float("inf")


@needs_native
def test_exact_logits_equal_the_gathered_product_and_refuse_bad_ids():
    g = torch.Generator().manual_seed(1)
    W, b, x = torch.randn(40, 24, generator=g), torch.randn(40, generator=g), torch.randn(5, 24, generator=g)
    words = torch.randint(0, 40, (5, 3), generator=g)
    expect = (W[words] * x.unsqueeze(1)).sum(2) + b[words]
    torch.testing.assert_close(native.exact_logits(W, b, x, words), expect, rtol=0, atol=1e-5)
    with pytest.raises(IndexError, match=r"\[0, 40\)"):
        native.exact_logits(W, b, x, torch.full((5, 3), 40))


def _random_model(vocab, attention):
    torch.manual_seed(5)
    return Captioner(tiny_config(len(vocab), attention=attention)).eval()


@needs_native
@pytest.mark.parametrize("attention", ["soft", "hard"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_beam_search_gives_the_same_captions_with_and_without_the_fused_loops(vocab, attention, precision):
    model = _random_model(vocab, attention)
    images = torch.randn(6, 3, 112, 112, generator=torch.Generator().manual_seed(2))
    cfg = DecodeConfig(beam_size=3, max_len=8, length_norm=1.0, precision=precision)
    fused = beam_search(model, images, vocab, cfg)
    with native.disabled():
        assert not native.available()
        eager = beam_search(model, images, vocab, cfg)
    for f, e in zip(fused, eager):
        assert [h.tokens for h in f] == [h.tokens for h in e]
        assert [h.score for h in f] == pytest.approx([h.score for h in e], abs=1e-4)
        for hf, he in zip(f, e):
            assert abs(hf.alphas - he.alphas).max() < 1e-5


@needs_native
def test_fused_top_log_probs_equal_the_pytorch_ones_under_bf16(vocab):
    model = _random_model(vocab, "soft")
    feats = model.encode(torch.randn(4, 3, 112, 112)).feats
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        prep, h, c = model.decoder.prepare(feats)
        out = model.decoder.step(torch.full((4,), vocab.start_id), h, c, prep)
    assert out.logits.dtype == torch.bfloat16
    banned = torch.tensor([vocab.pad_id, vocab.start_id])
    words, logp = _top_log_probs(model, out, banned, 5)
    with native.disabled():
        ref_words, ref_logp = _top_log_probs(model, out, banned, 5)
    assert torch.equal(words, ref_words)
    torch.testing.assert_close(logp, ref_logp, rtol=0, atol=1e-5)


def _python(code: str, **env: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_switched_off_or_without_a_compiler_the_pytorch_code_runs(tmp_path):
    probe = "from sat_core import native; print(native.available())"
    assert _python(probe, SAT_NATIVE="0") == "False"
    missing = str(tmp_path / "no-such-compiler")
    assert _python(probe, CC=missing, SAT_NATIVE_CACHE=str(tmp_path / "cache")) == "False"
    # and decoding still works there
    code = ("import torch; from sat_core.config import DecodeConfig; from sat_core.decoding import beam_search; "
            "from sat_core.models.captioner import Captioner; from sat_core.data.vocab import Vocab; "
            "from tests.conftest import tiny_config; v = Vocab(['<pad>', '<start>', '<end>', '<unk>', 'a', 'b']); "
            "torch.manual_seed(0); m = Captioner(tiny_config(len(v))).eval(); "
            "print(len(beam_search(m, torch.randn(2, 3, 112, 112), v, DecodeConfig(beam_size=2, max_len=3))))")
    assert _python(code, SAT_NATIVE="0") == "2"


@needs_native
def test_the_library_is_built_once_into_its_cache(tmp_path):
    cache = tmp_path / "cache"
    probe = "from sat_core import native; print(native.available())"
    assert _python(probe, SAT_NATIVE_CACHE=str(cache)) == "True"
    built = list(cache.glob("fused-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    assert _python(probe, SAT_NATIVE_CACHE=str(cache)) == "True"
    assert [p.stat().st_mtime_ns for p in cache.glob("fused-*.so")] == [stamp]  # loaded, not rebuilt
