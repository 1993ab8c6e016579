"""The scenes checkpoints that ship are the paper's model, trained with the paper's objective and decoded by
plain beam search: no retired option in their configs, no supervised attention, no add-on in their training; every
shipped model measured as its preset decodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sat_core.config import RETIRED, DecodeConfig, ModelConfig, TrainConfig

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"
PRESETS = CHECKPOINTS.parent / "sat_core" / "presets"
PAPER_MODELS = ("scenes_soft", "scenes_hard")


def _config(name: str) -> dict:
    path = CHECKPOINTS / name / "config.json"
    if not path.is_file():
        pytest.skip(f"{name} is not shipped")
    return json.loads(path.read_text())


def _retired_in_use(section: str, data: dict) -> list[str]:
    return [k for k, off in RETIRED[section].items() if k in data and off is not None and data[k] not in off]


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_a_shipped_scenes_model_is_the_papers_and_was_trained_and_decoded_as_the_paper_says(name):
    config = _config(name)
    assert not _retired_in_use("ModelConfig", config["model"])
    model = ModelConfig.from_dict(config["model"])
    assert model.deep_output and model.init_activation == "tanh" and model.attention_activation == "tanh"
    assert model.gate == (model.attention == "soft") or model.attention == "hard"
    train = config["training"]["train_config"]
    for section, key in (("ModelConfig", "model"), ("OptimConfig", "optim"), ("DecodeConfig", "val")):
        assert not _retired_in_use(section, train[key]), f"{name}: {section} add-on in training"
    cfg = TrainConfig.from_dict(train)
    assert cfg.optim.attention_lambda == 0  # supervised attention is not the paper's
    if cfg.init_from:  # started from another shipped model: a paper one, so nothing beyond the paper comes in
        assert Path(cfg.init_from).name in PAPER_MODELS and Path(cfg.init_from).name != name
    if cfg.model.attention == "soft":
        assert cfg.optim.dsa_lambda > 0  # the doubly stochastic penalty
    else:
        assert cfg.model.hard.reinforce and cfg.model.hard.baseline and cfg.model.hard.mix_soft_prob == 0.5
    assert cfg.val == DecodeConfig(beam_size=cfg.val.beam_size, length_norm=cfg.val.length_norm, max_len=cfg.val.max_len)


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_a_shipped_scenes_model_was_measured_off_its_generator(name):
    config = _config(name)
    figures = config["metrics"]["generalisation"]
    assert {"test", "shifted", "hflip", "zoom_out", "brightness", "jpeg", "crop", "grayscale"} <= set(figures)
    assert all(f["empty_captions"] == 0 for f in figures.values())
    assert figures["test"]["n_images"] == 500 and all(f["n_images"] >= 95 for f in figures.values())


@pytest.mark.parametrize("name", (*PAPER_MODELS, "scenes_soft_supervised", "scenes_hard_supervised"))
def test_a_shipped_scenes_model_keeps_the_unsure_mark_its_figures_were_measured_with(name):
    """The mark of its 400 validation captions, the one its metrics' unsure figures used: on the test split the
    flagged share is the share of its records under the mark."""
    from sat_core.evaluation.confidence import stored_reference

    config = _config(name)
    mark = stored_reference(config)
    assert mark is not None and mark.captions == 400 and mark.split == "val" and mark.share == 0.1
    records = json.loads((CHECKPOINTS / name / "eval_records.json").read_text())["records"]
    flagged = sum(r["logprob"] < mark.threshold for r in records) / len(records)
    assert config["metrics"]["confidence"]["unsure"] == pytest.approx(flagged)
    assert config["metrics"]["generalisation"]["test"]["unsure"] == pytest.approx(flagged)


@pytest.mark.parametrize("name", (*PAPER_MODELS, "scenes_soft_supervised", "scenes_hard_supervised", "shapes_soft",
                                  "shapes_hard"))
def test_a_shipped_model_was_measured_at_its_presets_length_cap_and_no_test_caption_reached_it(name):
    """The worlds' captions run to 22 words: at the command line's cap of 20, 2 to 12 of a model's 500 test
    captions stopped mid-phrase. Its figures, its records and the explorer's default all use the preset's cap."""
    config = _config(name)
    preset = TrainConfig.from_dict(json.loads((PRESETS / f"{name}.json").read_text()))
    assert preset.val.max_len > DecodeConfig().max_len
    assert config["metrics"]["max_len"] == preset.val.max_len == config["training"]["train_config"]["val"]["max_len"]
    records = json.loads((CHECKPOINTS / name / "eval_records.json").read_text())["records"]
    assert len(records) == 500 and all(r["finished"] for r in records)
    assert max(len(r["tokens"]) for r in records) < preset.val.max_len
