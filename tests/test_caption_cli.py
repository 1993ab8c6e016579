"""python -m sat_core.caption: captions for good images, a message for a bad one, JSON with α and β."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sat_core.caption import main
from sat_core.checkpoint import load_checkpoint, save_checkpoint
from sat_core.config import DecodeConfig, PreprocessConfig
from sat_core.decoding import beam_search
from sat_core.data.images import load_image, preprocess
from sat_core.models.captioner import Captioner
from tests.conftest import tiny_config


@pytest.fixture(scope="module", params=["soft", "hard"])
def checkpoint(request, tmp_path_factory):
    from sat_core.data.vocab import Vocab
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


def _direct(checkpoint, paths, beam, max_len, length_norm=0.0):
    """What the CLI should print: beam_search on the same images, loaded and preprocessed directly."""
    loaded = load_checkpoint(checkpoint)
    batch = torch.stack([preprocess(load_image(p), loaded.preprocess)[0] for p in paths])
    cfg = DecodeConfig(beam_size=beam, max_len=max_len, length_norm=length_norm)
    return beam_search(loaded.model, batch, loaded.vocab, cfg)


def test_length_norm_defaults_to_the_checkpoints_own(checkpoint, files, tmp_path, capsys):
    """A checkpoint evaluated with length normalisation 1 is decoded with it unless the flag says otherwise."""
    loaded = load_checkpoint(checkpoint)
    normed = tmp_path / "normed"
    save_checkpoint(normed, loaded.model, model_config=loaded.model_config, vocab=loaded.vocab,
                    preprocess=loaded.preprocess, metrics={"length_norm": 1.0})
    images = [files[0], files[2]]
    for flags, norm in (([], 1.0), (["--length-norm", "0"], 0.0), (["--length-norm", "0.5"], 0.5)):
        # --device cpu: the direct decode below runs on the CPU, and a GPU's sums differ in the 5th digit
        assert main(["--checkpoint", str(normed), *images, "--beam", "4", "--max-len", "8", "--json",
                     "--device", "cpu", *flags]) == 0
        items = json.loads(capsys.readouterr().out)
        expected = _direct(normed, images, 4, 8, norm)
        for item, hyps in zip(items, expected):
            assert [b["tokens"] for b in item["beams"]] == [h.tokens for h in hyps]
            assert item["score"] == pytest.approx(hyps[0].score)
            assert item["score"] == pytest.approx(item["logprob"] / len(item["tokens"]) ** norm)


def test_the_length_cap_defaults_to_the_checkpoints_own_and_a_cut_caption_says_so(checkpoint, files, tmp_path, capsys):
    loaded = load_checkpoint(checkpoint)
    capped = tmp_path / "capped"
    save_checkpoint(capped, loaded.model, model_config=loaded.model_config, vocab=loaded.vocab,
                    preprocess=loaded.preprocess, metrics={"max_len": 1})
    assert main(["--checkpoint", str(capped), files[0], "--beam", "2", "--device", "cpu"]) == 0
    best = _direct(capped, [files[0]], 2, 1)[0][0]
    assert len(best.words) == 1 and not best.finished  # <end> never comes first: one word is always cut short
    assert capsys.readouterr().out == f"{files[0]}: {best.caption} … (cut at the length cap of 1 word: --max-len)\n"


def test_plain_output_and_bad_image(checkpoint, files, capsys):
    code = main(["--checkpoint", str(checkpoint), *files, "--beam", "2", "--max-len", "6", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 1
    lines = out.splitlines()
    expected = [hyps[0] for hyps in _direct(checkpoint, [files[0], files[2]], 2, 6)]
    cut = " … (cut at the length cap of 6 words: --max-len)"
    assert lines == [f"{f}: {h.caption}{'' if h.finished else cut}" for f, h in zip([files[0], files[2]], expected)]
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
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["--checkpoint", str(checkpoint), files[0], "--count-prior", "1"])  # a retired option: no such flag
    assert exc.value.code == 2 and "unrecognized arguments: --count-prior" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--checkpoint", str(checkpoint)])  # no image: argparse usage error
    assert exc.value.code == 2


# ---- folders, JSON lines, α strips, batches ------------------------------------------------------

@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Images in a folder, with a file that is not an image, a broken image and a subfolder."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(1)
    for name, size in [("b.png", (112, 112)), ("a.jpg", (100, 140)), ("c.JPEG", (130, 120)), ("d.webp", (120, 120))]:
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(root / name)
    (root / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    (root / "notes.txt").write_text("not an image, and not listed\n")
    (root / "sub").mkdir()
    Image.fromarray(rng.integers(0, 255, (112, 112, 3), dtype=np.uint8)).save(root / "sub" / "e.png")
    return root


def test_folder_to_jsonl_and_attention_strips(checkpoint, folder, tmp_path, capsys):
    from sat_core.viz import strip_shape

    out, strips = tmp_path / "captions.jsonl", tmp_path / "strips"
    code = main(["--checkpoint", str(checkpoint), str(folder), "--jsonl", str(out), "--save-attention",
                 str(strips), "--beam", "2", "--max-len", "5", "--batch-size", "3"])
    stdout, err = capsys.readouterr()
    assert code == 1 and "broken.png" in err and "notes.txt" not in err + stdout
    assert "%|" not in err  # no progress bar when stderr is not a terminal
    good = [str(folder / n) for n in ("a.jpg", "b.png", "c.JPEG", "d.webp")]  # sorted, subfolder not read
    items = [json.loads(line) for line in out.read_text().splitlines()]
    assert [item["image"] for item in items] == good
    expected = _direct(checkpoint, good, 2, 5)
    assert [item["tokens"] for item in items] == [hyps[0].tokens for hyps in expected]
    assert stdout.splitlines() == [f"{p}: {hyps[0].caption}" for p, hyps in zip(good, expected)]
    assert sorted(p.name for p in strips.iterdir()) == ["a.png", "b.png", "c.png", "d.png"]
    for item, hyps in zip(items, expected):
        assert item["attention_png"] == str(strips / (Path(item["image"]).stem + ".png"))
        n_words = len(hyps[0].words) + hyps[0].finished
        height, width = strip_shape(n_words, 112, columns=min(n_words + 1, 8))
        assert Image.open(item["attention_png"]).size == (width, height)


def test_batches_give_the_same_captions_and_stdout_jsonl(checkpoint, folder, capsys):
    args = ["--checkpoint", str(checkpoint), str(folder / "b.png"), str(folder), "--beam", "3", "--max-len", "6"]
    main([*args, "--batch-size", "1", "--jsonl", "-"])
    one_by_one = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    main([*args, "--jsonl", "-"])
    batched = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [i["image"] for i in batched] == [str(folder / "b.png")] + [
        str(folder / n) for n in ("a.jpg", "b.png", "c.JPEG", "d.webp")]
    assert [i["tokens"] for i in one_by_one] == [i["tokens"] for i in batched]
    assert batched[0]["tokens"] == batched[2]["tokens"]  # the same file twice, in different batches
    np.testing.assert_allclose([i["score"] for i in one_by_one], [i["score"] for i in batched], atol=1e-5)


def test_empty_folder_and_unwritable_output(checkpoint, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--checkpoint", str(checkpoint), str(empty)]) == 1
    assert "holds no image files" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["--checkpoint", str(checkpoint), str(empty), "--save-attention", str(blocker / "sub")]) == 2
    assert "Cannot write the output" in capsys.readouterr().err
    assert main(["--checkpoint", str(checkpoint), str(empty), "--batch-size", "0"]) == 2


def test_json_says_whether_the_model_is_unsure_where_the_checkpoint_keeps_a_mark(checkpoint, files, tmp_path, capsys):
    """A mark between the two captions' log p: the less likely one is unsure; without a mark there is no field."""
    from sat_core.evaluation.confidence import ConfidenceReference

    good = [files[0], files[2]]
    assert main(["--checkpoint", str(checkpoint), *good, "--beam", "3", "--max-len", "5", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert all("unsure" not in item for item in plain)
    low, high = sorted(item["logprob"] for item in plain)
    if low == high:
        pytest.skip("both captions equally likely: no mark lies between them")
    loaded = load_checkpoint(checkpoint)
    marked = tmp_path / "marked"
    save_checkpoint(marked, loaded.model, model_config=loaded.model_config, vocab=loaded.vocab,
                    preprocess=loaded.preprocess,
                    training={"confidence": ConfidenceReference((low + high) / 2, 0.1, 400).to_dict()})
    assert main(["--checkpoint", str(marked), *good, "--beam", "3", "--max-len", "5", "--json"]) == 0
    items = json.loads(capsys.readouterr().out)
    assert [item["unsure"] for item in items] == [item["logprob"] == low for item in plain]
