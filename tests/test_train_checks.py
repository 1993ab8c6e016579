"""The trainer refuses what it cannot do before any image is decoded: one message, exit code 2, no traceback."""

from __future__ import annotations

import json
import re

import pytest

from sat_core import train
from sat_core.training import trainer as training
from sat_core.config import TrainConfig
from sat_core.training.checks import check_config
from tests.fixtures_world import make_dataset, train_args


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("checks"))


@pytest.fixture
def no_decoding(monkeypatch):
    """Fail the test if the trainer starts decoding images (the slow part a refusal must precede)."""
    def refuse(*args, **kwargs):
        raise AssertionError("images were decoded before the refusal")

    monkeypatch.setattr(training, "ImageStore", refuse)


def _refused(argv, capsys) -> str:
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("flags, words", [
    (("--pretrained",), ["--pretrained", "vgg19 and resnet", "--encoder-weights"]),
    (("--encoder", "vgg19"), ["randomly initialised", "--pretrained", "--allow-random-encoder"]),
    (("--encoder", "vgg19", "--allow-random-encoder", "--image-size", "8"),
     ["--image-size 8", "0×0 grid", "at least 32"]),
    (("--encoder-weights", "/nowhere/encoder.safetensors"), ["--encoder-weights", "no such file"]),
    (("--optimizer", "sgd"), None),  # argparse names the flag and its choices
])
def test_combinations_are_refused_before_decoding(tiny_data, tmp_path, capsys, no_decoding, flags, words):
    data, images = tiny_data
    if words is None:
        assert train.main(train_args(data, images, tmp_path / "run", *flags)) == 2
        err = capsys.readouterr().err
        assert "--optimizer" in err and "'sgd'" in err and "Traceback" not in err
        return
    err = _refused(train_args(data, images, tmp_path / "run", *flags), capsys)
    for word in words:
        assert word in err, err
    assert not (tmp_path / "run").exists()


def test_efficientnet_needs_no_pretrained_flag_its_weights_always_come_with_it():
    cfg = TrainConfig.from_dict({"data": {"dataset": "d.json", "images": "d"}, "model": {"encoder": "efficientnet_lite0"}})
    check_config(cfg)  # no --pretrained, and still not a frozen random encoder
    assert training.model_config(cfg, vocab_size=10).pretrained
    pre = training.preprocess_config(cfg)
    assert (pre.image_size, pre.mean, pre.std, pre.crop) == (224, (0.5,) * 3, (0.5,) * 3, 1.0)


def test_a_config_value_of_the_wrong_type_is_refused_naming_the_field(tiny_data, tmp_path, capsys, no_decoding):
    data, images = tiny_data
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"data": str(data), "images": str(images), "epochs": "3"}))  # flat, as older files
    err = _refused(["--config", str(config)], capsys)
    assert "OptimConfig.epochs must be an integer, not '3'" in err


def test_resume_refuses_architecture_changes_naming_the_fields(tiny_data, tmp_path, capsys):
    data, images = tiny_data
    run = tmp_path / "run"
    assert train.main(train_args(data, images, run, "--epochs", "1", "--no-progress")) == 0
    capsys.readouterr()
    err = _refused(["--resume", str(run), "--hidden-dim", "128", "--attention", "hard"], capsys)
    assert "--hidden-dim 32 -> 128" in err and "--attention 'soft' -> 'hard'" in err and "--out NEW_DIR" in err
    assert train.main(["--resume", str(run), "--epochs", "2", "--lr", "1e-3"]) == 0  # the schedule may change


def test_the_console_tells_sizes_loss_terms_samples_and_why_it_stopped(tiny_data, tmp_path, capsys):
    data, images = tiny_data
    code = train.main(train_args(data, images, tmp_path / "run", "--epochs", "5", "--lr", "0", "--patience", "1",
                                 "--select-metric", "cider", "--no-progress"))
    assert code == 0
    out = capsys.readouterr().out
    assert "data: dataset.json: train 4 images (4 captions), val 4, test 0; vocabulary" in out
    assert "best CIDEr" in out and "reinforce" not in out  # a soft model's loss has no REINFORCE term
    # the loss line is the sum it prints, every term per caption word: loss = nll + λ·dsa
    for loss, nll, dsa in re.findall(r"loss (\d+\.\d+)/word = nll (\d+\.\d+) \+ 1·dsa (\d+\.\d+)", out):
        assert float(loss) == pytest.approx(float(nll) + float(dsa), abs=2e-3)
    assert len(re.findall(r"loss \S+/word = nll", out)) == 2
    assert out.count("  sample: ") == 2 * 2  # two epochs, two samples each
    assert "early stop after epoch 2: no better validation CIDEr for 1 epochs" in out
    result = json.loads(out.strip().splitlines()[-1])
    assert "best_cider" in result and result["epochs"] == 2


def _resnet18_file(path, seed: int = 0):
    """A stand-in for torchvision's resnet18 ImageNet file: the whole classifier's state dict."""
    import torch
    import torchvision

    torch.manual_seed(seed)
    state = torchvision.models.resnet18().state_dict()
    torch.save(state, path)
    return state


def test_unreachable_imagenet_weights_are_reported_at_start_up(tiny_data, tmp_path, capsys, no_decoding,
                                                                monkeypatch):
    from urllib.error import URLError

    import torch

    def offline(url, **kwargs):
        raise URLError("no route to host")

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    data, images = tiny_data
    err = _refused(train_args(data, images, tmp_path / "run", "--encoder", "resnet18", "--pretrained",
                              "--image-size", "64"), capsys)
    assert "could not be downloaded from https://download.pytorch.org/models/resnet18" in err
    assert "no route to host" in err and "--encoder-weights FILE" in err


def test_a_local_imagenet_file_is_the_frozen_encoder_of_the_trained_model(tiny_data, tmp_path):
    import torch

    from sat_core.checkpoint import load_checkpoint

    data, images = tiny_data
    state = _resnet18_file(tmp_path / "resnet18-local.pth", seed=3)
    run = tmp_path / "run"
    assert train.main(train_args(data, images, run, "--encoder", "resnet18", "--encoder-weights",
                                 str(tmp_path / "resnet18-local.pth"), "--image-size", "64", "--epochs", "1",
                                 "--no-progress")) == 0
    loaded = load_checkpoint(run / "last")
    body = loaded.model.encoder.body
    assert torch.equal(body[0].weight, state["conv1.weight"])  # conv1, then bn1 … layer4
    assert torch.equal(body[7][1].conv2.weight, state["layer4.1.conv2.weight"])
    assert loaded.model_config.encoder == "resnet18" and not loaded.model.encoder.trainable


def test_a_weights_file_of_another_network_is_refused_before_decoding(tiny_data, tmp_path, capsys, no_decoding):
    import torch

    torch.save({"conv.weight": torch.zeros(2, 2)}, tmp_path / "other.pth")
    data, images = tiny_data
    err = _refused(train_args(data, images, tmp_path / "run", "--encoder", "resnet18", "--encoder-weights",
                              str(tmp_path / "other.pth"), "--image-size", "64"), capsys)
    assert "is not torchvision's resnet18 ImageNet state dict" in err and "resnet18-f37072fd.pth" in err


def test_the_loss_line_names_each_term_with_the_weight_the_objective_gives_it():
    from sat_core.training.console import loss_terms

    record = {"loss": 2.0, "nll": 1.9, "dsa": 0.5, "reinforce": 0.12, "entropy": 2.0, "attention": 0.7}
    hard = TrainConfig.from_dict({"model": {"attention": "hard"}})
    assert loss_terms(record, hard) == "loss 2.000/word = nll 1.900 + reinforce 0.120 − 0.01·entropy 2.000"
    soft = TrainConfig.from_dict({"optim": {"dsa_lambda": 0.5}})
    assert loss_terms(record, soft, ["attention"]) == "loss 2.000/word = nll 1.900 + 0.5·dsa 0.500; attention 0.700"
