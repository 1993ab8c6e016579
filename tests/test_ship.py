"""python -m sat_core.ship: every name has a preset that loads, and its card is the generic one plus its world."""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from sat_core import ship
from sat_core.config import TrainConfig
from sat_core.data.karpathy import KarpathyData
from sat_core.errors import SatError

METRICS = {"training": {"epochs": 2, "train_minutes": 1.5, "captions_per_s": 90.0, "best_val_bleu4": 0.4,
                        "best_epoch": 2},
           "split": "test", "n_images": 5, "beam": 3, "corpus": {"BLEU-4": 0.4}, "grounded": {"recall": 0.5}}


@pytest.mark.parametrize("name, world, encoder", [
    ("shapes_soft", "embedded synthetic world", "small CNN"),
    ("scenes_hard", "embedded scenes world", "EfficientNet-Lite0"),
])
def test_card_says_which_world_and_encoder_then_the_generic_sections(name, world, encoder):
    cfg = TrainConfig.from_dict(json.loads(ship.preset_path(name).read_text()))
    text = ship.model_card(name, cfg, {"model": cfg.model.to_dict()}, METRICS)
    assert world in text and f"- Encoder: {encoder}" in text
    assert f"preset `sat_core/presets/{ship.preset_path(name).name}`" in text
    assert "## Model" in text and "| grounded recall | 0.500 |" in text  # from sat_core.evaluation.card


def test_every_name_has_a_preset_of_its_world():
    for name in ship.NAMES:
        cfg = TrainConfig.from_dict(json.loads(ship.preset_path(name).read_text()))
        scenes = name.startswith("scenes_")
        assert cfg.model.encoder == ("efficientnet_lite0" if scenes else "small")
        assert cfg.data.dataset.startswith("data/scenes" if scenes else "data/world/")


def test_scenes_card_names_the_annotations_the_preset_trains_on():
    model = {"encoder": "efficientnet_lite0", "feature_dim": 112}
    plain = ship._scenes_encoder(TrainConfig.from_dict({"model": model}))
    assert plain.endswith("stride-16 stage → 14×14×112 annotations at 224 px.")
    assert ", frozen, stride-16" in plain
    tuned = ship._scenes_encoder(TrainConfig.from_dict({"model": {**model, "tune_blocks": 3}}))
    assert "frozen but for its last 3 blocks before the tap, trained with the decoder, stride-16" in tuned


def test_a_scenes_world_in_another_caption_order_is_refused_with_what_to_do(tmp_path):
    from sat_core.errors import SatError
    from sat_core.worlds.scenes import VERSION

    folder = tmp_path / "scenes"
    folder.mkdir()
    cfg = TrainConfig.from_dict({"data": {"dataset": str(folder / "dataset.json"), "images": str(folder)}})
    (folder / "dataset.json").write_text(json.dumps({"kind": "scenes", "images": []}))  # written before the key
    with pytest.raises(SatError, match=r"random order.*--caption-order largest_first.*Move .*scenes aside"):
        ship.ensure_world(cfg, "scenes")
    (folder / "dataset.json").write_text(json.dumps({"kind": "scenes", "caption_order": "left_to_right",
                                                     "version": VERSION, "images": []}))
    with pytest.raises(SatError, match=r"left_to_right order.*--caption-order largest_first"):
        ship.ensure_world(cfg, "scenes", ship.CAPTION_ORDER["scenes_soft"])
    ship.ensure_world(cfg, "scenes", "left_to_right")  # a preset on the left-to-right world: used as it is
    (folder / "dataset.json").write_text(json.dumps({"kind": "scenes", "caption_order": "largest_first",
                                                     "images": []}))  # the world before surface styles
    with pytest.raises(SatError,
                       match=rf"another version of the scenes world \(version 1, this one is {VERSION}\).*Move"):
        ship.ensure_world(cfg, "scenes", "largest_first")
    (folder / "dataset.json").write_text(json.dumps({"kind": "scenes", "caption_order": "largest_first",
                                                     "version": VERSION, "shifted": True, "images": []}))
    with pytest.raises(SatError, match=r"is the shifted split"):
        ship.ensure_world(cfg, "scenes", "largest_first")
    (folder / "dataset.json").write_text(json.dumps({"kind": "scenes", "caption_order": "largest_first",
                                                     "version": VERSION, "images": []}))
    ship.ensure_world(cfg, "scenes", "largest_first")
    assert json.loads((folder / "dataset.json").read_text())["images"] == []
    with pytest.raises(SatError, match=r"largest_first order.*--caption-order left_to_right"):
        ship.ensure_world(cfg, "scenes", "left_to_right")


def test_each_scenes_preset_trains_on_its_own_world_folder_in_its_caption_order(tmp_path, monkeypatch):
    from sat_core.worlds import writer

    folders = {}
    for name, order in ship.CAPTION_ORDER.items():
        cfg = TrainConfig.from_dict(json.loads(ship.preset_path(name).read_text()))
        assert Path(cfg.data.dataset).parent == Path(cfg.data.images)
        folders[name] = cfg.data.images
        assert (cfg.data.images == "data/scenes") == (order == writer.SHIPPED_CAPTION_ORDER)  # the default world
        made = []
        monkeypatch.setattr(writer, "generate", lambda out, *a, **k: made.append((str(out), k)))
        cfg = TrainConfig.from_dict({"data": {"dataset": str(tmp_path / name / "dataset.json"),
                                              "images": str(tmp_path / name)}})
        ship.ensure_world(cfg, "scenes", order)  # missing: generated in the preset's order
        assert made == [(str(tmp_path / name), {"seed": 0, "kind": "scenes", "caption_order": order})]
    orders = {folders[name]: set() for name in folders}
    for name, order in ship.CAPTION_ORDER.items():
        orders[folders[name]].add(order)
    assert all(len(o) == 1 for o in orders.values())  # two orders never share one folder
    assert folders["scenes_soft"] == folders["scenes_hard"] == "data/scenes"  # both models caption one world


def test_the_scenes_world_names_the_largest_group_first_unless_told_otherwise(tmp_path):
    from sat_core.worlds import writer

    largest = json.loads(writer.generate(tmp_path / "a", 2, 0, 0, seed=3, workers=1, kind="scenes").read_text())
    rand = json.loads(writer.generate(tmp_path / "b", 2, 0, 0, seed=3, workers=1, kind="scenes",
                                     caption_order="random").read_text())
    left = json.loads(writer.generate(tmp_path / "c", 2, 0, 0, seed=3, workers=1, kind="scenes",
                                     caption_order="left_to_right").read_text())
    assert [d["caption_order"] for d in (largest, rand, left)] == ["largest_first", "random", "left_to_right"]
    assert [im["objects"] for im in largest["images"]] == [im["objects"] for im in rand["images"]]
    assert [im["objects"] for im in largest["images"]] == [im["objects"] for im in left["images"]]


def test_package_evaluates_the_weights_exactly_as_shipped(tmp_path, vocab):
    """The figures of a shipped checkpoint describe its fp16 file, not the run's fp32 weights."""
    import torch

    from sat_core.checkpoint import load_checkpoint, save_checkpoint
    from sat_core.config import PreprocessConfig
    from sat_core.models.captioner import Captioner
    from sat_core.ship import SHIPPED_DTYPE, as_shipped
    from tests.conftest import tiny_config

    torch.manual_seed(0)
    config = tiny_config(len(vocab))
    model = Captioner(config).eval()
    save_checkpoint(tmp_path / "c", model, model_config=config, vocab=vocab, preprocess=PreprocessConfig(),
                    dtype=SHIPPED_DTYPE)
    shipped = load_checkpoint(tmp_path / "c").model.state_dict()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rounded = as_shipped(model).state_dict()
    assert any(not torch.equal(before[k], rounded[k]) for k in before)  # fp32 weights did move
    assert all(torch.equal(rounded[k], shipped[k]) for k in shipped)


def test_the_training_gets_what_the_budget_leaves_after_the_world_and_before_the_evaluation():
    assert ship.training_minutes(45, 2.5, 40) == pytest.approx(45 - 2.5 - ship.EVALUATION_MINUTES)
    assert ship.training_minutes(45, 0.1, 30) == 30  # the preset's own cap, when it is less
    assert ship.training_minutes(45, 0, 42) == 42  # the scenes presets' 42 (setup included) fit when the world is there
    assert ship.training_minutes(45, 0, 0) == pytest.approx(45 - ship.EVALUATION_MINUTES)  # no cap of its own
    with pytest.raises(SatError, match=r"--minutes 5 leaves 0\.0 min to train after 2\.5 min.*larger --minutes"):
        ship.training_minutes(5, 2.5, 40)


def test_ship_hands_the_training_its_share_of_the_budget_and_says_how_long_it_took(monkeypatch, capsys, tmp_path):
    calls = []
    monkeypatch.setattr(ship, "ensure_world", lambda *a, **k: None)
    monkeypatch.setattr(ship, "ensure_encoder", lambda cfg: None)
    caches = []
    monkeypatch.setattr(ship, "train", lambda preset, minutes, overwrite=False, cache=None:
                        caches.append(cache) or calls.append((preset.name, minutes)) or minutes)
    budgets = []
    monkeypatch.setattr(ship, "package", lambda *a, **k: budgets.append(k["minutes"]) or METRICS)
    monkeypatch.chdir(tmp_path)  # the presets' run directories (runs/NAME) are fresh there
    (tmp_path / "data" / "scenes").mkdir(parents=True)
    (tmp_path / "data" / "scenes" / "dataset.json").write_text(json.dumps({"images": [{}] * 10}))
    assert ship.main(["scenes_soft", "--minutes", "20", "--out", str(tmp_path)]) == 0
    [(preset, minutes)] = calls
    assert caches == [Path("data/cache")]  # the images and frozen blocks' output kept for the next build
    assert budgets == [20.0]  # the card's command names the budget it was built with
    assert preset == "scenes_soft.json"
    # below the preset's 42: the budget less the evaluation, the sets off the generator's included
    reserve = ship.EVALUATION_MINUTES + ship.GENERALISATION_MINUTES
    assert 20 - reserve - 0.1 < minutes <= 20 - reserve
    assert f"ship: {tmp_path / 'scenes_soft'} written in 0.0 min (budget 20)" in capsys.readouterr().out
    assert ship.main(["scenes_soft", "--minutes", "5"]) == 2  # no time left to train: refused, said why
    assert "--minutes 5 leaves 0.5 min to train" in capsys.readouterr().err
    calls.clear()
    assert ship.main(["shapes_soft", "--minutes", "20", "--out", str(tmp_path)]) == 0  # no such sets for shapes
    assert 20 - ship.EVALUATION_MINUTES - 0.1 < calls[0][1] <= 20 - ship.EVALUATION_MINUTES
    budgets.clear()  # a repackage names a budget only when told it; a build without one names the default
    assert ship.main(["shapes_soft", "--repackage", "--out", str(tmp_path)]) == 0
    assert ship.main(["shapes_soft", "--repackage", "--minutes", "38", "--out", str(tmp_path)]) == 0
    assert ship.main(["shapes_soft", "--skip-train", "--out", str(tmp_path)]) == 0
    assert budgets == [None, 38.0, None]


def test_the_card_says_how_long_the_setup_took_when_the_log_kept_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"event": "setup", "seconds": 120.0, "images": 10},
             {"epoch": 1, "time_s": 60.0, "captions_per_s": 50.0, "nll": 1.0, "val": {"BLEU-4": 0.3}}]
    (run / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = ship.training_summary(run)
    assert summary["setup_minutes"] == 2.0 and summary["train_minutes"] == 1.0
    cfg = TrainConfig.from_dict(json.loads(ship.preset_path("scenes_soft").read_text()))
    text = ship.model_card("scenes_soft", cfg, {}, {**METRICS, "training": {**METRICS["training"], **summary}})
    assert "1 epoch, 1.0 min after 2.0 min reading the images and running the encoder's frozen blocks once" in text
    frozen = TrainConfig.from_dict({**cfg.to_dict(), "model": {**cfg.to_dict()["model"], "tune_blocks": 0}})
    text = ship.model_card("scenes_soft", frozen, {}, {**METRICS, "training": {**METRICS["training"], **summary}})
    assert "1 epoch, 1.0 min after 2.0 min reading the images and running the frozen encoder once" in text
    (run / "log.jsonl").write_text(json.dumps(lines[1]) + "\n")  # a log from before setups were kept
    assert "setup_minutes" not in ship.training_summary(run)


def test_the_ship_generates_a_scenes_world_three_times_the_shapes_one_and_the_card_counts_the_real_one(
        tmp_path, monkeypatch, capsys):
    from sat_core.worlds import writer

    made = []
    monkeypatch.setattr(writer, "generate", lambda out, *a, **k: made.append((Path(out).name, a)))
    for kind in ("scenes", "shapes"):
        cfg = TrainConfig.from_dict({"data": {"dataset": str(tmp_path / kind / "dataset.json"),
                                              "images": str(tmp_path / kind)}})
        ship.ensure_world(cfg, kind)
    assert made == [("scenes", (24000, 400, 500)), ("shapes", (8000, 400, 500))]
    said = capsys.readouterr().out.splitlines()  # minutes of work, said before they start
    assert said[0] == (f"ship: writing the scenes world into {tmp_path / 'scenes'} (24,000 training, 400 validation "
                       "and 500 test scenes; about 5 minutes on 2 cores)…")
    assert said[1].startswith("ship: the world written in 0.0 min") and len(said) == 4
    dataset = KarpathyData([], tmp_path / "small.json", tmp_path, {"train": 2, "val": 1, "test": 1}, seed=7)
    assert ship.world_summary(dataset, "scenes") == "2 train / 1 val / 1 test images, seed 7"
    assert ship.world_summary(None, "scenes") == "24000 train / 400 val / 500 test images, seed 0"
    assert ship.world_summary(dataset, "scenes", 1).startswith("the first 1 of 2 train / 1 val")


def test_the_card_says_which_epoch_was_shipped_when_it_is_the_last_not_the_best(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"epoch": e, "time_s": 60.0, "captions_per_s": 50.0, "nll": 1.0, "val": {"BLEU-4": b}}
             for e, b in ((1, 0.3), (2, 0.5), (3, 0.49))]
    (run / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    best, last = ship.training_summary(run), ship.training_summary(run, "last")
    assert (best["best_epoch"], best["shipped_epoch"]) == (2, 2)
    assert (last["best_epoch"], last["shipped_epoch"], last["shipped_checkpoint"]) == (2, 3, "last")
    assert "planned_epochs" not in best  # the log has no re-planned schedule
    (run / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [
        lines[0], {"event": "schedule", "epoch": 1, "epochs": 3}, *lines[1:]]))
    assert ship.training_summary(run)["planned_epochs"] == 3
    cfg = TrainConfig.from_dict(json.loads(ship.preset_path("scenes_soft").read_text()))
    best_card, last_card = (ship.model_card("scenes_soft", cfg, {}, {**METRICS, "training": {**METRICS["training"], **s}})
                            for s in (best, last))
    assert "best validation BLEU-4 0.5 at epoch 2; shipped: the last epoch (3)." in last_card
    assert "shipped: the last epoch" not in best_card and "best validation BLEU-4 0.5 at epoch 2." in best_card
    assert "- Training: 3 epochs, 3.0 min" in best_card  # no schedule event: the epochs run
    for plan, words in ((3, "3 epochs (the 4 planned, "), (2.75, "2.75 epochs (the 4 planned, fitted to the time the "
                                                                 "command leaves for training), 3.0 min")):
        (run / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [
            lines[0], {"event": "schedule", "epoch": 1, "epochs": plan}, *lines[1:]]))
        fitted = {**METRICS["training"], **ship.training_summary(run)}
        assert f"- Training: {words}" in ship.model_card("scenes_soft", cfg, {}, {**METRICS, "training": fitted})


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_a_supervised_preset_is_its_shipped_preset_plus_attention_lambda(kind):
    plain = json.loads(ship.preset_path(f"scenes_{kind}").read_text())
    supervised = json.loads(ship.preset_path(f"scenes_{kind}_supervised").read_text())
    assert supervised["optim"].pop("attention_lambda") == 1.0 and "attention_lambda" not in plain["optim"]
    assert supervised.pop("out") == f"runs/scenes_{kind}_supervised" and plain.pop("out") == f"runs/scenes_{kind}"
    assert supervised == plain  # the paper's model plus supervised attention, nothing else


def test_the_scenes_card_shows_the_sets_off_the_generator_beside_the_test_split_and_what_was_chosen_on_what(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"epoch": k, "time_s": 60.0, "captions_per_s": 50.0, "nll": 1.0, "val": {"BLEU-4": b, "CIDEr": c}}
             for k, b, c in [(1, 0.3, 2.0), (2, 0.5, 3.5), (3, 0.45, 3.2)]]
    (run / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = ship.training_summary(run)
    assert summary["best_epoch"] == 2 and [v["epoch"] for v in summary["validation"]] == [1, 2, 3]
    row = {"n_images": 500, "precision": 0.96, "recall": 0.91, "category_recall": 0.93, "empty_captions": 0,
           "alpha_entropy": 3.5, "warned": 0.02, "erring": 0.25, "warned_erring": 0.04, "warned_right": 0.01,
           "unsure": 0.12, "unsure_erring": 0.37, "unsure_right": 0.06}
    figures = {"test": row, "shifted": {**row, "recall": 0.8}, "hflip": {**row, "mirror": {
        "stated": 40, "surviving": 30, "mirrored": 27, "share": 0.9}}}
    cfg = TrainConfig.from_dict(json.loads(ship.preset_path("scenes_hard").read_text()))
    metrics = {**METRICS, "generalisation": figures, "training": {**METRICS["training"], **summary}}
    text = ship.model_card("scenes_hard", cfg, {}, metrics)
    assert "| | test | shifted | hflip |" in text and "| object recall | 0.910 | 0.800 | 0.910 |" in text
    assert "| empty captions | 0 | 0 | 0 |" in text and "| count accuracy | n/a | n/a | n/a |" in text
    assert "| captions with an object wrong | 0.250 | 0.250 | 0.250 |" in text
    assert "| warned, of those | 0.040 |" in text and "| warned, of the others | 0.010 |" in text
    assert "| unsure captions | 0.120 |" in text and "| unsure, of the wrong ones | 0.370 |" in text
    assert "| unsure, of the others | 0.060 |" in text and "all but 10% of its validation captions" in text
    assert "- Command: `python -m sat_core.ship scenes_hard` (preset" in text  # no budget recorded: the default
    assert "`python -m sat_core.ship scenes_hard --minutes 38` (preset" in ship.model_card(
        "scenes_hard", cfg, {}, {**metrics, "training": {**metrics["training"], "ship_minutes": 38.0}})
    assert "`python -m sat_core.ship scenes_hard` (preset" in ship.model_card(
        "scenes_hard", cfg, {}, {**metrics, "training": {**metrics["training"], "ship_minutes": 45.0}})
    assert "27 of the 30 left/right statements" in text and "(0.900; 40 stated" in text
    assert "| 2 | 0.500 | 3.500 |" in text and "## Validation (what the shipped epoch was chosen on)" in text
    assert "Fixed before training and read on no split" in text
    assert f"λ_r = {cfg.model.hard.reinforce_weight:g}" in text and "doubly stochastic" not in text
    assert "Initialised from `scenes_soft`" in text and "starting from the shipped `scenes_soft`'s weights" in text
    soft = ship.model_card("scenes_soft", TrainConfig.from_dict(json.loads(ship.preset_path("scenes_soft").read_text())),
                           {}, metrics)
    assert "doubly stochastic penalty (λ = 1," in soft and "REINFORCE" not in soft
    assert "nothing added" in soft and "not in the paper" not in soft
    assert "Initialised from" not in soft
    assert "frozen but for its last 3 blocks, trained with the decoder at 0.3 of its learning rate" in soft
    assert "last 3 blocks trained against a frozen encoder by validation" in soft
    assert "those blocks at 0.3 of the decoder's learning rate against 0.1 by category recall" in soft
    assert "a cosine schedule planned over 4 epochs" in soft and "its training-only surface styles" in soft
    assert "a cosine schedule over four epochs against three, on the same world, by the same figures; a length" in soft
    assert ("a length cap of 24 words against the command line's 20 (the world's captions run to 22 words), by the "
            "validation captions cut at it, BLEU-4 and precision / recall (docs/EXPERIMENTS.md)") in soft
    assert "read after those choices, once for each model's weights and decoding" in soft
    assert "four epochs against three, on the same world, by the same figures; batches of" in text
    assert "training scenes drawing the world's training-only surface styles, against the world without them" in soft
    assert "(with `scenes_soft`, whose weights this model starts from)" in text
    assert "(with `scenes_soft`, whose weights" not in soft
    preset = json.loads(ship.preset_path("scenes_hard").read_text())
    frozen = ship.model_card("scenes_hard", TrainConfig.from_dict({**preset, "model": {**preset["model"],
                                                                                     "tune_blocks": 0}}), {}, metrics)
    assert "frozen (as the paper froze its VGG)" in frozen and "blocks trained against" not in frozen
    assert "of the decoder's learning rate against 0.1" not in frozen  # no rate is chosen for blocks never trained
    assert "frozen (as the paper froze its VGG)" not in soft
    for kind in ("soft", "hard"):  # a supervised card never calls itself the paper's objective alone
        name = f"scenes_{kind}_supervised"
        card = ship.model_card(name, TrainConfig.from_dict(json.loads(ship.preset_path(name).read_text())), {}, metrics)
        assert "nothing added" not in card and "plus one term **not in the paper**: supervised attention" in card
        assert f"for `scenes_{kind}` (taken over unchanged)" in card
    plain = ship.model_card("shapes_soft", TrainConfig.from_dict(json.loads(ship.preset_path("shapes_soft").read_text())),
                            {}, METRICS)
    assert "Off the generator" not in plain and "## Choices" not in plain


def test_the_generalisation_sets_are_written_beside_the_world_when_missing_or_older(tmp_path, monkeypatch):
    from sat_core.worlds import writer

    monkeypatch.setattr(ship, "GENERALISATION_SCENES", 4)
    root = tmp_path / "data"
    writer.generate(root / "scenes", 6, 2, 4, seed=0, kind="scenes")
    cfg = TrainConfig.from_dict({"data": {"dataset": str(root / "scenes" / "dataset.json"),
                                          "images": str(root / "scenes")}})
    shifted, suite = ship.ensure_generalisation_sets(cfg)
    assert shifted == root / "scenes_shifted" / "dataset.json"
    assert json.loads(shifted.read_text())["shifted"] is True
    assert sorted(p.parent.name for p in suite.glob("*/dataset.json")) == sorted(
        ["hflip", "zoom_out", "brightness", "jpeg", "crop", "grayscale"])
    stamp = (suite / "hflip" / "dataset.json").stat().st_mtime_ns
    ship.ensure_generalisation_sets(cfg)  # up to date: left as it is
    assert (suite / "hflip" / "dataset.json").stat().st_mtime_ns == stamp


def test_a_ship_into_a_run_directory_that_holds_a_run_is_refused_unless_overwrite(monkeypatch, capsys, tmp_path):
    """An earlier ship's training is never replaced silently: refused before the world, or --overwrite passed on."""
    calls = []
    monkeypatch.setattr(ship, "ensure_world", lambda *a, **k: calls.append("world"))
    monkeypatch.setattr(ship, "ensure_encoder", lambda cfg: None)
    monkeypatch.setattr(ship, "train", lambda preset, minutes, overwrite=False, cache=None:
                        calls.append(("train", overwrite)))
    monkeypatch.setattr(ship, "package", lambda *a, **k: METRICS)
    monkeypatch.chdir(tmp_path)
    run = tmp_path / json.loads(ship.preset_path("shapes_soft").read_text())["out"]  # runs/world_soft
    (run / "best").mkdir(parents=True)
    assert ship.main(["shapes_soft", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "runs/world_soft holds an earlier training run" in err and "--skip-train" in err and "--overwrite" in err
    assert calls == [], "refused before generating anything"
    assert ship.main(["shapes_soft", "--out", str(tmp_path / "out"), "--overwrite"]) == 0
    assert calls == ["world", ("train", True)]
    calls.clear()
    assert ship.main(["shapes_soft", "--out", str(tmp_path / "out"), "--skip-train"]) == 0
    assert calls == ["world"]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        ship.main(["--help"])
    assert "(runs/NAME) holds an earlier run" in " ".join(capsys.readouterr().out.split())


def test_a_ship_whose_preset_starts_from_a_checkpoint_that_is_not_there_says_which_to_ship_first(
        monkeypatch, capsys, tmp_path):
    calls = []
    monkeypatch.setattr(ship, "ensure_world", lambda *a, **k: calls.append("world"))
    monkeypatch.setattr(ship, "train", lambda *a, **k: calls.append("train"))
    monkeypatch.chdir(tmp_path)  # no checkpoints/scenes_soft here
    assert json.loads(ship.preset_path("scenes_hard").read_text())["init_from"] == "checkpoints/scenes_soft"
    assert ship.main(["scenes_hard", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "checkpoints/scenes_soft, which is not there" in err and "python -m sat_core.ship scenes_soft" in err
    assert calls == [], "refused before generating anything"


def test_the_ship_keeps_the_images_in_a_cache_beside_the_world_when_the_disk_has_room(tmp_path, monkeypatch, capsys):
    (tmp_path / "scenes").mkdir()
    (tmp_path / "scenes" / "dataset.json").write_text(json.dumps({"images": [{}] * 1000}))
    cfg = TrainConfig.from_dict({"data": {"dataset": str(tmp_path / "scenes" / "dataset.json"),
                                          "images": str(tmp_path / "scenes"), "image_size": 224}})
    assert ship.cache_folder(cfg) == tmp_path / "cache"  # not there yet: the first build writes it
    dead = subprocess.Popen(["true"])
    dead.wait()
    killed = tmp_path / "cache" / f"images-0123.tmp-{socket.gethostname()}-{dead.pid}"
    killed.mkdir(parents=True)
    assert ship.cache_folder(cfg) == tmp_path / "cache" and not killed.exists()  # what no build reads, deleted
    assert f"cache: removed {killed} (0.00 GiB): left by a writer that was killed" in capsys.readouterr().out
    assert ship.cache_folder(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, cache="elsewhere"))) is None
    need = 2 * 1000 * 3 * 224**2
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 * need, 0, need - 1))
    assert ship.cache_folder(cfg) is None  # short of room: the build reads the images into RAM, and says so
    said = capsys.readouterr().out
    assert f"ship: not keeping the images in {tmp_path / 'cache'}: The preprocessing cache does not fit" in said
    assert "take 0.28 GiB" in said and "only 0.28 GiB are free" in said and "every build reads and encodes" in said
    (tmp_path / "scenes" / "dataset.json").write_text("{")
    assert ship.cache_folder(cfg) is None  # the trainer says what is wrong with the dataset
