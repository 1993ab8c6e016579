"""python -m sat_core.caption: captions for good images, a message for a bad one, JSON with α and β."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from sat_core.caption import main
from sat_core.checkpoint import load_checkpoint, save_checkpoint
from sat_core.config import DecodeConfig, PreprocessConfig
from sat_core.decoding import beam_search
from sat_core.images import load_image, preprocess
from sat_core.models.captioner import Captioner
from tests.conftest import tiny_config


@pytest.fixture(scope="module", params=["soft", "hard"])
def checkpoint(request, tmp_path_factory):
    from sat_core.vocab import Vocab
    from tests.conftest import WORDS

    vocab = Vocab(["<pad>", "<start>", "<end>", "<unk>", *WORDS])
    torch.manual_seed(1)
    config = tiny_config(len(vocab), attention=request.param)
    directory = tmp_path_factory.mktemp(request.param) / "ckpt"
    save_checkpoint(directory, Captioner(config), model_config=config, vocab=vocab,
                    preprocess=PreprocessConfig(112))
    return directory


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    good1, good2, bad = root / "one.png", root / "two.jpg", root / "notes.png"
    Image.fromarray(rng.integers(0, 255, (112, 112, 3), dtype=np.uint8)).save(good1)
    Image.fromarray(rng.integers(0, 255, (90, 160, 3), dtype=np.uint8)).save(good2, quality=90)
    bad.write_text("this is not an image\n")
    return [str(good1), str(bad), str(good2)]


def _direct(checkpoint, paths, beam, max_len):
    """What the CLI should print: beam_search on the same images, loaded and preprocessed directly."""
    loaded = load_checkpoint(checkpoint)
    batch = torch.stack([preprocess(load_image(p), loaded.preprocess)[0] for p in paths])
    return beam_search(loaded.model, batch, loaded.vocab, DecodeConfig(beam_size=beam, max_len=max_len))


def test_plain_output_and_bad_image(checkpoint, files, capsys):
    code = main(["--checkpoint", str(checkpoint), *files, "--beam", "2", "--max-len", "6", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 1
    lines = out.splitlines()
    expected = _direct(checkpoint, [files[0], files[2]], 2, 6)
    assert lines == [f"{files[0]}: {expected[0][0].caption}", f"{files[2]}: {expected[1][0].caption}"]
    assert f"{files[1]}: " in err and "not an image" in err


def test_json_output(checkpoint, files, capsys):
    code = main(["--checkpoint", str(checkpoint), *files, "--beam", "3", "--max-len", "5", "--json"])
    out, err = capsys.readouterr()
    assert code == 1 and "notes.png" in err
    items = json.loads(out)
    assert [item["image"] for item in items] == [files[0], files[2]]
    expected = _direct(checkpoint, [files[0], files[2]], 3, 5)
    for item, hyps in zip(items, expected):
        T = len(item["tokens"])
        assert item["tokens"] == hyps[0].tokens and item["words"] == hyps[0].words
        assert item["caption"] == " ".join(item["words"]) and 1 <= T <= 5
        assert item["score"] == pytest.approx(hyps[0].score) and item["logprob"] <= 0
        assert item["grid"] == [14, 14]
        alphas = np.asarray(item["alphas"])
        assert alphas.shape == (T, 14, 14)
        assert alphas.sum(axis=(1, 2)) == pytest.approx(np.ones(T), abs=1e-4)
        assert len(item["betas"]) == T and all(0 < b <= 1 for b in item["betas"])
        assert len(item["beams"]) == 3 and [b["tokens"] for b in item["beams"]] == [h.tokens for h in hyps]
        if "hard" in str(checkpoint):
            assert item["betas"] == [1.0] * T and len(item["locations"]) == T
        else:
            assert all(b < 1 for b in item["betas"]) and "locations" not in item


def test_all_images_bad_and_bad_checkpoint(checkpoint, files, tmp_path, capsys):
    assert main(["--checkpoint", str(checkpoint), files[1]]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "not an image" in err
    assert main(["--checkpoint", str(tmp_path / "missing"), files[0]]) == 2
    assert "No checkpoint" in capsys.readouterr().err
    assert main(["--checkpoint", str(checkpoint), files[0], "--beam", "0"]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["--checkpoint", str(checkpoint)])  # no image: argparse usage error
    assert exc.value.code == 2
