"""A training step over 512 captions gives the gradients of the same captions taken 32 at a time and accumulated:
the loss is a sum over the batch divided by its words, so chunk i's gradient counts words_i / words of the whole.
Holds the teacher-forced pass and the loss (and the fused CPU loops they use) free of anything that depends on the
batch's size: per-caption feats, and captions grouped four to an image (``--batching image``)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from sat_core.data.vocab import Vocab
from sat_core.models.captioner import Captioner
from sat_core.training.losses import caption_loss
from tests.conftest import tiny_config

LARGE, SMALL, PER_IMAGE, V, T = 512, 32, 4, 40, 9


def _captions(n: int) -> torch.Tensor:
    """<start> w_1 … <end> <pad>…: lengths 2 to T words, so chunks differ in their numbers of words."""
    g = torch.Generator().manual_seed(1)
    captions = torch.randint(4, V, (n, T + 2), generator=g)  # (B, T+1)
    lengths = torch.randint(2, T + 1, (n,), generator=g)
    captions[:, 0] = Vocab.start_id
    for i, n_words in enumerate(lengths.tolist()):
        captions[i, n_words + 1] = Vocab.end_id
        captions[i, n_words + 2 :] = Vocab.pad_id
    return captions


def _gradients(model: Captioner, feats, captions, image_index, weight: float = 1.0) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    out = model(None, captions, feats=feats, image_index=image_index)
    parts = caption_loss(out, captions[:, 1:], dsa_lambda=1.0)
    (weight * parts.total).backward()
    return {name: p.grad.clone() for name, p in model.decoder.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("grouped", [False, True], ids=["per-caption", "four-captions-an-image"])
def test_a_large_batch_step_has_the_gradients_of_small_batches_accumulated(grouped):
    torch.manual_seed(0)
    model = Captioner(tiny_config(V, feature_dim=24, small_channels=(8, 16, 24))).train()
    captions = _captions(LARGE)
    images = LARGE // PER_IMAGE if grouped else LARGE
    feats = torch.randn(images, 16, 24, generator=torch.Generator().manual_seed(2))  # (U, L, D)
    index = torch.arange(LARGE) // PER_IMAGE if grouped else None  # (B,) adjacent captions share an image
    large = _gradients(model, feats, captions, index)
    words = (captions[:, 1:] != Vocab.pad_id).sum()
    accumulated: dict[str, torch.Tensor] = {}
    for start in range(0, LARGE, SMALL):
        chunk = captions[start : start + SMALL]
        share = float((chunk[:, 1:] != Vocab.pad_id).sum() / words)
        if grouped:
            first = start // PER_IMAGE
            part = _gradients(model, feats[first : first + SMALL // PER_IMAGE], chunk,
                              torch.arange(SMALL) // PER_IMAGE, share)
        else:
            part = _gradients(model, feats[start : start + SMALL], chunk, None, share)
        for name, g in part.items():
            accumulated[name] = accumulated.get(name, 0) + g
    assert large.keys() == accumulated.keys() and len(large) > 5
    scale = max(float(g.abs().max()) for g in large.values())  # f_att's w.bias has no gradient but rounding
    for name, g in large.items():
        torch.testing.assert_close(accumulated[name], g, rtol=1e-4, atol=1e-6 * scale, msg=name)


def test_the_comparison_sees_a_wrong_weighting():
    """Chunks weighted equally (not by their words) give other gradients: the test above can fail."""
    torch.manual_seed(0)
    model = Captioner(tiny_config(V, feature_dim=24, small_channels=(8, 16, 24))).train()
    captions = _captions(2 * SMALL)
    feats = torch.randn(2 * SMALL, 16, 24, generator=torch.Generator().manual_seed(2))
    large = _gradients(model, feats, captions, None)
    halves = [_gradients(model, feats[i : i + SMALL], captions[i : i + SMALL], None, 0.5) for i in (0, SMALL)]
    name = "L_o.weight"
    assert float((large[name] - halves[0][name] - halves[1][name]).abs().max()) > 1e-4 * float(large[name].abs().max())


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_a_compiled_recurrence_gives_the_eager_loss_and_gradients(attention):
    """``Decoder.compile_recurrence``: traced by TorchDynamo and AOTAutograd (``aot_eager``: the compiler's
    graphs, run without code generation, so no C compiler is needed) at two caption lengths. On a GPU the
    trainer's ``--compile`` hands the same graphs to Inductor."""
    torch.manual_seed(0)
    eager = Captioner(tiny_config(V, attention=attention, feature_dim=24, small_channels=(8, 16, 24))).train()
    compiled = Captioner(tiny_config(V, attention=attention, feature_dim=24, small_channels=(8, 16, 24))).train()
    compiled.load_state_dict(eager.state_dict())
    compiled.decoder.compile_recurrence(backend="aot_eager")
    counters.clear()
    for p in (eager, compiled):
        p.decoder.dropout.p = 0.0  # dropout's draws would differ between the two
    feats = torch.randn(SMALL, 16, 24, generator=torch.Generator().manual_seed(2))
    for length in (T, T - 3):
        captions = _captions(SMALL)[:, : length + 2]
        captions[:, -1] = torch.where(captions[:, -1] == Vocab.pad_id, Vocab.pad_id, Vocab.end_id)
        torch.manual_seed(3)  # the same hard-attention draws
        ref = _gradients(eager, feats, captions, None)
        torch.manual_seed(3)
        got = _gradients(compiled, feats, captions, None)
        assert ref.keys() == got.keys() and len(ref) > 5
        for name, g in ref.items():
            torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert counters["stats"]["unique_graphs"] >= 1
    if attention == "soft":  # hard attention's draw asks the host whether any row samples: a break there
        assert not counters["graph_break"], dict(counters["graph_break"])
