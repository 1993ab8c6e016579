"""Generalisation figures: the mirror figure and category recall on hand-made captions, and
``python -m sat_core.evaluate --generalisation`` writing one row per set, each equal to evaluating that set."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from sat_core import cli
from sat_core.worlds import writer
from sat_core.worlds.scenes import transforms
from sat_core.checkpoint import load_checkpoint, save_checkpoint
from sat_core.config import DecodeConfig, PreprocessConfig
from sat_core.data.karpathy import ImageRecord, KarpathyData, build_vocab, load_karpathy
from sat_core.evaluate import build_parser, main, summary_lines
from sat_core.evaluation.evaluate import evaluate
from sat_core.evaluation.generalisation import (
    category_recall, erring, left_right_statements, mirror_agreement, report, set_figures, unsure_images,
    warned_images, warning_figures,
)
from sat_core.evaluation.grounding import ground
from sat_core.models.captioner import Captioner
from tests.conftest import tiny_config


def _thing(oid: int, category: str, colour: str, x: int) -> dict:
    box = [x, 120, 50, 50]
    return {"id": oid, "category": category, "colour": colour, "layer": "ground", "bbox": box, "full_bbox": box,
            "foot": 170, "centroid": [x + 25.0, 145.0], "area": 2500}


# a brown dog (0) left of a red car (1) and another brown dog (2) on the far left
SCENE = [_thing(0, "dog", "brown", 60), _thing(1, "car", "red", 150), _thing(2, "dog", "brown", 0)]


def _g(caption: str, objects=SCENE[:2]) -> dict:
    return ground(caption.split(), objects).to_dict()


def test_left_right_statements_read_pairs_of_objects():
    assert left_right_statements(_g("a dog to the left of a car")) == [(0, 1)]
    assert left_right_statements(_g("a car on the right of a dog")) == [(0, 1)]
    assert left_right_statements(_g("a dog above a car")) == []
    assert left_right_statements(_g("a dog left of a cat")) == [], "a hallucinated object places nothing"
    assert sorted(left_right_statements(_g("two dogs left of a car", SCENE))) == [(0, 1), (2, 1)]


def test_mirror_agreement_on_hand_made_captions():
    pairs = [
        (_g("a dog to the left of a car"), _g("a car to the left of a dog")),  # mirrored
        (_g("a dog left of a car"), _g("a dog on the right of a car")),  # mirrored, other wording
        (_g("a car on the right of a dog"), _g("a dog left of a car")),  # kept its direction
        (_g("a dog left of a car"), _g("a dog and a car")),  # the pair is not placed again
        (_g("a dog above a car"), _g("a car above a dog")),  # not left/right
    ]
    assert mirror_agreement(pairs) == {"stated": 4, "surviving": 3, "mirrored": 2, "share": pytest.approx(2 / 3)}
    assert mirror_agreement([])["share"] is None


def test_category_recall_ignores_colour():
    record = ImageRecord(path=None, split="test", sentences=[["a"]], raw=["a"], id=7, karpathy_split="test",
                         objects=SCENE[:2])
    data = KarpathyData([record], json_path=None, images_dir=None)
    records = [{"image_id": 7, "grounding": _g("a red dog and a blue car")}]
    assert records[0]["grounding"]["recall"] == 0.0
    assert category_recall(records, data) == 1.0
    assert category_recall([{"image_id": 7, "grounding": _g("a red dog")}], data) == 0.5


@pytest.fixture(scope="module")
def world_and_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("generalisation")
    path = writer.generate(root / "scenes", 6, 0, 5, seed=2, workers=1, kind="scenes")
    shifted = writer.generate(root / "shifted", 0, 0, 3, seed=9, workers=1, kind="scenes")
    transforms.write_suite(path, path.parent, root / "suite")
    data = load_karpathy(path, path.parent)
    vocab = build_vocab(data, min_count=1)
    torch.manual_seed(0)
    config = tiny_config(len(vocab), attention="soft")
    checkpoint = root / "ckpt"
    save_checkpoint(checkpoint, Captioner(config).eval(), model_config=config, vocab=vocab,
                    preprocess=PreprocessConfig(112))
    return root, path, shifted, checkpoint


def test_evaluate_cli_writes_the_figures_of_every_set(world_and_model, tmp_path, capsys):
    root, path, shifted, checkpoint = world_and_model
    out = tmp_path / "metrics.json"
    args = ["--checkpoint", str(checkpoint), "--data", str(path), "--images", str(path.parent), "--beam", "2",
            "--max-len", "6", "--no-meteor", "--device", "cpu", "--out", str(out),
            "--generalisation", str(root / "suite"), "--shifted", str(shifted)]
    code = main(args)
    assert code == 0
    figures = json.loads(out.read_text())["generalisation"]
    assert list(figures) == ["test", "shifted", *transforms.NAMES]
    keys = {"n_images", "BLEU-4", "CIDEr", "precision", "recall", "category_recall", "count_accuracy",
            "relation_accuracy", "attention_correctness", "attention_ratio", "alpha_entropy", "empty_captions"}
    assert all(keys <= set(f) for f in figures.values())
    assert figures["shifted"]["n_images"] == 3 and figures["hflip"]["n_images"] == 5
    assert set(figures["hflip"]["mirror"]) == {"stated", "surviving", "mirrored", "share"}
    printed = capsys.readouterr().out
    assert all(any(line.startswith(name + " ") for line in printed.splitlines()) for name in figures)
    # each row is what evaluating that set gives: the one evaluation path
    loaded = load_checkpoint(checkpoint)
    cfg = cli.decode_config(build_parser().parse_args(args), loaded.decode_defaults())
    for name, json_path in [("test", path), ("crop", root / "suite" / "crop" / "dataset.json")]:
        data = load_karpathy(json_path, json_path.parent)
        direct = set_figures(evaluate(loaded, data, "test", cfg, meteor=False), data)
        row = {k: v for k, v in figures[name].items() if k not in NOTICE_KEYS}
        assert row == pytest.approx(direct, nan_ok=True)
    # this checkpoint stored no domain statistics nor confidence reference: nothing of the notices is measurable
    assert all(f[k] is None for f in figures.values() for k in NOTICE_KEYS)
    assert all(np.isfinite(f["alpha_entropy"]) for f in figures.values())


NOTICE_KEYS = ("warned", "erring", "warned_erring", "warned_right", "unsure", "unsure_erring", "unsure_right")


def _record(image_id: int, caption: str, objects=SCENE[:2]) -> dict:
    return {"image_id": image_id, "grounding": _g(caption, objects)}


def test_erring_is_any_object_missed_misnamed_added_or_overcounted():
    assert erring(_record(0, "a brown dog left of a red car")) is False
    assert erring(_record(0, "a brown dog")) is True  # the car is missed
    assert erring(_record(0, "a brown dog and a blue car")) is True  # the car's colour is wrong
    assert erring(_record(0, "a brown dog and a red car and a cat")) is True  # a cat the scene does not hold
    assert erring(_record(0, "two brown dogs and a red car")) is True  # one dog too many
    assert erring({"image_id": 0, "grounding": None}) is None


def test_warning_figures_split_the_warnings_by_whether_the_caption_errs():
    records = [_record(0, "a brown dog left of a red car"), _record(1, "a brown dog left of a red car"),
               _record(2, "a brown dog"), _record(3, "a red car"), _record(4, "a dog and a cat"),
               {"image_id": 5, "grounding": None}]
    warned = {0: True, 1: False, 2: True, 3: False, 4: True, 5: True}
    figures = warning_figures(warned, records)
    assert figures["warned"] == pytest.approx(4 / 6)
    assert figures["erring"] == pytest.approx(3 / 5)  # the ungrounded caption counts in neither group
    assert figures["warned_erring"] == pytest.approx(2 / 3) and figures["warned_right"] == pytest.approx(1 / 2)
    nothing_wrong = warning_figures({0: True}, records[:1])
    assert nothing_wrong["warned_erring"] is None and nothing_wrong["warned_right"] == 1.0
    assert warning_figures(None, records) == dict.fromkeys(("warned", "erring", "warned_erring", "warned_right"))


def test_the_unsure_flag_is_measured_on_every_set_against_the_checkpoints_reference(world_and_model):
    """With a reference kept in the checkpoint, each set's unsure share is the share of its captions whose log p
    lies under the mark, split by whether the caption errs; a mark under every caption flags none."""
    from sat_core.evaluation.confidence import ConfidenceReference

    root, path, shifted, checkpoint = world_and_model
    loaded = load_checkpoint(checkpoint)
    data = load_karpathy(path, path.parent)
    cfg = DecodeConfig(beam_size=2, max_len=6)
    result = evaluate(loaded, data, "test", cfg, meteor=False)
    logprobs = sorted(r["logprob"] for r in result["records"])
    mark = (logprobs[1] + logprobs[2]) / 2  # the two least likely captions of five lie under it
    loaded.config.setdefault("training", {})["confidence"] = ConfidenceReference(mark, 0.1, 400).to_dict()
    figures = report(loaded, cfg, result, data, suite_dir=root / "suite", shifted=shifted)
    assert figures["test"]["unsure"] == pytest.approx(2 / 5)
    flags = unsure_images(ConfidenceReference(mark, 0.1, 400), result["records"])
    assert sorted(flags.values()) == [False, False, False, True, True]
    wrong = [erring(r) for r in result["records"]]
    if any(wrong) and not all(wrong):
        assert figures["test"]["unsure_erring"] == pytest.approx(
            np.mean([flags[r["image_id"]] for r, e in zip(result["records"], wrong) if e]))
    for name in ("shifted", "crop"):
        assert figures[name]["unsure"] is not None and 0 <= figures[name]["unsure"] <= 1
    again = evaluate(loaded, data, "test", cfg, meteor=False)  # the summary of every evaluation, any dataset
    assert again["confidence"]["unsure"] == pytest.approx(2 / 5) and again["confidence"]["n"] == 5
    line = next(x for x in summary_lines(again) if x.startswith("unsure captions"))
    assert f"log p under {mark:.2f}, the 10% mark" in line and "40.0% of 5" in line
    loaded.config["training"]["confidence"] = ConfidenceReference(logprobs[0] - 1, 0.1, 400).to_dict()
    nothing = report(loaded, cfg, result, data, suite_dir=None, shifted=shifted)
    assert nothing["test"]["unsure"] == 0.0 and nothing["shifted"]["unsure"] == 0.0
    loaded.config["training"]["confidence"] = {"threshold": "high"}  # malformed: evaluated without the flag
    spoilt = report(loaded, cfg, result, data, suite_dir=None, shifted=shifted)
    assert spoilt["test"]["unsure"] is None and spoilt["test"]["precision"] == figures["test"]["precision"]


def test_a_missing_suite_is_an_error_that_says_how_to_write_it(world_and_model, tmp_path, capsys):
    _, path, _, checkpoint = world_and_model
    code = main(["--checkpoint", str(checkpoint), "--data", str(path), "--images", str(path.parent), "--beam", "1",
                 "--max-len", "4", "--no-meteor", "--device", "cpu", "--out", str(tmp_path / "m.json"),
                 "--generalisation", str(tmp_path / "nowhere")])
    assert code == 2 and "python -m sat_core.transforms" in capsys.readouterr().err


def warned_share(loaded, data, indices) -> float | None:
    """The share of the images at ``indices`` that the out-of-domain check warns about (None: no statistics)."""
    flags = warned_images(loaded, data, indices)
    return None if flags is None else sum(flags.values()) / len(flags)


def test_warned_share_counts_the_images_the_domain_check_warns_about(world_and_model, tmp_path):
    """With the checkpoint's domain statistics taken from the pictures themselves, they are not warned about,
    except one that went through JPEG at quality 20 (as the world degrades some training pictures); grey noise
    and pictures squeezed through JPEG at quality 10 are."""
    from PIL import Image

    from sat_core.evaluation.domain import DomainReference

    root, path, _, checkpoint = world_and_model
    loaded = load_checkpoint(checkpoint)
    world = load_karpathy(path, path.parent)
    entries = json.loads(path.read_text())["images"]
    rendered = [r for r, e in zip(world.images, entries) if not e.get("degraded")]  # as the world drew them
    assert len(rendered) >= 6
    own = tmp_path / "own"  # those pictures, the first one through JPEG at quality 20
    own.mkdir()
    for k, r in enumerate(rendered):
        picture = Image.open(r.path).convert("RGB")
        if k == 0:
            buffer = io.BytesIO()
            picture.save(buffer, format="JPEG", quality=20)
            picture = Image.open(buffer).convert("RGB")
        picture.save(own / r.path.name)
    data = KarpathyData([ImageRecord(own / r.path.name, r.split, r.sentences, r.raw, r.id, r.karpathy_split)
                         for r in rendered], own / "dataset.json", own)
    pictures = [Image.open(r.path).convert("RGB") for r in data.images]
    loaded.config.setdefault("training", {})["domain"] = DomainReference.from_images(pictures).to_dict()
    indices = list(range(len(data.images)))
    assert warned_share(loaded, data, indices) == 1 / len(indices)
    assert warned_share(loaded, data, [0]) == 1.0
    flags = warned_images(loaded, data, indices)
    assert [i for i, w in flags.items() if w] == [data.images[0].id]
    noise = tmp_path / "noise"
    noise.mkdir()
    rng = np.random.default_rng(0)
    for r in data.images:
        grey = rng.integers(0, 255, (224, 224), dtype=np.uint8)
        Image.fromarray(np.repeat(grey[..., None], 3, -1)).save(noise / r.path.name)
    noisy = KarpathyData([ImageRecord(noise / r.path.name, r.split, r.sentences, r.raw, r.id, r.karpathy_split)
                          for r in data.images], noise / "dataset.json", noise)
    assert warned_share(loaded, noisy, indices) == 1.0
    squeezed = tmp_path / "jpeg"  # the same pictures through JPEG at quality 10, saved losslessly again
    squeezed.mkdir()
    for r in data.images:
        buffer = io.BytesIO()
        Image.open(r.path).convert("RGB").save(buffer, format="JPEG", quality=10)
        Image.open(buffer).save(squeezed / r.path.name)
    jpeg = KarpathyData([ImageRecord(squeezed / r.path.name, r.split, r.sentences, r.raw, r.id, r.karpathy_split)
                         for r in data.images], squeezed / "dataset.json", squeezed)
    assert warned_share(loaded, jpeg, indices) == 1.0
    loaded.config["training"].pop("domain")
    assert warned_share(loaded, data, indices) is None


def test_a_suite_over_another_split_is_evaluated_without_the_shifted_split(world_and_model, tmp_path, capsys):
    root, path, shifted, checkpoint = world_and_model
    transforms.write_suite(path, path.parent, tmp_path / "train_suite", split="train", names=("zoom_out", "crop"))
    base = ["--checkpoint", str(checkpoint), "--data", str(path), "--images", str(path.parent), "--beam", "1",
            "--max-len", "4", "--no-meteor", "--device", "cpu", "--split", "train",
            "--generalisation", str(tmp_path / "train_suite")]
    out = tmp_path / "m.json"
    assert main([*base, "--out", str(out), "--no-shifted"]) == 0
    figures = json.loads(out.read_text())["generalisation"]
    assert list(figures) == ["train", "zoom_out", "crop"]
    assert figures["train"]["n_images"] == figures["zoom_out"]["n_images"] == 6
    assert 1 <= figures["crop"]["n_images"] <= 6  # the crop leaves out a scene whose every object it cuts away
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "n.json"), "--no-shifted", "--shifted", str(shifted)]) == 2
    assert "--no-shifted" in capsys.readouterr().err and not (tmp_path / "n.json").exists()
