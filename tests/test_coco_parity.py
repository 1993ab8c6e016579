"""COCO evaluation parity: the PTB tokenizer as an option of the one metrics path, and a results file in the COCO
evaluation server's format (what pycocotools' ``COCO.loadRes`` reads), written by ``python -m sat_core.evaluate``."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from sat_core.checkpoint import save_checkpoint
from sat_core.config import PreprocessConfig
from sat_core.data.karpathy import build_vocab, load_karpathy
from sat_core.errors import SatError
from sat_core.evaluate import main
from sat_core.evaluation import metrics
from sat_core.evaluation.metrics import caption_metrics, check_coco_results, coco_results
from sat_core.models.captioner import Captioner
from sat_core.worlds import writer
from tests.conftest import tiny_config

needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="the PTB tokenizer runs in Java")

# References typed as people type them: capitals, commas, full stops, a clitic.
REFS = {1: ["A dog, running on the grass.", "The dog runs."], 2: ["A man's red bike!", "a man rides a bike"]}
HYPS = {1: "a dog running on the grass", 2: "a man 's red bike"}


@needs_java
def test_the_ptb_tokenizer_scores_typed_references_as_the_coco_server_does():
    plain = caption_metrics(REFS, HYPS, meteor=False)
    ptb = caption_metrics(REFS, HYPS, meteor=False, tokenizer="ptb")
    # "grass." and "bike!" keep their punctuation as plain words, so plain misses what PTB matches
    assert ptb.corpus["BLEU-4"] == pytest.approx(1.0) and plain.corpus["BLEU-4"] < 0.5
    assert ptb.per_image[1]["BLEU-1"] == pytest.approx(1.0)


def test_the_ptb_tokenizer_without_java_says_what_to_do(monkeypatch):
    monkeypatch.setattr(metrics.shutil, "which", lambda name: None)
    with pytest.raises(SatError, match="--tokenizer plain"):
        caption_metrics(REFS, HYPS, meteor=False, tokenizer="ptb")
    with pytest.raises(SatError, match="plain, ptb"):
        caption_metrics(REFS, HYPS, meteor=False, tokenizer="nltk")


def test_results_are_a_list_of_image_ids_and_captions():
    results = coco_results({391895: "a man rides a bike", 522418: "a woman cuts a cake"})
    assert results == [{"image_id": 391895, "caption": "a man rides a bike"},
                       {"image_id": 522418, "caption": "a woman cuts a cake"}]
    check_coco_results(json.loads(json.dumps(results)), image_ids=[391895, 522418, 184613])


@pytest.mark.parametrize("results, message", [
    ({"image_id": 1, "caption": "a dog"}, "JSON list"),
    ([], "JSON list"),
    ([{"image_id": 1, "caption": "a dog", "score": 0.5}], "exactly image_id and caption"),
    ([{"image_id": 1}], "exactly image_id and caption"),
    ([{"image_id": True, "caption": "a dog"}], "ints"),
    ([{"image_id": 1.0, "caption": "a dog"}], "ints"),
    ([{"image_id": 1, "caption": ["a", "dog"]}], "not a string"),
    ([{"image_id": 1, "caption": "a dog"}, {"image_id": 1, "caption": "a cat"}], "one per image"),
])
def test_what_loadres_or_the_server_would_refuse_is_refused(results, message):
    with pytest.raises(SatError, match=message):
        check_coco_results(results)


def test_results_naming_images_the_dataset_lacks_are_refused():
    with pytest.raises(SatError, match="does not have"):
        check_coco_results([{"image_id": 7, "caption": "a dog"}], image_ids=[1, 2])


@pytest.fixture(scope="module")
def world_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("coco")
    path = writer.generate(root, 4, 0, 6, seed=5, workers=1)
    data = load_karpathy(path, root)
    vocab = build_vocab(data, min_count=1)
    torch.manual_seed(0)
    config = tiny_config(len(vocab))
    save_checkpoint(root / "ckpt", Captioner(config).eval(), model_config=config, vocab=vocab,
                    preprocess=PreprocessConfig(112))
    return root, path, data


def test_evaluate_writes_a_results_file_the_coco_format_accepts(world_checkpoint, tmp_path, capsys):
    root, path, data = world_checkpoint
    results = tmp_path / "captions_test_results.json"
    code = main(["--checkpoint", str(root / "ckpt"), "--data", str(path), "--images", str(root), "--split", "test",
                 "--beam", "1", "--max-len", "6", "--no-meteor", "--out", str(tmp_path / "m.json"),
                 "--results-file", str(results)])
    assert code == 0, capsys.readouterr().err
    doc = json.loads(results.read_text())
    ids = [data.images[i].id for i in data.split("test")]
    check_coco_results(doc, image_ids=ids)
    assert sorted(r["image_id"] for r in doc) == sorted(ids)  # every test image once
    records = json.loads((tmp_path / "m.json").read_text())["records"]
    assert {r["image_id"]: r["caption"] for r in records} == {r["image_id"]: r["caption"] for r in doc}
    assert str(results) in capsys.readouterr().out


@needs_java
def test_evaluate_with_the_ptb_tokenizer_says_so_in_its_figures(world_checkpoint, tmp_path):
    root, path, _ = world_checkpoint
    out = tmp_path / "m.json"
    assert main(["--checkpoint", str(root / "ckpt"), "--data", str(path), "--images", str(root), "--split", "test",
                 "--beam", "1", "--max-len", "6", "--no-meteor", "--out", str(out), "--tokenizer", "ptb"]) == 0
    assert json.loads(out.read_text())["tokenizer"] == "ptb"
