"""Checkpoints: the format's round trip, safe refusal of pickles and bad files, crash-safe replacement."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

import sat_core.checkpoint as ckpt
from sat_core.checkpoint import CONFIG_FILE, FORMAT, WEIGHTS_FILE, load_checkpoint, read_checkpoint, save_checkpoint
from sat_core.training.state import flatten_state, unflatten_state
from sat_core.io import read_tensors, save_tensors_atomic, write_json_atomic
from sat_core.config import ModelConfig, PreprocessConfig
from sat_core.errors import CheckpointError
from sat_core.data.vocab import Vocab

WORDS = ["<pad>", "<start>", "<end>", "<unk>"] + [f"w{i}" for i in range(16)]  # 20 words


def tiny_config(**changes) -> ModelConfig:
    fields = dict(encoder="small", small_channels=(8, 16), feature_dim=16, vocab_size=len(WORDS),
                  embed_dim=8, hidden_dim=16, attn_dim=8, dropout=0.0)
    fields.update(changes)
    return ModelConfig(**fields)


class StandIn(nn.Module):
    """A small module with float, int and batch-norm state, independent of the Captioner."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.embed_dim)
        self.proj = nn.Linear(config.embed_dim, config.hidden_dim)
        self.norm = nn.BatchNorm1d(config.hidden_dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(self.embed(tokens)))  # (B, n)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch):
    """load_checkpoint builds the StandIn instead of the Captioner."""
    monkeypatch.setattr(ckpt, "_build_model", StandIn)
    torch.manual_seed(0)
    model = StandIn(tiny_config())
    model.norm.running_mean.normal_()
    model.norm.num_batches_tracked.fill_(7)
    return model


def save(directory: Path, model: nn.Module, config: ModelConfig | None = None, **kwargs) -> Path:
    return save_checkpoint(directory, model, model_config=config or tiny_config(), vocab=Vocab(WORDS),
                           preprocess=PreprocessConfig(image_size=32), **kwargs)


def states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


# ---- save / read / load -------------------------------------------------------------------------

def test_save_then_load_round_trip(tmp_path: Path, stand_in: StandIn) -> None:
    out = save(tmp_path / "run" / "best", stand_in, training={"epoch": 3}, metrics={"bleu4": 0.21},
               model_card="# tiny\n")
    assert sorted(p.name for p in out.iterdir()) == ["MODEL_CARD.md", CONFIG_FILE, "metrics.json", WEIGHTS_FILE]
    config = json.loads((out / CONFIG_FILE).read_text())
    assert config["format"] == FORMAT and config["training"] == {"epoch": 3}
    assert config["vocab"]["words"] == WORDS and config["preprocess"]["image_size"] == 32
    loaded = load_checkpoint(out)
    assert isinstance(loaded.model, StandIn) and not loaded.model.training
    assert states_equal(loaded.model.state_dict(), stand_in.state_dict())
    assert loaded.vocab.itos == WORDS and loaded.preprocess.image_size == 32
    assert loaded.metrics == {"bleu4": 0.21} and loaded.path == out
    assert loaded.model_config.pretrained is False
    # The same checkpoint through its files' paths.
    for entry in (out / WEIGHTS_FILE, out / CONFIG_FILE):
        tensors, _ = read_checkpoint(entry)
        assert states_equal(tensors, stand_in.state_dict())


def test_the_same_weights_are_saved_as_the_same_bytes(tmp_path: Path, stand_in: StandIn) -> None:
    """A rebuilt or repackaged checkpoint whose weights did not change leaves its weights file unchanged."""
    files = [save(tmp_path / f"ck{k}", stand_in, dtype=torch.float16) / WEIGHTS_FILE for k in range(6)]
    assert len({f.read_bytes() for f in files}) == 1
    _, metadata = read_tensors(files[0])
    assert metadata == {"format": FORMAT}


@pytest.mark.parametrize("metrics, expected", [
    (None, (3, 0.0, 20)),
    ({"beam": 5, "length_norm": 1.0}, (5, 1.0, 20)),
    ({"beam": 5, "length_norm": 1.0, "max_len": 24}, (5, 1.0, 24)),
    ({"beam": 0, "length_norm": "1", "max_len": True}, (3, 0.0, 20)),  # not usable: defaults
    ({"beam": 5, "length_norm": 1.0, "one_mention_per_kind": True, "count_prior": 1.0}, (5, 1.0, 20)),  # older metrics
])
def test_decoding_defaults_come_from_what_the_metrics_were_measured_with(tmp_path: Path, stand_in: StandIn,
                                                                        metrics, expected) -> None:
    loaded = load_checkpoint(save(tmp_path / "ck", stand_in, metrics=metrics))
    cfg = loaded.decode_defaults()
    assert (cfg.beam_size, cfg.length_norm, cfg.max_len) == expected == loaded.evaluated


# What a scenes checkpoint of an earlier version kept in its config.json: options this version no longer has.
RETIRED_OFF = {"position": False, "init_cells": 0, "blind_init": False, "count_head": 0, "count_colours": 0,
               "colour_counter": 0, "relation_judge": 0, "relation_feet": False}
OPTIM_OFF = {"count_lambda": 0.0, "count_colours": True, "count_encoder": False, "attention_target": "cells"}
VAL_OFF = {"one_mention_per_kind": False, "distinct_content": False, "count_prior": 0.0, "relation_prior": 0.0,
           "relation_choice": 0.0}


def _with_stored(folder: Path, model: dict, train_config: dict | None = None) -> Path:
    """Add fields to a saved checkpoint's config.json, as an earlier version wrote them."""
    config = json.loads((folder / CONFIG_FILE).read_text())
    config["model"].update(model)
    if train_config is not None:
        config["training"]["train_config"] = train_config
    (folder / CONFIG_FILE).write_text(json.dumps(config))
    return folder


def test_a_checkpoint_that_stored_retired_options_switched_off_loads(tmp_path: Path, stand_in: StandIn) -> None:
    """Older configs hold every option their version had; those this one no longer has load while they are off."""
    stored = {"optim": {"attention_lambda": 1.0, **OPTIM_OFF}, "val": {"beam_size": 3, **VAL_OFF}}
    folder = _with_stored(save(tmp_path / "ck", stand_in), RETIRED_OFF, stored)
    loaded = load_checkpoint(folder)
    assert loaded.model_config == tiny_config()
    assert loaded.optim is not None and loaded.optim.attention_lambda == 1.0


@pytest.mark.parametrize("model, train_config, named", [
    ({"init_cells": 256, "count_head": 37, "position": True}, None, ["init_cells = 256", "count_head = 37",
                                                                      "position = true"]),
    ({"relation_judge": 128}, None, ["relation_judge = 128"]),
])
def test_a_checkpoint_that_used_a_retired_option_is_refused_with_one_message(tmp_path: Path, stand_in: StandIn,
                                                                             model, train_config, named) -> None:
    folder = _with_stored(save(tmp_path / "scenes_soft", stand_in), {**RETIRED_OFF, **model}, train_config)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(folder)
    message = str(err.value)
    assert message.count("which this version no longer has") == 1
    assert all(f in message for f in named) and "relation_feet" not in message  # only what was switched on
    assert "retrain it with python -m sat_core.ship scenes_soft" in message and str(folder) in message


@pytest.mark.parametrize("section, field, value", [
    ("optim", "count_lambda", 0.1), ("optim", "attention_target", "mass"), ("val", "count_prior", 1.0),
    ("val", "one_mention_per_kind", True), ("val", "distinct_content", True), ("val", "relation_choice", 4.0),
])
def test_a_run_config_that_used_a_retired_option_is_refused(section, field, value) -> None:
    from sat_core.config import TrainConfig
    from sat_core.errors import RetiredOptionError

    with pytest.raises(RetiredOptionError, match=f"trained with {field} = {json.dumps(value)}, which this version"):
        TrainConfig.from_dict({section: {field: value}})
    off = TrainConfig.from_dict({section: {field: {**OPTIM_OFF, **VAL_OFF}[field]}})
    assert off == TrainConfig.from_dict({section: {}})  # switched off: as if it were not there


def test_pretrained_never_fetched_when_loading(tmp_path: Path, stand_in: StandIn, monkeypatch) -> None:
    built = []
    monkeypatch.setattr(ckpt, "_build_model", lambda cfg: built.append(cfg) or StandIn(cfg))
    out = save(tmp_path / "c", stand_in, tiny_config(pretrained=True))
    load_checkpoint(out)
    assert built[0].pretrained is False
    assert json.loads((out / CONFIG_FILE).read_text())["model"]["pretrained"] is True


def test_fp16_storage_loads_as_fp32(tmp_path: Path, stand_in: StandIn) -> None:
    full, half = save(tmp_path / "full", stand_in), save(tmp_path / "half", stand_in, dtype=torch.float16)
    size = lambda d: (d / WEIGHTS_FILE).stat().st_size  # noqa: E731
    floats = sum(v.numel() for v in stand_in.state_dict().values() if v.is_floating_point())
    assert abs((size(full) - size(half)) - 2 * floats) < 32  # 2 bytes saved per float, headers aside
    assert read_checkpoint(half)[0]["proj.weight"].dtype == torch.float16
    state = load_checkpoint(half).model.state_dict()
    assert state["proj.weight"].dtype == torch.float32
    assert state["norm.num_batches_tracked"].dtype == torch.int64 and int(state["norm.num_batches_tracked"]) == 7
    assert torch.allclose(state["proj.weight"], stand_in.proj.weight, rtol=1e-3, atol=1e-4)
    assert not torch.equal(state["proj.weight"], stand_in.proj.weight)  # it really went through fp16


def test_config_mismatches_refused(tmp_path: Path, stand_in: StandIn) -> None:
    out = save(tmp_path / "c", stand_in)
    config = json.loads((out / CONFIG_FILE).read_text())
    config["model"]["hidden_dim"] = 32
    write_json_atomic(out / CONFIG_FILE, config)
    with pytest.raises(CheckpointError, match="config does not match the weights") as caught:
        load_checkpoint(out)
    assert "proj.weight is (16, 8) in the file but (32, 8) in the model" in str(caught.value)
    config["model"]["hidden_dim"] = 16
    config["model"]["vocab_size"] = 21
    write_json_atomic(out / CONFIG_FILE, config)
    with pytest.raises(CheckpointError, match="vocab_size=21 but its vocabulary has 20 words"):
        load_checkpoint(out)


@pytest.mark.parametrize(
    "text, words",
    [("{not json", "not readable JSON"), ('{"format": "other/2"}', "format 'other/2'"),
     ('[1, 2]', "format None"), (json.dumps({"format": FORMAT, "model": {}}), "lacks the section")],
)
def test_bad_config_json_refused(tmp_path: Path, stand_in: StandIn, text: str, words: str) -> None:
    out = save(tmp_path / "c", stand_in)
    (out / CONFIG_FILE).write_text(text)
    with pytest.raises(CheckpointError, match=words):
        read_checkpoint(out)


def test_unknown_model_field_refused(tmp_path: Path, stand_in: StandIn) -> None:
    out = save(tmp_path / "c", stand_in)
    config = json.loads((out / CONFIG_FILE).read_text())
    config["model"]["wings"] = 2
    write_json_atomic(out / CONFIG_FILE, config)
    with pytest.raises(CheckpointError, match="invalid.*wings"):
        load_checkpoint(out)


def test_missing_paths_refused(tmp_path: Path, stand_in: StandIn) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no model.safetensors and no config.json"):
        read_checkpoint(tmp_path / "empty")
    out = save(tmp_path / "c", stand_in)
    (out / CONFIG_FILE).unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        read_checkpoint(out)
    with pytest.raises(CheckpointError, match="no config.json beside it"):
        read_checkpoint(out / WEIGHTS_FILE)


@pytest.mark.parametrize("keep", [0.5, 0.95, 4 / 1000])
def test_truncated_safetensors_refused(tmp_path: Path, stand_in: StandIn, keep: float) -> None:
    out = save(tmp_path / "c", stand_in)
    data = (out / WEIGHTS_FILE).read_bytes()
    (out / WEIGHTS_FILE).write_bytes(data[: max(1, int(len(data) * keep))])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(out)


# ---- pickles ----------------------------------------------------------------------------------

class Exploit:
    """Unpickling this would create a marker file (and could do anything else)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class ExploitOpen(Exploit):
    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("exploit", [Exploit, ExploitOpen])
@pytest.mark.parametrize("file_name", ["model.pt", "model.bin", "weights.pkl", WEIGHTS_FILE])
def test_malicious_pickle_never_runs(tmp_path: Path, stand_in: StandIn, exploit, file_name: str) -> None:
    folder = save(tmp_path / "c", stand_in)
    marker = tmp_path / "PWNED"
    with open(folder / file_name, "wb") as handle:
        pickle.dump({"proj.weight": exploit(marker)}, handle)
    with pytest.raises(CheckpointError, match="refused without running it") as caught:
        read_checkpoint(folder / file_name)
    assert "weights_only` set to `False`" not in str(caught.value)  # no advice to do the unsafe thing
    if file_name == WEIGHTS_FILE:  # a pickle renamed to model.safetensors, reached via the folder
        with pytest.raises(CheckpointError, match="refused without running it"):
            load_checkpoint(folder)
    assert not marker.exists()


def test_plain_tensor_pt_accepted_only_beside_config(tmp_path: Path, stand_in: StandIn) -> None:
    folder = save(tmp_path / "c", stand_in)
    torch.save(stand_in.state_dict(), folder / "model.pt")
    tensors, config = read_checkpoint(folder / "model.pt")
    assert states_equal(tensors, stand_in.state_dict()) and config["format"] == FORMAT
    lone = tmp_path / "lone"
    lone.mkdir()
    torch.save(stand_in.state_dict(), lone / "model.pt")
    with pytest.raises(CheckpointError, match="no config.json beside it"):
        read_checkpoint(lone / "model.pt")
    with pytest.raises(CheckpointError, match="It holds model.pt"):
        read_checkpoint(lone)
    torch.save({"model": stand_in.state_dict(), "epoch": 3}, folder / "nested.pt")
    with pytest.raises(CheckpointError, match="plain state dict"):
        read_checkpoint(folder / "nested.pt")


# ---- atomic writes ----------------------------------------------------------------------------

def test_crash_while_writing_weights_leaves_nothing(tmp_path: Path, stand_in: StandIn, monkeypatch) -> None:
    import safetensors.torch

    def half_write(tensors, filename, metadata=None):
        with open(filename, "wb") as handle:
            handle.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", half_write)
    with pytest.raises(OSError, match="disk full"):
        save(tmp_path / "new", stand_in)
    assert list(tmp_path.iterdir()) == []  # no final folder, no staging folder left behind
    with pytest.raises(OSError):
        save_tensors_atomic(tmp_path / "state.safetensors", {"a": torch.ones(3)})
    assert list(tmp_path.iterdir()) == []


def test_crash_while_replacing_keeps_old_checkpoint(tmp_path: Path, stand_in: StandIn, monkeypatch) -> None:
    out = save(tmp_path / "best", stand_in, metrics={"bleu4": 0.1})
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with torch.no_grad():
        stand_in.proj.weight.add_(1.0)

    def failing_json(path, obj):
        Path(path).write_text('{"format": "sat-explo')  # a partial file, then the crash
        raise KeyboardInterrupt

    real_write_json = ckpt.write_json_atomic
    monkeypatch.setattr(ckpt, "write_json_atomic", failing_json)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path / "best", stand_in, metrics={"bleu4": 0.3})
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["best"]
    # A successful save replaces the whole folder, leaving no staging or old copy.
    monkeypatch.setattr(ckpt, "write_json_atomic", real_write_json)
    save(tmp_path / "best", stand_in)
    assert [p.name for p in tmp_path.iterdir()] == ["best"]
    assert not (out / "metrics.json").exists()
    assert torch.equal(read_checkpoint(out)[0]["proj.weight"], stand_in.proj.weight)


def test_rename_failure_restores_old(tmp_path: Path, stand_in: StandIn, monkeypatch) -> None:
    out = save(tmp_path / "best", stand_in)
    old_weights = (out / WEIGHTS_FILE).read_bytes()
    real_rename = os.rename

    def rename(src, dst):
        if ".tmp" in str(src):  # moving the new checkpoint in fails
            raise OSError("rename failed")
        real_rename(src, dst)

    monkeypatch.setattr(ckpt.os, "rename", rename)
    with pytest.raises(OSError, match="rename failed"):
        save(tmp_path / "best", stand_in, dtype=torch.float16)
    assert (out / WEIGHTS_FILE).read_bytes() == old_weights
    assert [p.name for p in tmp_path.iterdir()] == ["best"]


def test_extras_land_in_the_same_swap(tmp_path: Path, stand_in: StandIn, monkeypatch) -> None:
    tensors, skeleton = flatten_state({"step": torch.tensor(3)})
    out = save(tmp_path / "last", stand_in, extra_json={"state.json": skeleton},
               extra_tensors={"state.safetensors": tensors})
    assert unflatten_state(read_tensors(out / "state.safetensors")[0],
                           json.loads((out / "state.json").read_text())) == {"step": torch.tensor(3)}
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_save = ckpt.save_tensors_atomic

    def crash_on_state(path, tensors, metadata=None):
        if Path(path).name == "state.safetensors":
            raise OSError("disk full")
        return real_save(path, tensors, metadata)

    monkeypatch.setattr(ckpt, "save_tensors_atomic", crash_on_state)
    with pytest.raises(OSError):
        save(tmp_path / "last", stand_in, dtype=torch.float16, extra_json={"state.json": {"step": 4}},
             extra_tensors={"state.safetensors": tensors})
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # weights and state still agree
    for bad in ({"config.json": {}}, {"../x.json": {}}):
        with pytest.raises(ValueError, match="extra file names"):
            save(tmp_path / "other", stand_in, extra_json=bad)


def test_refuses_to_replace_a_folder_that_is_not_a_checkpoint(tmp_path: Path, stand_in: StandIn) -> None:
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="holds other files"):
        save(tmp_path / "photos", stand_in)
    assert (tmp_path / "photos" / "cat.jpg").exists()


# ---- the real Captioner ------------------------------------------------------------------------

def captioner_or_skip():
    try:
        from sat_core.models.captioner import Captioner
    except ImportError as exc:  # pragma: no cover - only while the model is being written
        pytest.skip(f"Captioner not importable: {exc}")
    return Captioner


def test_captioner_round_trip_identical_logits(tmp_path: Path) -> None:
    Captioner = captioner_or_skip()
    torch.manual_seed(0)
    config = tiny_config()
    model = Captioner(config).eval()
    images = torch.randn(2, 3, 32, 32)
    captions = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 9, 2, 0]])
    with torch.no_grad():
        expected = model(images, captions).logits  # (B, T, V)
    out = save(tmp_path / "cap", model, config)
    loaded = load_checkpoint(out)
    assert isinstance(loaded.model, Captioner) and not loaded.model.training
    assert states_equal(loaded.model.state_dict(), model.state_dict())
    with torch.no_grad():
        assert torch.equal(loaded.model(images, captions).logits, expected)

    half = load_checkpoint(save(tmp_path / "cap16", model, config, dtype=torch.float16))
    with torch.no_grad():
        logits16 = half.model(images, captions).logits
    assert logits16.dtype == torch.float32
    assert torch.allclose(logits16, expected, atol=1e-2) and not torch.equal(logits16, expected)


@pytest.mark.parametrize("field, value, words", [
    ("vocab_size", 25, "vocab_size=25 but its vocabulary has 20 words"),
    ("hidden_dim", 24, "config does not match the weights"),
    ("small_channels", [8, 12], "config does not match the weights"),
])
def test_captioner_config_mismatch(tmp_path: Path, field: str, value, words: str) -> None:
    Captioner = captioner_or_skip()
    out = save(tmp_path / "cap", Captioner(tiny_config()))
    config = json.loads((out / CONFIG_FILE).read_text())
    config["model"][field] = value
    if field == "small_channels":
        config["model"]["feature_dim"] = 12
    write_json_atomic(out / CONFIG_FILE, config)
    with pytest.raises(CheckpointError, match=words):
        load_checkpoint(out)


def test_captioner_truncated_weights(tmp_path: Path) -> None:
    Captioner = captioner_or_skip()
    out = save(tmp_path / "cap", Captioner(tiny_config()))
    data = (out / WEIGHTS_FILE).read_bytes()
    (out / WEIGHTS_FILE).write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(out)
