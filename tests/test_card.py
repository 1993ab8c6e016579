"""sat_core.evaluation.card: training statistics kept in checkpoints; model cards for any evaluated checkpoint."""

from __future__ import annotations

import json
import shutil

import pytest

from sat_core.evaluation.card import RECORDS_FILE, model_card, training_statistics
from sat_core.checkpoint import CARD_FILE, METRICS_FILE, load_checkpoint
from sat_core.evaluation.domain import DomainReference
from sat_core.evaluate import main
from sat_core.evaluation.evaluate import read_records
from tests.test_evaluate import N_TEST, checkpoint, result, world_data  # noqa: F401  (fixtures)


def test_card_prints_counts_as_integers_and_scores_to_three_decimals(result, checkpoint):
    config = load_checkpoint(checkpoint).config
    card = model_card("soft", config, json.loads(json.dumps(result)))  # as read back from disk
    a = result["attention"]
    assert "| attention regions | 196 |" in card and f"| attention n_words | {a['n_words']} |" in card
    assert f"| attention n_grounded_words | {a['n_grounded_words']} |" in card
    assert f"| grounded n | {N_TEST} |" in card
    assert f"| attention correctness | {a['correctness']:.3f} |" in card
    assert f"| CIDEr | {result['corpus']['CIDEr']:.3f} |" in card
    assert (f"## Test split ({N_TEST} images, beam {result['beam']}, length normalisation {result['length_norm']}, "
            f"at most {result['max_len']} words, {result['precision']})") in card


def test_evaluate_card_writes_metrics_records_and_card_into_the_checkpoint(checkpoint, world_data, tmp_path, capsys):
    root, path, _ = world_data
    folder = tmp_path / "mine"
    shutil.copytree(checkpoint, folder)
    assert main(["--checkpoint", str(folder), "--data", str(path), "--images", str(root), "--beam", "1",
                 "--max-len", "6", "--no-meteor", "--device", "cpu", "--out", str(tmp_path / "m.json"), "--card"]) == 0
    assert "MODEL_CARD.md" in capsys.readouterr().out
    loaded = load_checkpoint(folder)
    written = json.loads((tmp_path / "m.json").read_text())
    assert loaded.metrics["corpus"] == written["corpus"] and "records" not in loaded.metrics
    records = read_records(folder / RECORDS_FILE)
    assert records["records"] == written["records"] and records["split"] == "test"
    assert read_records(tmp_path / "m.json")["records"] == written["records"]  # --out's format too
    card = (folder / CARD_FILE).read_text()
    assert card.startswith("# SAT Explorer — `mine`") and f"| CIDEr | {written['corpus']['CIDEr']:.3f} |" in card
    assert (folder / METRICS_FILE).is_file()


def test_records_files_that_are_not_records_are_refused(tmp_path):
    from sat_core.errors import DatasetError

    (tmp_path / "a.json").write_text('{"records": [1, 2]}')
    with pytest.raises(DatasetError, match="holds no evaluation records"):
        read_records(tmp_path / "a.json")
    (tmp_path / "b.json").write_text("[")
    with pytest.raises(DatasetError, match="not a readable records JSON"):
        read_records(tmp_path / "b.json")


def test_training_statistics_describe_the_train_split(world_data):
    _, _, data = world_data
    stats = training_statistics(data)
    reference = DomainReference.from_dict(stats["domain"])
    assert len(reference.features) == len(data.split("train")) and "train split" in reference.source
    from PIL import Image

    assert not reference.check(Image.open(data.images[data.split("test")[0]].path)).far
    assert stats["word_stats"]["counts"]["a"] > 0


@pytest.mark.parametrize("optim, line", [
    ({"optimizer": "adam", "lr": 0.001, "lr_schedule": "cosine", "lr_final": 0.05, "epochs": 16},
     "- Optimiser: adam, learning rate cosine from 0.001 to 5e-05 over 16 epochs."),
    ({"optimizer": "rmsprop", "lr": 0.002, "lr_schedule": "constant", "lr_final": 0.05, "epochs": 9},
     "- Optimiser: rmsprop, learning rate 0.002 throughout."),
])
def test_card_names_the_learning_rate_schedule(optim, line):
    config = {"model": {"attention": "soft"}, "training": {"dataset": "d.json", "epoch": 3, "step": 30,
                                                           "train_config": {"optim": optim}}}
    card = model_card("m", config, {"split": "test"})
    assert line in card.splitlines()


@pytest.mark.parametrize("model, words", [
    ({"encoder": "efficientnet_lite0"}, "(frozen);"),
    ({"encoder": "efficientnet_lite0", "tune_blocks": 3}, "(frozen but for its last 3 blocks, trained with the decoder);"),
    ({"encoder": "efficientnet_lite0", "tune_blocks": 1}, "(frozen but for its last 1 block, trained with the decoder);"),
    ({"encoder": "vgg19", "finetune_encoder": True}, "(fine-tuned);"),
])
def test_card_says_which_part_of_the_encoder_was_trained(model, words):
    card = model_card("m", {"model": {"attention": "soft", **model}}, {"split": "test"})
    line = next(x for x in card.splitlines() if x.startswith("- Encoder:"))
    assert words in line


@pytest.mark.parametrize("planned", [3, 3.47])
def test_card_names_the_schedule_the_run_fitted_to_its_time_budget(planned):
    """A run whose --max-minutes fitted 3 (or 3.47) of the preset's 4 epochs ended its cosine schedule there."""
    optim = {"optimizer": "adam", "lr": 0.001, "lr_schedule": "cosine", "lr_final": 0.05, "epochs": 4}
    config = {"model": {"attention": "soft"}, "training": {"dataset": "d.json", "epoch": 4, "step": 30,
                                                           "planned_epochs": planned, "train_config": {"optim": optim}}}
    assert f"- Optimiser: adam, learning rate cosine from 0.001 to 5e-05 over {planned} epochs." in model_card(
        "m", config, {"split": "test"}).splitlines()


@pytest.mark.parametrize("attention_lambda", [0.0, 0.5])
def test_card_says_when_attention_was_supervised(attention_lambda):
    optim = {"optimizer": "adam", "lr": 0.001, "attention_lambda": attention_lambda}
    config = {"model": {"attention": "soft"}, "training": {"dataset": "d.json", "train_config": {"optim": optim}}}
    lines = [x for x in model_card("m", config, {"split": "test"}).splitlines() if x.startswith("- Attention:")]
    assert lines == ([] if not attention_lambda else [
        "- Attention: supervised towards the object each word names (`--attention-lambda 0.5`, Liu et al., 2017; "
        "not in the paper): α was taught with the world's masks, not learnt from the captions alone."])


def test_card_says_how_much_data_what_chose_the_epoch_and_how_long_it_trained():
    optim = {"optimizer": "adam", "lr": 0.001, "lr_schedule": "plateau", "plateau_factor": 0.5, "plateau_patience": 2,
             "lr_final": 0.05, "warmup_steps": 100, "select_metric": "cider"}
    training = {"dataset": "d.json", "epoch": 3, "step": 30, "train_config": {"optim": optim},
                "images": {"train": 8000, "val": 400}, "captions": 40000, "processes": 2,
                "selection": {"metric": "CIDEr", "split": "val", "best": 3.1}, "train_minutes": 42.04,
                "setup_minutes": 3.1}
    lines = model_card("m", {"model": {"attention": "soft"}, "training": training}, {"split": "test"}).splitlines()
    assert "- Size: 8,000 training images with 40,000 captions; validation on 400 images of the val split." in lines
    assert "- Selected by: validation CIDEr on the val split (best 3.100)." in lines
    assert ("- Training time: 42.0 min of training and validation, after 3.1 min reading and encoding the images, "
            "over 2 processes.") in lines
    assert ("- Optimiser: adam, learning rate 0.001, times 0.5 after every 2 epoch(s) without a better validation "
            "CIDEr, down to 5e-05, after a linear warmup over its first 100 steps.") in lines


def test_a_trained_checkpoint_carries_what_its_card_says_of_the_run(tmp_path):
    from sat_core import checkpoint as ckpt
    from sat_core import train
    from tests.fixtures_world import make_dataset, train_args

    data, images = make_dataset(tmp_path / "data")
    assert train.main(train_args(data, images, tmp_path / "run", "--epochs", "1", "--select-metric", "cider",
                                 "--log-every", "0")) == 0
    config = ckpt.load_checkpoint(tmp_path / "run" / "best").config
    lines = model_card("best", config, {"split": "test"}).splitlines()
    assert "- Size: 4 training images with 4 captions; validation on 4 images of the val split." in lines
    assert any(x.startswith("- Selected by: validation CIDEr on the val split (best ") for x in lines)
    assert any(x.startswith("- Training time: ") and "min of training and validation" in x for x in lines)


def test_card_shows_the_unsure_captions_and_their_cider_beside_the_others(result, checkpoint):
    config = load_checkpoint(checkpoint).config
    unsure = {"threshold": -5.0, "share": 0.1, "n": 10, "unsure": 0.3, "CIDEr_unsure": 1.25, "CIDEr_others": 2.5}
    card = model_card("soft", config, {**json.loads(json.dumps(result)), "confidence": unsure})
    assert "| unsure captions | 0.300 |" in card
    assert "| mean CIDEr of the unsure captions | 1.250 |" in card and "| mean CIDEr of the others | 2.500 |" in card
    assert "unsure captions" not in model_card("soft", config, json.loads(json.dumps(result)))
