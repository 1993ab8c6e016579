"""A researcher's own data: a Karpathy-format photo set, a model trained on it, the app pointed at it."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from sat_core import train
from sat_core.evaluation.caption_errors import REFERENCE_LABELS
from sat_core.checkpoint import load_checkpoint
pytest.importorskip("streamlit")  # the app's tests: skipped where streamlit is not installed

from tests.fixtures_photos import make_photo_set


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    base = tmp_path_factory.mktemp("own")
    data = make_photo_set(base / "photos")
    run = base / "runs" / "photos"
    code = train.main(["--data", str(data), "--images", str(base / "photos"), "--out", str(run), "--epochs", "2",
                       "--batch-size", "8", "--min-word-count", "1", "--image-size", "32", "--small-channels", "8",
                       "16", "--embed-dim", "16", "--hidden-dim", "32", "--attn-dim", "16", "--patience", "0",
                       "--no-progress"])
    assert code == 0
    names = ("SAT_DATA", "SAT_IMAGES", "SAT_SPLIT", "SAT_CHECKPOINT_DIRS")
    old = {k: os.environ.get(k) for k in names}
    os.environ.update(SAT_DATA=str(data), SAT_IMAGES=str(base / "photos"), SAT_SPLIT="test",
                      SAT_CHECKPOINT_DIRS=str(base / "runs"))
    yield {"data": data, "run": run, "doc": json.loads(data.read_text())}
    for key, value in old.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _app(page: str | None = None):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file("../../explorer/app.py", default_timeout=60)
    at.query_params = {"ckpt": "photos/best"}
    if page:
        at.switch_page(f"views/{page}.py")
    at.run()
    assert not at.exception, at.exception
    return at


def test_the_trained_checkpoint_keeps_statistics_of_its_training_data(own):
    training = load_checkpoint(own["run"] / "best").config["training"]
    assert "dataset_photos.json (train split, 12 images)" in training["domain"]["source"]
    assert len(training["domain"]["features"]) == 12
    # the encoder's view of the same images, as the saved weights make it (the small CNN learns)
    from sat_core.evaluation.card import annotation_statistics, domain_images
    from sat_core.data.karpathy import load_karpathy

    loaded = load_checkpoint(own["run"] / "best")
    stored = np.asarray(training["domain"]["annotations"]["features"])
    assert stored.shape == (12, loaded.model.config.feature_dim)
    fresh = annotation_statistics(loaded.model, loaded.preprocess,
                                  domain_images(load_karpathy(own["data"], own["data"].parent)))
    np.testing.assert_allclose(stored, np.asarray(fresh["features"]), rtol=1e-3, atol=1e-4)
    stats = training["word_stats"]
    assert stats["lift"]["cat"] > stats["lift"]["a"]


def test_error_analysis_lists_every_test_image_by_file_name_with_reference_labels(own):
    at = _app("errors")
    table = at.dataframe[0].value
    tests = sorted(e["filename"] for e in own["doc"]["images"] if e["split"] == "test")
    assert sorted(table["file"]) == tests
    labels = {label for cell in table["errors"] for label in cell.split(", ") if label != "—"}
    assert labels and labels <= set(REFERENCE_LABELS)  # no shape-world label on photos
    assert all(cell.startswith("data:image/jpeg;base64,") for cell in table["image"])
    assert "objects" not in table and "attention correctness" not in table  # photos have no masks: no empty columns
    row = table.iloc[0]
    at.selectbox(key="err_open").set_value(int(row["image_id"]))
    at.button(key="err_open_button").click().run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Step through"
    scene = at.sidebar.selectbox(key="scene")
    assert scene.value == int(row["image_id"])
    assert scene.options[scene.index] == row["file"]  # the row's own image, by name
    references = [e for e in own["doc"]["images"] if e["filename"] == row["file"]][0]["sentences"]
    assert any(references[0]["raw"] in m.value for m in at.markdown)


def test_caption_page_shows_the_references(own):
    at = _app()
    shown = " ".join(m.value for m in at.markdown)
    entry = [e for e in own["doc"]["images"] if e["split"] == "test"][0]
    assert at.sidebar.selectbox(key="scene").options[0] == entry["filename"]
    for sentence in entry["sentences"]:
        assert sentence["raw"] in shown


def test_a_named_dataset_that_cannot_be_read_is_reported_not_replaced(own, tmp_path, monkeypatch):
    monkeypatch.setenv("SAT_IMAGES", str(tmp_path))  # the right JSON, the wrong images folder
    at = _app()
    errors = [e.value for e in at.error]
    assert any("cat_000.jpg" in e or "_000.jpg" in e for e in errors) and any("--images" in e for e in errors)
    monkeypatch.setenv("SAT_DATA", str(tmp_path / "missing.json"))
    at = _app()
    assert any("missing.json" in e.value for e in at.error)
    assert not any("generated" in c.value for c in at.sidebar.caption)


def test_reference_labels_never_call_a_function_word_missed(own):
    """Content words are learnt from the training captions: a caption that is one of its references is not
    wrong, and an article that only leans on the next word ("an" before "orange") is not "missed"."""
    from sat_core.evaluation.caption_errors import WordStats, check_against_references

    stats = WordStats.from_dict(load_checkpoint(own["run"] / "best").config["training"]["word_stats"])
    assert stats.kind("a") == "function"
    for entry in (e for e in own["doc"]["images"] if e["split"] == "test"):
        refs = [s["tokens"] for s in entry["sentences"]]
        for ref in refs:  # every reference, said as the caption
            check = check_against_references(ref, refs, stats)
            assert not {"missed_word", "hallucinated_word", "too_short", "too_long"} & set(check.labels), (ref, check)
    refs = [["an", "orange", "cat", "on", "a", "mat"]] * 3 + [["a", "cat", "on", "a", "mat"]]
    lifted = WordStats({"an": 50, "orange": 50, "cat": 50, "red": 50}, {"an": 5.0, "orange": 4.0, "cat": 6.0,
                                                                      "red": 4.0})
    check = check_against_references(["a", "red", "cat", "on", "a", "mat"], refs, lifted)
    assert check.missed == ["orange"]  # not "an": its lift is the colour's


def test_evaluate_sorts_words_no_world_names_by_the_checkpoints_statistics(own):
    """The β and entropy lines of sat_core.evaluate: on photos every word is content or function by the checkpoint's
    own word statistics, neither "function" for lack of a world list nor "colour" for being on one."""
    from sat_core.config import DecodeConfig
    from sat_core.data.karpathy import load_karpathy
    from sat_core.evaluation.caption_errors import WordStats
    from sat_core.evaluation.evaluate import evaluate, summary_kind

    loaded = load_checkpoint(own["run"] / "best")
    stats = WordStats.from_dict(loaded.config["training"]["word_stats"])
    from sat_core.evaluation.grounding import word_kind

    assert summary_kind("astronaut", stats) == "content"  # no world names it; its training captions do
    for word in ("the", "of", "with", "in", "astronaut", "coffee"):
        if word_kind(word) == "function":  # not a world's word: the checkpoint's statistics decide
            assert summary_kind(word, stats) == stats.kind(word), word
    from sat_core import worlds

    assert summary_kind("red", stats, worlds.get("scenes")) == "colour"  # a world's kind, on that world's images
    assert summary_kind("red", stats) in ("content", "function")  # on photos their captions decide
    out = evaluate(loaded, load_karpathy(own["data"], own["data"].parent), "test", DecodeConfig(beam_size=1),
                   meteor=False)
    said = [w for r in out["records"] for w in r["tokens"]]
    by_kind = out["attention"]["entropy_by_kind"]
    content = [w for w in said if summary_kind(w, stats) == "content"]
    assert by_kind.get("content", {}).get("n", 0) == len(content)
    if out["beta_by_kind"]:
        assert sum(v["n"] for v in out["beta_by_kind"].values()) == len(said)
