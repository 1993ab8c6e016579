"""The model follows PAPER.md: shapes, α sums to 1, β in (0, 1), loss terms as specified."""

from __future__ import annotations

import threading

import pytest
import torch

from sat_core.config import ModelConfig
from sat_core.errors import SatError
from sat_core.models.attention import attend
from sat_core.models.captioner import Captioner
from sat_core.models.encoder import Encoder
from tests.conftest import tiny_config


def captions(batch: int, length: int, vocab_size: int) -> torch.Tensor:
    caps = torch.randint(4, vocab_size, (batch, length))
    caps[:, 0] = 1  # <start>
    caps[:, -1] = 2  # <end>
    return caps


def test_shapes_alpha_and_beta(tiny_model, vocab):
    images = torch.randn(3, 3, 112, 112)
    out = tiny_model(images, captions(5, 7, len(vocab)), image_index=torch.tensor([0, 0, 1, 2, 2]))
    assert out.logits.shape == (5, 6, len(vocab))
    assert out.alphas.shape == (5, 6, 14 * 14)
    assert tiny_model.encode(images).grid == (14, 14)
    assert torch.allclose(out.alphas.sum(-1), torch.ones(5, 6), atol=1e-5)
    if tiny_model.hard:
        assert torch.all(out.betas == 1.0)  # hard attention's context is one region, ungated
    else:
        assert torch.all((out.betas > 0) & (out.betas < 1))


def test_captions_of_one_image_share_its_annotations(vocab):
    torch.manual_seed(0)
    model = Captioner(tiny_config(len(vocab))).eval()
    images = torch.randn(2, 3, 112, 112)
    caps = captions(3, 5, len(vocab))
    shared = model(images, caps, image_index=torch.tensor([1, 0, 1]))
    repeated = model(images[[1, 0, 1]], caps)
    assert torch.allclose(shared.logits, repeated.logits, atol=1e-5)


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_grouped_captions_read_each_image_in_place_with_the_same_values_and_gradients(vocab, attention, monkeypatch):
    """--batching image gives k adjacent captions per image: the decoder then reads each image's
    projection in place (as beam search reads its beams'); losses and gradients equal the indexed copies."""
    from sat_core.models import captioner as captioner_module

    torch.manual_seed(0)
    model = Captioner(tiny_config(len(vocab), attention=attention)).train()
    images, caps = torch.randn(3, 3, 112, 112), captions(6, 5, len(vocab))
    grouped = torch.tensor([0, 0, 1, 1, 2, 2])
    assert captioner_module._grouped(grouped, 3)
    assert not captioner_module._grouped(torch.tensor([0, 1, 0, 1, 2, 2]), 3)
    assert not captioner_module._grouped(torch.tensor([0, 0, 0, 1, 1, 2]), 3)

    def run() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        out = model(images, caps, image_index=grouped, generator=torch.Generator().manual_seed(1))
        loss = out.logits.logsumexp(-1).sum() + (out.alphas ** 2).sum() + out.log_p_loc.sum()
        loss.backward()
        return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    torch.manual_seed(2)
    in_place, grads = run()
    monkeypatch.setattr(captioner_module, "_grouped", lambda *a: False)  # the per-caption copies
    torch.manual_seed(2)
    copied, ref_grads = run()
    torch.testing.assert_close(in_place, copied, rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys() and "decoder.attention.W_a.weight" in grads
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def test_hard_training_mixes_sampled_and_expected_examples(vocab):
    torch.manual_seed(0)
    model = Captioner(tiny_config(len(vocab), attention="hard")).train()
    out = model(torch.randn(64, 3, 112, 112), captions(64, 4, len(vocab)))
    frac = out.sampled.float().mean().item()
    assert 0.3 < frac < 0.7  # mix_soft_prob = 0.5
    assert torch.all(out.log_p_loc[out.sampled] < 0)  # log α of a sampled location
    assert torch.all(out.log_p_loc[~out.sampled] == 0)


def test_attend_soft_is_expectation_and_hard_picks_one_region():
    feats = torch.randn(2, 4, 3)
    alpha = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.0, 0.0, 1.0, 0.0]])
    ctx, loc, logp = attend(feats, alpha)
    assert torch.allclose(ctx, torch.einsum("bl,bld->bd", alpha, feats))
    assert torch.all(loc == -1) and torch.all(logp == 0)
    ctx, loc, logp = attend(feats, alpha, sample=torch.tensor([False, True]))
    assert loc.tolist() == [-1, 2]
    assert torch.allclose(ctx[1], feats[1, 2])
    assert logp[1].item() == pytest.approx(0.0)


def test_encoders_report_their_true_grid():
    vgg = Encoder(ModelConfig(encoder="vgg19", feature_dim=512, vocab_size=10))
    feats, grid = vgg(torch.randn(1, 3, 224, 224))
    assert grid == (14, 14) and feats.shape == (1, 196, 512)
    assert not any(p.requires_grad for p in vgg.parameters())  # frozen unless fine-tuned


def test_resnet_grid_is_not_upsampled():
    res = Encoder(ModelConfig(encoder="resnet101", feature_dim=2048, vocab_size=10))
    feats, grid = res(torch.randn(1, 3, 224, 224))
    assert grid == (7, 7) and feats.shape == (1, 49, 2048)


def test_missing_pretrained_weights_fail_fast_with_instructions(tmp_path, monkeypatch):
    from urllib.error import URLError

    def offline(url, **kwargs):
        raise URLError("name resolution failed")

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    with pytest.raises(SatError, match=r"could not be downloaded .*\(name resolution failed\).* copy it to"):
        Encoder(ModelConfig(encoder="vgg19", feature_dim=512, vocab_size=10, pretrained=True))


def test_pretrained_weights_are_downloaded_into_the_cache_when_the_machine_can(tmp_path, monkeypatch):
    import torchvision

    torch.manual_seed(5)
    reference = torchvision.models.resnet18().state_dict()
    fetched = []

    def download(url, **kwargs):  # what torch.hub does with a reachable URL: the file lands in the cache
        target = tmp_path / "hub" / "checkpoints" / url.rsplit("/", 1)[-1]
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.save(reference, target)
        fetched.append(url)

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", download)
    encoder = Encoder(ModelConfig(encoder="resnet18", feature_dim=512, vocab_size=10, pretrained=True))
    assert fetched == ["https://download.pytorch.org/models/resnet18-f37072fd.pth"]
    assert torch.equal(encoder.body[0].weight, reference["conv1.weight"])
    Encoder(ModelConfig(encoder="resnet18", feature_dim=512, vocab_size=10, pretrained=True))
    assert len(fetched) == 1  # the second time it comes from the cache


def test_bad_config_is_refused():
    with pytest.raises(SatError, match="ModelConfig.attention must be one of soft, hard, not .medium."):
        ModelConfig(attention="medium")
    with pytest.raises(SatError, match="Unknown ModelConfig field"):
        ModelConfig.from_dict({"hiden_dim": 3})


def test_each_encode_call_returns_its_own_grid_across_threads(tiny_model, vocab):
    """Threads serving different users share one model: each result carries the grid of its own images."""
    from sat_core.config import DecodeConfig
    from sat_core.decoding import beam_search

    sides = [112, 64, 96, 48]  # stride 8: grids 14, 8, 12 and 6
    start = threading.Barrier(len(sides))
    seen: dict[int, list] = {side: [] for side in sides}

    def work(side: int) -> None:
        start.wait()
        for _ in range(4):
            images = torch.randn(2, 3, side, side)
            annotations = tiny_model.encode(images)
            hyp = beam_search(tiny_model, images, vocab, DecodeConfig(beam_size=2, max_len=3))[0][0]
            seen[side].append((annotations.grid, annotations.feats.shape[1], hyp.grid, hyp.alphas.shape[1]))

    threads = [threading.Thread(target=work, args=(side,)) for side in sides]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for side, results in seen.items():
        g = side // 8
        assert results == [((g, g), g * g, (g, g), g * g)] * 4, (side, results)


def test_tutorial_variants_shapes_and_training(vocab):
    """The ModelConfig variants converted checkpoints need: vector gate, no deep output, pooled grid."""
    torch.manual_seed(0)
    config = tiny_config(len(vocab), gate_size="vector", deep_output=False, attention_activation="relu",
                         init_activation="none", pool_grid=5)
    model = Captioner(config)
    names = dict(model.named_parameters())
    assert "decoder.L_h.weight" not in names and "decoder.L_z.weight" not in names
    assert names["decoder.f_beta.weight"].shape == (16, 32)  # (D, n): one gate per feature
    assert names["decoder.L_o.weight"].shape == (len(vocab), 32)  # logits = L_o h_t
    images = torch.randn(2, 3, 112, 112)
    assert model.encode(images).grid == (5, 5)
    out = model(images, captions(2, 6, len(vocab)))
    assert out.logits.shape == (2, 5, len(vocab)) and out.alphas.shape == (2, 5, 25)
    assert torch.all((out.betas > 0) & (out.betas < 1))
    out.logits.logsumexp(-1).sum().backward()
    assert names["decoder.f_beta.weight"].grad.abs().sum() > 0


def test_default_model_is_unchanged_and_variants_change_the_computation(vocab):
    default = tiny_config(len(vocab))
    names = {k: tuple(v.shape) for k, v in Captioner(default).state_dict().items()}
    assert names["decoder.f_beta.weight"] == (1, 32) and names["decoder.L_o.weight"] == (len(vocab), 16)
    assert "decoder.L_h.weight" in names and not any("pool" in k for k in names)
    images = torch.randn(1, 3, 112, 112)

    def first_step(**variant):
        torch.manual_seed(0)  # the same weights: only the computation differs
        model = Captioner(tiny_config(len(vocab), **variant)).eval()
        with torch.no_grad():
            prep, h, c = model.decoder.prepare(model.encode(images).feats)
            out = model.decoder.step(torch.tensor([1]), h, c, prep)
        return h, out.alpha

    h_tanh, alpha_tanh = first_step()
    h_none, _ = first_step(init_activation="none")
    assert torch.equal(torch.tanh(h_none), h_tanh)  # f_init without tanh, same affine map
    h_relu, alpha_relu = first_step(attention_activation="relu")
    assert torch.equal(h_relu, h_tanh) and not torch.allclose(alpha_tanh, alpha_relu)


def test_tutorial_variants_lean_teacher_forcing_matches_steps(vocab):
    """Teacher forcing (grad path of attention) and step by step without grad (chunked path) agree."""
    torch.manual_seed(0)
    model = Captioner(tiny_config(len(vocab), gate_size="vector", deep_output=False, attention_activation="relu",
                                  init_activation="none")).eval()
    caps = captions(6, 5, len(vocab))
    feats = model.encode(torch.randn(6, 3, 112, 112)).feats.detach()
    tf = model(None, caps, feats=feats)  # gradients on
    with torch.no_grad():
        prep, h, c = model.decoder.prepare(feats)
        steps = []
        for t in range(caps.shape[1] - 1):
            out = model.decoder.step(caps[:, t], h, c, prep)
            h, c = out.h, out.c
            steps.append(out)
    torch.testing.assert_close(tf.alphas.detach(), torch.stack([s.alpha for s in steps], 1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tf.logits.detach(), torch.stack([s.logits for s in steps], 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tf.betas.detach(), torch.stack([s.beta for s in steps], 1))


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("k", [1, 3])
def test_attention_gradients_match_plain_autograd(activation, k, fused, monkeypatch):
    """The fast backend of f_att (the σ trick; a recomputing backward a few images at a time, the
    projection's gradient gathered over steps in one buffer; for tanh on a CPU, sat_core.native's loops)
    gives the plain equations' α and autograd's gradients."""
    import contextlib

    from sat_core import native
    from sat_core.models import attention_fast
    from sat_core.models.attention import AttentionMLP

    if fused and not native.available():
        pytest.skip("no C compiler here: the PyTorch code runs")
    def switch():
        return contextlib.nullcontext() if fused else native.disabled()

    torch.manual_seed(0)
    mlp = AttentionMLP(6, 5, 7, activation)
    monkeypatch.setattr(attention_fast, "CHUNK_IMAGES", 2)  # B = 5 images: chunks of 2, 2 and 1
    feats, h = torch.randn(5, 4, 6), torch.randn(5 * k, 5)
    weights = torch.randn(3, 5 * k, 4)

    grads = []
    for backend in ("fast", "plain"):
        mlp.backend = backend
        mlp.zero_grad()
        h_ = h.clone().requires_grad_()
        with switch():
            proj = mlp.project(feats)  # read by three steps, as in teacher forcing: their gradients add up
            alpha = torch.stack([mlp(proj, h_ * (t + 1)) for t in range(3)])
            (alpha * weights).sum().backward()
        grads.append([alpha.detach(), h_.grad, mlp.W_a.weight.grad, mlp.W_a.bias.grad, mlp.W_h.weight.grad,
                      mlp.w.weight.grad])
    for ours, ref in zip(*grads):
        assert ours.abs().max() > 0
        assert torch.allclose(ours, ref, atol=1e-5), (ours - ref).abs().max()


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_the_paper_s_equations_and_the_fast_backend_train_and_decode_alike(vocab, attention):
    """A whole model with f_att as plain PyTorch (eq. 4–5 as written) and with the fast backend: the same
    teacher-forced logits and gradients, and beam search finds the same captions with the same α."""
    from sat_core.config import DecodeConfig
    from sat_core.decoding import beam_search

    torch.manual_seed(0)
    model = Captioner(tiny_config(len(vocab), attention=attention)).eval()
    images, caps = torch.randn(2, 3, 112, 112), captions(4, 6, len(vocab))
    results = []
    for backend in ("fast", "plain"):
        model.decoder.attention.backend = backend
        model.zero_grad()
        out = model(images, caps, image_index=torch.tensor([0, 0, 1, 1]))
        out.logits.square().mean().backward()
        grads = [p.grad.clone() for p in model.decoder.parameters() if p.grad is not None]
        hyps = beam_search(model, images, vocab, DecodeConfig(beam_size=3, max_len=8, precision="fp32"))
        results.append((out.logits.detach(), grads, hyps))
    (logits, grads, hyps), (ref_logits, ref_grads, ref_hyps) = results
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-5)
    for ours, ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-6)
    for ours, ref in zip(hyps, ref_hyps):
        assert [h.tokens for h in ours] == [h.tokens for h in ref]
        for a, b in zip(ours, ref):
            assert abs(a.score - b.score) < 1e-5 and abs(a.alphas - b.alphas).max() < 1e-5


# ---- f_init ----------------------------------------------------------------------------------------

def test_the_initial_state_reads_the_mean_annotation(vocab):
    """c_0 = f_init,c(mean_i a_i), h_0 = f_init,h(mean_i a_i): annotations with the same mean start alike
    (one object's worth of features in one cell, or half of it in two), and others do not."""
    torch.manual_seed(0)
    model = Captioner(tiny_config(len(vocab))).eval()
    D = model.config.feature_dim
    one = torch.zeros(1, 64, D)
    one[0, 5] = 2.0
    two = torch.zeros(1, 64, D)
    two[0, 5] = two[0, 40] = 1.0
    other = torch.zeros(1, 64, D)
    other[0, 5, 0] = 3.0
    with torch.no_grad():
        _, h_one, c_one = model.decoder.prepare(one)
        _, h_two, c_two = model.decoder.prepare(two)
        _, h_other, _ = model.decoder.prepare(other)
    assert h_one.shape == (1, model.config.hidden_dim)
    assert torch.allclose(h_one, h_two) and torch.allclose(c_one, c_two)
    assert (h_one - h_other).abs().max() > 1e-3
    assert torch.allclose(h_one, model.decoder.init_h(one.mean(1)))
