"""sat_core.config and sat_core.cli: frozen, validated configs; flags and defaults read from them."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sat_core import cli
from sat_core.config import (
    DataConfig, DecodeConfig, HardAttentionConfig, ModelConfig, OptimConfig, PreprocessConfig, TrainConfig,
)
from sat_core.errors import SatError

ROOT = Path(__file__).resolve().parents[1]
LEGACY = Path(__file__).parent / "data" / "legacy_train_config.json"


def test_configs_are_frozen_hashable_and_derived_with_replace():
    cfg = DecodeConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.beam_size = 5  # type: ignore[misc]
    assert hash(cfg) == hash(DecodeConfig()) and cfg == DecodeConfig()
    greedy = dataclasses.replace(cfg, beam_size=1)
    assert greedy.beam_size == 1 and greedy.max_len == cfg.max_len and cfg.beam_size == 3
    assert len({cfg, greedy, DecodeConfig(beam_size=1)}) == 2
    assert isinstance(hash(TrainConfig()), int)


@pytest.mark.parametrize("build, message", [
    (lambda: DecodeConfig(beam_size=0), "DecodeConfig.beam_size must be at least 1, not 0"),
    (lambda: DecodeConfig(max_len=0), "DecodeConfig.max_len must be at least 1"),
    (lambda: DecodeConfig(hard_mode="guess"), "DecodeConfig.hard_mode must be one of expect, sample, not 'guess'"),
    (lambda: DecodeConfig(beam_size="3"), "DecodeConfig.beam_size must be an integer, not '3'"),
    (lambda: DecodeConfig(beam_size=True), "must be an integer, not True"),
    (lambda: ModelConfig(encoder="vgg16"), "ModelConfig.encoder must be one of small, vgg19, resnet101"),
    (lambda: ModelConfig(dropout=1.0), "dropout must be below 1"),
    (lambda: ModelConfig(small_channels=()), "small_channels must not be empty"),
    (lambda: HardAttentionConfig(baseline_decay=1.0), "baseline_decay must be below 1"),
    (lambda: PreprocessConfig(mean=(0.5, 0.5)), "mean must have 3 values"),
    (lambda: PreprocessConfig(crop=0), "crop must be above 0 and at most 1"),
    (lambda: PreprocessConfig(crop=1.2), "crop must be above 0 and at most 1"),
    (lambda: OptimConfig(epochs=0), "OptimConfig.epochs must be at least 1"),
    (lambda: OptimConfig(lr_final=1.5), "lr_final is a share of --lr, at most 1"),
    (lambda: OptimConfig(lr_schedule="step"), "OptimConfig.lr_schedule must be one of constant, cosine"),
    (lambda: DataConfig(batching="random"), "DataConfig.batching must be one of length, image"),
    (lambda: TrainConfig.from_dict({"optim": {"epochs": "3"}}), "OptimConfig.epochs must be an integer, not '3'"),
    (lambda: TrainConfig.from_dict({"model": {"hiden_dim": 3}}), r"Unknown ModelConfig field\(s\) \['hiden_dim'\]"),
])
def test_bad_values_are_refused_naming_the_field(build, message):
    with pytest.raises(SatError, match=message):
        build()


def test_cosine_schedule_falls_from_lr_to_its_final_share_over_every_epoch():
    cfg = OptimConfig(lr=1e-3, lr_schedule="cosine", lr_final=0.1, epochs=4)
    rates = [cfg.lr_at(step, steps_per_epoch=10) for step in range(41)]
    assert rates[0] == pytest.approx(1e-3)
    assert rates[20] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))  # half way: half way down
    assert rates[40] == pytest.approx(1e-4) and cfg.lr_at(99, 10) == pytest.approx(1e-4)  # then it stays
    assert all(a > b for a, b in zip(rates, rates[1:]))
    assert OptimConfig(lr=2e-3, epochs=4).lr_at(30, 10) == 2e-3  # constant: the default


def test_warmup_rises_linearly_then_hands_over_to_the_schedule():
    constant = OptimConfig(lr=1e-3, warmup_steps=4)
    assert [constant.lr_at(s, 10) for s in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    cosine = OptimConfig(lr=1e-3, lr_schedule="cosine", lr_final=0.1, epochs=1, warmup_steps=4)
    rates = [cosine.lr_at(s, 24) for s in range(25)]
    assert rates[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])  # the warmup, then cosine over the other 20
    assert rates[14] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5)) and rates[24] == pytest.approx(1e-4)
    assert rates[4] == pytest.approx(1e-3) and all(a > b for a, b in zip(rates[4:], rates[5:]))  # then down


def test_a_rate_chosen_for_one_batch_follows_the_square_root_rule_at_another():
    cfg = OptimConfig(lr=1e-3, lr_batch=64, lr_schedule="cosine", lr_final=0.1, epochs=1, warmup_steps=4)
    assert cfg.peak_lr(64) == pytest.approx(1e-3) and cfg.peak_lr(1024) == pytest.approx(4e-3)
    assert cfg.peak_lr(16) == pytest.approx(5e-4)
    big = [cfg.lr_at(s, 24, batch_size=256) for s in range(25)]
    plain = [cfg.lr_at(s, 24) for s in range(25)]  # no batch given: --lr as it is
    assert big == pytest.approx([2 * x for x in plain])  # warmup and cosine keep their shape, scaled by √4
    assert plain[3] == pytest.approx(1e-3) and big[24] == pytest.approx(2e-4)
    assert OptimConfig(lr=1e-3).lr_at(5, 10, batch_size=4096) == 1e-3  # lr_batch 0: never scaled


def test_plateau_cuts_the_rate_after_epochs_without_a_better_figure_down_to_its_floor():
    from sat_core.training.schedule import Plateau

    cfg = OptimConfig(lr=1e-3, lr_schedule="plateau", plateau_factor=0.5, plateau_patience=2, lr_final=0.2,
                      patience=0, warmup_steps=2)
    plateau = Plateau.of(cfg)
    rates = []
    for improved in (True, False, True, False, False, False, False, False, False):
        cut = plateau.after_validation(improved)
        rates.append((cut, cfg.lr_at(100, 10, plateau=plateau.share)))
    assert [cut for cut, _ in rates] == [False, False, False, False, True, False, True, False, True]
    assert [lr for _, lr in rates] == pytest.approx([1e-3, 1e-3, 1e-3, 1e-3, 5e-4, 5e-4, 2.5e-4, 2.5e-4, 2e-4])
    assert plateau.after_validation(False) is False and plateau.after_validation(False) is False  # at the floor
    assert cfg.lr_at(0, 10, plateau=0.5) == pytest.approx(2.5e-4)  # the warmup applies too
    restored = Plateau.of(cfg)
    restored.load(plateau.state())
    assert restored == plateau
    with pytest.raises(SatError, match=r"--plateau-patience 3 would never cut the rate: --patience 3"):
        OptimConfig(lr_schedule="plateau", plateau_patience=3, patience=3)
    with pytest.raises(SatError, match="--plateau-factor"):
        OptimConfig(lr_schedule="plateau", plateau_factor=1.5)


def test_a_misspelt_section_is_reported_as_one():
    with pytest.raises(SatError) as caught:
        TrainConfig.from_dict({"model": {"attention": "soft"}, "optimiser": {"lr": 1e-3}})
    message = str(caught.value)
    assert message.startswith("Unknown section 'optimiser' in the config; the sections are data, model, optim, val")
    assert "Did you mean 'optim'?" in message and "field 'model'" not in message
    with pytest.raises(SatError, match="Unknown section 'optimiser'"):  # alone, it is not a flat file either
        TrainConfig.from_dict({"optimiser": {"lr": 1e-3}})
    with pytest.raises(SatError, match="Unknown field 'seeed' in the config.*Did you mean 'seed'"):
        TrainConfig.from_dict({"data": {}, "seeed": 1})


def test_json_values_are_coerced_to_the_declared_types():
    cfg = ModelConfig.from_dict({"small_channels": [8, 16], "dropout": 0, "hard": {"entropy_weight": 1}})
    assert cfg.small_channels == (8, 16) and isinstance(cfg.dropout, float)
    assert isinstance(cfg.hard, HardAttentionConfig) and cfg.hard.entropy_weight == 1.0
    assert PreprocessConfig.from_dict(PreprocessConfig().to_dict()) == PreprocessConfig()


def test_a_section_given_in_part_keeps_its_own_defaults_for_the_rest():
    """A preset's "val": {"beam_size": 3} is validation's decoding (length cap 24) with another beam, not the
    command line's decoding (cap 20); a whole section replaces them all."""
    assert TrainConfig().val.max_len == 24 and DecodeConfig().max_len == 20
    cfg = TrainConfig.from_dict({"val": {"beam_size": 3}, "model": {"hard": {"entropy_weight": 0.5}}})
    assert (cfg.val.beam_size, cfg.val.max_len) == (3, 24)
    assert cfg.model.hard.entropy_weight == 0.5 and cfg.model.hard.baseline_decay == HardAttentionConfig().baseline_decay
    whole = TrainConfig.from_dict({"val": DecodeConfig(max_len=12).to_dict()})
    assert (whole.val.beam_size, whole.val.max_len) == (3, 12)


def test_flat_train_configs_written_before_sections_still_load():
    flat = json.loads(LEGACY.read_text())
    cfg = TrainConfig.from_dict(flat)
    assert cfg.data.dataset == flat["data"] and cfg.data.val_images == flat["val_images"]
    assert cfg.model.dropout == flat["dropout"] and cfg.model.hard.baseline_decay == flat["hard"]["baseline_decay"]
    assert cfg.optim.dsa_lambda == flat["dsa_lambda"] and cfg.optim.max_minutes == flat["max_minutes"]
    assert cfg.val.beam_size == flat["val_beam"] and cfg.val.max_len == flat["val_max_len"]
    assert cfg.encoder_weights == flat["encoder_weights"] and cfg.progress is False
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg  # nested round trip
    with pytest.raises(SatError, match="Unknown TrainConfig field 'learning_rate'"):
        TrainConfig.from_dict({**flat, "learning_rate": 1})


def test_shipped_presets_load():
    for preset in (ROOT / "sat_core" / "presets").glob("*.json"):
        cfg = TrainConfig.from_dict(json.loads(preset.read_text()))
        assert cfg.data.dataset and cfg.out.startswith("runs/")


def test_presets_name_no_retired_option_and_supervised_attention_is_the_only_one_beyond_the_paper():
    from sat_core.config import RETIRED

    retired = {name for fields in RETIRED.values() for name in fields}
    for preset in (ROOT / "sat_core" / "presets").glob("*.json"):
        raw = json.loads(preset.read_text())
        named = {k for section in raw.values() if isinstance(section, dict) for k in section}
        assert not named & retired, preset.name
        cfg = TrainConfig.from_dict(raw)
        assert cfg.model.deep_output and cfg.model.init_activation == "tanh" and cfg.model.gate_size == "scalar"
        assert bool(cfg.optim.attention_lambda) == preset.stem.endswith("_supervised"), preset.name


def test_retired_options_are_not_options_any_more():
    from sat_core.config import RETIRED

    for owner, fields in RETIRED.items():
        current = {f.name for f in dataclasses.fields({"ModelConfig": ModelConfig, "OptimConfig": OptimConfig,
                                                        "DecodeConfig": DecodeConfig}[owner])}
        assert not current & set(fields), owner


def _help_defaults(text: str) -> dict[str, str]:
    """{first flag of an option: the default its help text shows}, from argparse's wrapped help output."""
    body = text.split("\noptions:\n", 1)[1]
    shown = {}
    for entry in re.split(r"\n  (?=--)", "\n" + body):
        found = re.search(r"\[default: ([^\]]*)\]", " ".join(entry.split()))
        if found and entry.strip():
            shown[entry.split()[0].rstrip(",")] = found.group(1)
    return shown


def _expected_defaults(config, prefix: str = "") -> dict[str, str]:
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out.update(_expected_defaults(value, prefix + f.metadata.get("prefix", "")))
        elif not f.metadata.get("derived"):
            name = "--" + (prefix + (f.metadata.get("flag") or f.name)).replace("_", "-")
            out[name] = " ".join(map(str, value)) if isinstance(value, tuple) else str(value)
    return out


def test_train_help_shows_the_dataclass_defaults():
    text = subprocess.run([sys.executable, "-m", "sat_core.train", "--help"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    shown, expected = _help_defaults(text), _expected_defaults(TrainConfig())
    assert len(expected) > 40
    assert {k: shown.get(k) for k in expected} == expected
    assert expected["--lr"] == "0.001" and expected["--val-beam-size"] == "1" and expected["--hard-entropy-weight"] == "0.01"


@pytest.mark.parametrize("module", ["sat_core.evaluate", "sat_core.caption"])
def test_decoding_clis_show_the_decode_defaults(module):
    text = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout
    shown = _help_defaults(text)
    assert {k: shown.get(k) for k in _expected_defaults(DecodeConfig())} == _expected_defaults(DecodeConfig())


def test_explorer_defaults_are_the_decode_defaults():
    from explorer.state import DECODE_WIDGETS, DEFAULTS

    assert {DECODE_WIDGETS[k]: DEFAULTS[k] for k in DECODE_WIDGETS} == {
        name: getattr(DecodeConfig(), name) for name in DECODE_WIDGETS.values()}


def test_flags_override_a_config_file_by_path(tmp_path):
    from sat_core.train import parse_config

    config = tmp_path / "c.json"
    encoder = tmp_path / "encoder.safetensors"  # the trainer checks that the named weights file exists
    encoder.write_bytes(b"")
    config.write_text(json.dumps({**json.loads(LEGACY.read_text()), "encoder_weights": str(encoder)}))
    cfg, resume = parse_config(["--config", str(config), "--lr", "0.01", "--hard-entropy-weight", "0.5",
                                "--val-beam", "2", "--no-gate", "--small-channels", "8", "16"])
    assert resume is None and cfg.optim.lr == 0.01 and cfg.model.hard.entropy_weight == 0.5
    assert cfg.val.beam_size == 2 and cfg.model.gate is False and cfg.model.small_channels == (8, 16)
    assert cfg.model.dropout == 0.3  # from the file
    assert cli.decode_config(_namespace({"decode.beam_size": 4})) == DecodeConfig(beam_size=4)


def _namespace(values):
    import argparse

    ns = argparse.Namespace()
    for k, v in values.items():
        setattr(ns, k, v)
    return ns


def test_a_command_names_itself_as_it_was_started(monkeypatch):
    from sat_core.cli import prog

    monkeypatch.setattr(sys, "argv", ["/venv/bin/sat-ship", "--help"])
    assert prog("sat_core.ship") == "sat-ship"
    monkeypatch.setattr(sys, "argv", ["/repo/sat_core/ship.py", "--help"])  # python -m sat_core.ship
    assert prog("sat_core.ship") == "python -m sat_core.ship"
