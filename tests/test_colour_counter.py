"""The colour counter: fitted after training on a model's annotations, saved with it, read by the count prior."""

from __future__ import annotations

import json

import pytest
import torch

from sat_core import checkpoint as ckpt
from sat_core import colour_counter, world
from sat_core.config import DecodeConfig, PreprocessConfig
from sat_core.decoding import _head_log_counts, beam_search
from sat_core.io import read_tensors
from sat_core.models.captioner import Captioner
from sat_core.scenes_catalog import COLOUR_PAIRS, COUNTED
from sat_core.vocab import SPECIALS, Vocab
from tests.conftest import tiny_config


def test_fit_learns_counts_that_cells_show():
    """Cells carry a one-hot of the pair drawn there (or nothing): the fitted counter reads back how many of each."""
    torch.manual_seed(1)
    n, cells, pairs = 256, 12, 3
    kinds = torch.randint(0, pairs + 1, (n, cells)) * (torch.rand(n, cells) < 0.2)  # 0: empty cell
    feats = torch.nn.functional.one_hot(kinds, pairs + 1)[..., 1:].to(torch.float16)  # (n, L, pairs)
    targets = torch.stack([(kinds == k + 1).sum(1).clamp(max=4) for k in range(pairs)], dim=1)
    counter, loss = colour_counter.fit(feats, targets, colour_counter.FitConfig(width=16, epochs=40, batch_size=32))
    with torch.no_grad():
        predicted = counter(feats.float()).argmax(-1)
    assert (predicted == targets).float().mean() > 0.95 and loss < 0.2
    again, _ = colour_counter.fit(feats, targets, colour_counter.FitConfig(width=16, epochs=40, batch_size=32))
    assert torch.equal(again.head.weight, counter.head.weight)  # deterministic for a seed


@pytest.fixture
def scenes(tmp_path):
    folder = tmp_path / "scenes"
    world.generate(folder, 6, 1, 1, seed=3, workers=1, kind="scenes")
    return folder


def _checkpoint(path, count_head=True, metrics=None):
    torch.manual_seed(0)
    vocab = Vocab([*SPECIALS, "a", "dog", "two", "cars"])
    config = tiny_config(len(vocab), init_cells=8, count_head=len(COUNTED) if count_head else 0)
    return ckpt.save_checkpoint(path, Captioner(config).eval(), model_config=config, vocab=vocab,
                                preprocess=PreprocessConfig(image_size=32), metrics=metrics)


def test_the_cli_writes_a_new_checkpoint_whose_count_prior_reads_the_counter(tmp_path, scenes, capsys):
    source = _checkpoint(tmp_path / "ck", metrics={"beam": 10, "length_norm": 0.0, "distinct_content": True})
    out = tmp_path / "counted"
    args = ["--checkpoint", str(source), "--data", str(scenes / "dataset.json"), "--images", str(scenes),
            "--width", "8", "--epochs", "2"]
    assert colour_counter.main([*args, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "evaluate it with python -m sat_core.evaluate" in said
    # the new checkpoint has no figures, so it would decode with the defaults: the message names the source's
    assert "--beam 10 --length-norm 0 --no-one-mention-per-kind --distinct-content --count-prior 1" in said
    model = json.loads((out / ckpt.CONFIG_FILE).read_text())["model"]
    assert (model["colour_counter"], model["count_colours"]) == (8, len(COLOUR_PAIRS))
    weights = read_tensors(out / ckpt.WEIGHTS_FILE)[0]
    assert tuple(weights["decoder.colour_counter.head.weight"].shape) == (len(COLOUR_PAIRS) * 5, 8)
    assert tuple(weights["decoder.count_head.weight"].shape) == (len(COUNTED) * 5, 8)  # the head as it was
    before, after = ckpt.load_checkpoint(source), ckpt.load_checkpoint(out)
    assert torch.equal(before.model.decoder.L_o.weight, after.model.decoder.L_o.weight)  # the rest unchanged
    feats = torch.randn(2, 16, after.model_config.annotation_dim)
    assert _head_log_counts(after.model, feats).shape == (2, len(COUNTED) + len(COLOUR_PAIRS), 5)
    ranked = beam_search(after.model, torch.rand(1, 3, 32, 32), after.vocab,
                         DecodeConfig(beam_size=2, max_len=4, count_prior=1.0))
    assert len(ranked) == 1
    assert colour_counter.main([*args, "--out", str(source)]) == 2  # never over the checkpoint it read
    assert "--out must be a new folder" in capsys.readouterr().err


def test_a_model_without_a_count_head_or_a_world_without_objects_is_refused(tmp_path, scenes, capsys):
    plain = _checkpoint(tmp_path / "plain", count_head=False)
    assert colour_counter.main(["--checkpoint", str(plain), "--data", str(scenes / "dataset.json"), "--images",
                                str(scenes), "--out", str(tmp_path / "o1")]) == 2
    assert "has no count head" in capsys.readouterr().err
    from tests.fixtures_world import make_dataset
    shapes, root = make_dataset(tmp_path / "shapes")
    assert colour_counter.main(["--checkpoint", str(_checkpoint(tmp_path / "ck")), "--data", str(shapes),
                                "--images", str(root), "--out", str(tmp_path / "o2")]) == 2
    assert "learns from the scenes world's objects" in capsys.readouterr().err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def packaging_config(target, scenes, model: dict, val: dict):
    """Give the checkpoint at ``target`` the training record that ``ship.package(repackage=True)`` reads, and
    return a preset over the ``scenes`` world with ``model``'s and ``val``'s settings."""
    from sat_core.config import TrainConfig

    metrics = {"training": {"epochs": 1, "train_minutes": 0.1, "captions_per_s": 10.0, "best_epoch": 1,
                            "best_val_bleu4": 0.0, "precision": "fp32", "encoder_minutes": "n/a"}}
    (target / "metrics.json").write_text(json.dumps(metrics))
    return TrainConfig.from_dict({
        "data": {"dataset": str(scenes / "dataset.json"), "images": str(scenes)},
        "model": {"attention": "soft", "init_cells": 8, **model}, "optim": {"count_lambda": 0.1},
        "val": {"beam_size": 1, "max_len": 4, **val}})


def test_the_ship_fits_the_counter_a_preset_names_once(tmp_path, scenes, capsys):
    """package() fits the colour counter when the preset names one and the checkpoint has none, evaluates the
    checkpoint with it and ships it; packaging again keeps the fitted counter."""
    from sat_core import ship
    from sat_core.config import TrainConfig

    target = tmp_path / "checkpoints" / "scenes_soft"
    _checkpoint(target)
    cfg = packaging_config(target, scenes, {"colour_counter": 8}, {"count_prior": 1.0})
    shipped = ship.package("scenes_soft", cfg, None, tmp_path / "checkpoints", repackage=True)
    assert "colour counter: 6 training scenes encoded" in capsys.readouterr().out
    assert shipped["count_prior"] == 1.0
    weights = read_tensors(target / ckpt.WEIGHTS_FILE)[0]
    first = weights["decoder.colour_counter.head.weight"]
    ship.package("scenes_soft", cfg, None, tmp_path / "checkpoints", repackage=True)
    assert "colour counter" not in capsys.readouterr().out
    assert torch.equal(read_tensors(target / ckpt.WEIGHTS_FILE)[0]["decoder.colour_counter.head.weight"], first)
    with pytest.raises(Exception, match="--colour-counter serves the count head's ranking"):
        TrainConfig.from_dict({"model": {"colour_counter": 8}})


def test_the_trainer_says_it_does_not_fit_the_counter_and_what_does(tmp_path, scenes, capsys):
    from sat_core import train
    run = tmp_path / "run"
    assert train.main(["--data", str(scenes / "dataset.json"), "--images", str(scenes), "--out", str(run),
                       "--init-cells", "8", "--count-lambda", "0.1", "--colour-counter", "16", "--epochs", "1",
                       "--embed-dim", "8", "--hidden-dim", "16", "--attn-dim", "8", "--allow-random-encoder",
                       "--min-word-count", "1", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "--colour-counter 16 is fitted after training, not by this command" in err
    assert "python -m sat_core.colour_counter --checkpoint" in err and "--width 16" in err
    model = json.loads((run / "last" / ckpt.CONFIG_FILE).read_text())["model"]
    assert model["colour_counter"] == 0 and model["count_colours"] == 0
