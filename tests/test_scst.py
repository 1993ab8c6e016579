"""Self-critical training (``python -m sat_core.scst``) on a tiny world, from a cross-entropy checkpoint: it starts
where that model is, raises its training reward, writes its checkpoints like any run and resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sat_core import scst, train
from sat_core.checkpoint import load_checkpoint
from sat_core.io import read_tensors
from sat_core.worlds.writer import generate
from tests.fixtures_world import TINY_MODEL

SCST_FLAGS = ["--batch-size", "30", "--no-progress", "--log-every", "0"]  # 30 captions: all 6 images in one step


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ce_run(tmp_path_factory) -> Path:
    """A tiny model after two epochs of cross-entropy on six images with five world captions each."""
    root = tmp_path_factory.mktemp("scst")
    data = generate(root / "world", 6, 2, 0, seed=3, workers=1)
    assert train.main(["--data", str(data), "--images", str(root / "world"), "--out", str(root / "ce"), *TINY_MODEL,
                       "--epochs", "2", "--lr", "1e-2", "--patience", "0", "--log-every", "0"]) == 0
    return root / "ce"


def _log(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def test_a_run_starts_from_the_checkpoint_and_keeps_the_best_by_validation_cider(ce_run, tmp_path, capsys):
    run = tmp_path / "scst"
    assert scst.main(["--init", str(ce_run / "best"), "--out", str(run), "--epochs", "2", *SCST_FLAGS]) == 0
    log = _log(run)
    start = next(r for r in log if r.get("event") == "start")
    ce_best = load_checkpoint(ce_run / "best")
    assert start["val"]["CIDEr"] == pytest.approx(ce_best.metrics["val_CIDEr"])  # its weights and its words
    epochs = [r for r in log if "reward" in r]
    assert [r["epoch"] for r in epochs] == [1, 2] and all(r["words"] >= 1 for r in epochs)  # no empty sample
    best = load_checkpoint(run / "best")
    assert best.vocab.itos == ce_best.vocab.itos
    assert best.metrics["val_CIDEr"] == pytest.approx(max(r["val"]["CIDEr"] for r in [start, *epochs]))
    saved = json.loads((run / "train_config.json").read_text())
    assert saved["optim"]["select_metric"] == "cider" and saved["optim"]["lr"] == 5e-5
    assert json.loads((run / "scst_config.json").read_text())["init"] == str(ce_run / "best")
    assert "CIDEr-D reward of the samples" in capsys.readouterr().out


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(ce_run, tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    args = ["--init", str(ce_run / "best"), "--lr", "2e-3", "--samples", "4", *SCST_FLAGS]
    assert scst.main([*args, "--out", str(whole), "--epochs", "2"]) == 0
    assert scst.main([*args, "--out", str(split), "--epochs", "1"]) == 0
    assert scst.main(["--resume", str(split), "--epochs", "2", "--no-progress"]) == 0
    a, b = read_tensors(whole / "last" / "model.safetensors")[0], read_tensors(split / "last" / "model.safetensors")[0]
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert [r["reward"] for r in _log(whole) if "reward" in r] == [r["reward"] for r in _log(split) if "reward" in r]


@pytest.mark.slow
def test_self_critical_training_raises_the_training_reward(ce_run, tmp_path):
    """Thirty steps over all six images, sixteen samples each: the samples' mean CIDEr-D (the training reward, taken
    before each step) rises well above where it started."""
    run = tmp_path / "scst"
    assert scst.main(["--init", str(ce_run / "best"), "--out", str(run), "--epochs", "30", "--lr", "2e-3",
                      "--samples", "16", *SCST_FLAGS]) == 0
    rewards = [r["reward"] for r in _log(run) if "reward" in r]
    before, after = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert after > before + 0.1, rewards


def test_what_is_missing_is_said(ce_run, tmp_path, capsys):
    assert scst.main(["--out", str(tmp_path / "a")]) == 2
    assert "Give --init" in capsys.readouterr().err
    assert scst.main(["--init", str(ce_run / "best")]) == 2
    assert "Give --out" in capsys.readouterr().err
    assert scst.main(["--init", str(tmp_path / "nowhere"), "--out", str(tmp_path / "b")]) == 2
    assert "nowhere" in capsys.readouterr().err
    assert scst.main(["--resume", str(ce_run), "--no-progress"]) == 2  # a cross-entropy run
    assert "not a self-critical run" in capsys.readouterr().err


def test_a_checkpoint_that_was_started_from_another_one_needs_that_one_no_more(ce_run, tmp_path):
    """Its training configuration names --init-from; self-critical training takes the weights from the checkpoint
    itself, so the model it once started from may be gone."""
    import shutil

    start = tmp_path / "start"
    shutil.copytree(ce_run / "best", start)
    assert train.main(["--config", str(ce_run / "train_config.json"), "--out", str(tmp_path / "ce2"), "--epochs", "1",
                       "--init-from", str(start)]) == 0
    shutil.rmtree(start)
    run = tmp_path / "scst"
    assert scst.main(["--init", str(tmp_path / "ce2" / "best"), "--out", str(run), "--epochs", "1", *SCST_FLAGS]) == 0
    assert json.loads((run / "train_config.json").read_text())["init_from"] == ""
