"""sat_core.convert sgrvinod: a checkpoint laid out as sgrvinod's tutorial writes it becomes a Captioner
that computes what the tutorial's model computes (features, α, logits, greedy captions).

The test writes that checkpoint itself: stand-ins for the tutorial's ``models.Encoder``, ``Attention`` and
``DecoderWithAttention`` (same attribute names, tiny sizes, a ResNet-18 body instead of ResNet-101), saved
whole with ``torch.save`` together with an optimizer, exactly as the tutorial's train.py saves them.
"""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from torch import nn

from sat_core.checkpoint import load_checkpoint
from sat_core.config import DecodeConfig
from sat_core.convert import main
from sat_core.decoding import beam_search
from sat_core.data.images import load_image, preprocess
from sat_core.data.vocab import SPECIALS

WORDS = ["a", "dog", "cat", "on", "the", "grass", "red", "ball", "with", "sitting", "man", "ride"]
D, A, M, N = 512, 8, 6, 10  # encoder_dim (ResNet-18), attention_dim, embed_dim, decoder_dim
GRID = 3


# ---- stand-ins for the tutorial's models.py (pickled as models.Encoder & co.) ---------------------

class Encoder(nn.Module):
    def __init__(self, encoded_image_size: int) -> None:
        super().__init__()
        self.enc_image_size = encoded_image_size
        body = torchvision.models.resnet18(weights=None)
        self.resnet = nn.Sequential(*list(body.children())[:-2])
        self.adaptive_pool = nn.AdaptiveAvgPool2d((encoded_image_size, encoded_image_size))

    def forward(self, images):
        return self.adaptive_pool(self.resnet(images)).permute(0, 2, 3, 1)  # (B, g, g, D)


class Attention(nn.Module):
    def __init__(self, encoder_dim: int, decoder_dim: int, attention_dim: int) -> None:
        super().__init__()
        self.encoder_att = nn.Linear(encoder_dim, attention_dim)
        self.decoder_att = nn.Linear(decoder_dim, attention_dim)
        self.full_att = nn.Linear(attention_dim, 1)
        self.relu = nn.ReLU()
        self.softmax = nn.Softmax(dim=1)


class DecoderWithAttention(nn.Module):
    def __init__(self, attention_dim, embed_dim, decoder_dim, vocab_size, encoder_dim, dropout) -> None:
        super().__init__()
        self.encoder_dim, self.attention_dim, self.embed_dim = encoder_dim, attention_dim, embed_dim
        self.decoder_dim, self.vocab_size, self.dropout = decoder_dim, vocab_size, dropout
        self.attention = Attention(encoder_dim, decoder_dim, attention_dim)
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.dropout = nn.Dropout(p=self.dropout)
        self.decode_step = nn.LSTMCell(embed_dim + encoder_dim, decoder_dim, bias=True)
        self.init_h = nn.Linear(encoder_dim, decoder_dim)
        self.init_c = nn.Linear(encoder_dim, decoder_dim)
        self.f_beta = nn.Linear(decoder_dim, encoder_dim)
        self.sigmoid = nn.Sigmoid()
        self.fc = nn.Linear(decoder_dim, vocab_size)


def tutorial_step(dec, feats, word, h, c):
    """The tutorial's decoding step, written out: ReLU attention, vector gate, logits = fc(h_t)."""
    att = dec.attention
    e = att.full_att(att.relu(att.encoder_att(feats) + att.decoder_att(h).unsqueeze(1))).squeeze(2)  # (B, L)
    alpha = att.softmax(e)  # (B, L)
    context = dec.sigmoid(dec.f_beta(h)) * (feats * alpha.unsqueeze(2)).sum(dim=1)  # (B, D)
    h, c = dec.decode_step(torch.cat([dec.embedding(word), context], dim=1), (h, c))
    return dec.fc(dec.dropout(h)), alpha, h, c


def tutorial_wordmap() -> dict[str, int]:
    """The tutorial's id order: words from 1, then <unk> <start> <end>, and <pad> = 0."""
    wordmap = {w: i + 1 for i, w in enumerate(WORDS)}
    for token in ("<unk>", "<start>", "<end>"):
        wordmap[token] = len(wordmap) + 1
    wordmap["<pad>"] = 0
    return wordmap


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory):
    """(checkpoint path, word map path, encoder, decoder) written the way the tutorial writes them."""
    root = tmp_path_factory.mktemp("sgrvinod")
    torch.manual_seed(0)
    wordmap = tutorial_wordmap()
    encoder = Encoder(GRID).eval()
    with torch.no_grad():  # non-trivial batch-norm statistics, so buffers must be carried over too
        for m in encoder.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.num_batches_tracked.fill_(5)
    decoder = DecoderWithAttention(A, M, N, len(wordmap), D, dropout=0.3).eval()
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-4)
    decoder.fc.weight.square().sum().backward()
    optimizer.step()  # an optimizer with state, as in a real file
    models = types.ModuleType("models")
    for cls in (Encoder, Attention, DecoderWithAttention):
        cls.__module__ = "models"
        setattr(models, cls.__name__, cls)
    saved = sys.modules.get("models")
    sys.modules["models"] = models
    try:
        path = root / "BEST_checkpoint_toy.pth.tar"
        torch.save({"epoch": 7, "epochs_since_improvement": 2, "bleu-4": 0.2134, "encoder": encoder,
                    "decoder": decoder, "encoder_optimizer": None, "decoder_optimizer": optimizer}, path)
    finally:
        if saved is None:
            sys.modules.pop("models")
        else:
            sys.modules["models"] = saved
    wordmap_path = root / "WORDMAP_toy.json"
    wordmap_path.write_text(json.dumps(wordmap))
    return path, wordmap_path, encoder, decoder


@pytest.fixture(scope="module")
def converted(tutorial, tmp_path_factory):
    path, wordmap_path, _, _ = tutorial
    out = tmp_path_factory.mktemp("converted") / "toy"
    assert main(["sgrvinod", str(path), str(wordmap_path), "--out", str(out), "--image-size", "128"]) == 0
    return load_checkpoint(out)


@pytest.fixture(scope="module")
def image_tensor(converted, tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "photo.png"
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 255, (128, 150, 3), dtype=np.uint8)).save(path)
    return preprocess(load_image(path), converted.preprocess)[0][None]  # (1, 3, 128, 128)


def test_config_vocab_and_metadata(converted):
    cfg = converted.model_config
    assert (cfg.encoder, cfg.pool_grid, cfg.feature_dim, cfg.attn_dim, cfg.embed_dim, cfg.hidden_dim) == (
        "resnet18", GRID, D, A, M, N)
    assert (cfg.gate_size, cfg.deep_output, cfg.attention_activation, cfg.init_activation) == (
        "vector", False, "relu", "none")
    assert cfg.dropout == pytest.approx(0.3)
    assert converted.vocab.itos[:4] == list(SPECIALS) and converted.vocab.itos[4:] == WORDS
    assert converted.preprocess.image_size == 128
    training = converted.config["training"]
    assert training["epoch"] == 7 and training["bleu-4"] == pytest.approx(0.2134)
    assert training["source_checkpoint"] == "BEST_checkpoint_toy.pth.tar"


def test_same_features_alphas_and_logits(tutorial, converted, image_tensor):
    _, _, encoder, decoder = tutorial
    wordmap = tutorial_wordmap()
    model, vocab = converted.model, converted.vocab
    ours_of_theirs = [vocab.stoi[w] for w in sorted(wordmap, key=wordmap.get)]  # our id, in their id order
    with torch.no_grad():
        feats_ref = encoder(image_tensor).reshape(1, GRID * GRID, D)  # (1, L, D)
        ann = model.encode(image_tensor)
        assert ann.grid == (GRID, GRID)
        torch.testing.assert_close(ann.feats, feats_ref, rtol=1e-5, atol=1e-5)
        mean = feats_ref.mean(dim=1)
        h_ref, c_ref = decoder.init_h(mean), decoder.init_c(mean)
        prep, h, c = model.decoder.prepare(ann.feats)
        torch.testing.assert_close(h, h_ref, rtol=1e-5, atol=1e-6)
        for word in ("<start>", "dog", "grass"):  # three steps, so the LSTM state is carried over too
            logits_ref, alpha_ref, h_ref, c_ref = tutorial_step(
                decoder, feats_ref, torch.tensor([wordmap[word]]), h_ref, c_ref)
            out = model.decoder.step(torch.tensor([vocab.stoi[word]]), h, c, prep)
            h, c = out.h, out.c
            torch.testing.assert_close(out.alpha, alpha_ref, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(out.logits[:, ours_of_theirs], logits_ref, rtol=1e-5, atol=1e-5)
            assert 0 < float(out.beta) < 1  # the vector gate is reported by its mean


def test_greedy_caption_matches_the_tutorials_greedy_decoding(tutorial, converted, image_tensor):
    _, _, encoder, decoder = tutorial
    wordmap = tutorial_wordmap()
    words_of = {i: w for w, i in wordmap.items()}
    banned = [wordmap["<pad>"], wordmap["<start>"]]  # never generated by this project's decoding
    with torch.no_grad():
        feats = encoder(image_tensor).reshape(1, GRID * GRID, D)
        h, c = decoder.init_h(feats.mean(1)), decoder.init_c(feats.mean(1))
        word, expected, logprob = wordmap["<start>"], [], 0.0
        for _ in range(6):
            logits, _, h, c = tutorial_step(decoder, feats, torch.tensor([word]), h, c)
            logp = torch.log_softmax(logits[0], dim=0)
            logp[banned] = -float("inf")
            word = int(logp.argmax())
            logprob += float(logp[word])
            if word == wordmap["<end>"]:
                break
            expected.append(words_of[word])
        hyp = beam_search(converted.model, image_tensor, converted.vocab,
                          DecodeConfig(beam_size=1, max_len=6, suppress_unk=False, precision="fp32"))[0][0]
    assert hyp.words == [w for w in expected if w not in SPECIALS] and len(expected) >= 1
    assert hyp.logprob == pytest.approx(logprob, abs=1e-4)


def test_cli_messages(tutorial, tmp_path, capsys):
    path, wordmap_path, _, _ = tutorial
    out = str(tmp_path / "out")
    assert main(["sgrvinod", str(tmp_path / "missing.pth.tar"), str(wordmap_path), "--out", out]) == 2
    assert "No file at" in capsys.readouterr().err
    assert main(["sgrvinod", str(path), str(tmp_path / "WORDMAP_none.json"), "--out", out]) == 2
    assert "No word map" in capsys.readouterr().err
    wrong = tmp_path / "WORDMAP_other.json"
    wrong.write_text(json.dumps({**tutorial_wordmap(), "extra": 17}))
    assert main(["sgrvinod", str(path), str(wrong), "--out", out]) == 2
    err = capsys.readouterr().err
    assert "belongs to another checkpoint" in err and err.count("\n") == 1 and "Traceback" not in err
    not_json = tmp_path / "WORDMAP_bad.json"
    not_json.write_text("{not json")
    assert main(["sgrvinod", str(path), str(not_json), "--out", out]) == 2
    assert "not a readable JSON word map" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


class _RunsCode:
    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def test_crafted_checkpoint_is_refused_without_running(tmp_path, capsys):
    marker = tmp_path / "ran"
    path = tmp_path / "BEST_checkpoint_evil.pth.tar"
    torch.save({"epoch": 1, "encoder": nn.Linear(2, 2), "decoder": _RunsCode(marker)}, path)
    wordmap = tmp_path / "WORDMAP_evil.json"
    wordmap.write_text(json.dumps(tutorial_wordmap()))
    assert main(["sgrvinod", str(path), str(wordmap), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "builtins.exec" in err and "nothing in the file was run" in err and "Traceback" not in err
    assert not marker.exists() and not (tmp_path / "out").exists()
