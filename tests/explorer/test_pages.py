"""Error analysis and α display settings; helpers the page tests share (test_compare, test_score, …)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from sat_core.config import DecodeConfig
from sat_core.data.images import load_image, preprocess

pytest.importorskip("streamlit")  # the app's tests: skipped where streamlit is not installed

from tests.explorer.conftest import new_app


def tensor_for(env, attention: str, scene: int):
    loaded = env.checkpoint(attention)
    tensor, _ = preprocess(load_image(env.scene_path(scene)), loaded.preprocess)
    return loaded, tensor


def open_page(page: str, params=None):
    at = new_app(params)
    at.switch_page(f"views/{page}.py")
    at.run()
    assert not at.exception, at.exception
    return at


def _evaluated_gallery(env, at):
    """sat_core.evaluation.evaluate over the gallery's scenes with the sidebar's decoding settings."""
    from sat_core.data.karpathy import load_karpathy
    from sat_core.evaluation.evaluate import evaluate_images

    data = load_karpathy(env.world / "dataset.json", env.world)
    cfg = DecodeConfig(beam_size=at.sidebar.slider(key="beam").value, max_len=at.sidebar.slider(key="maxlen").value)
    return evaluate_images(env.checkpoint("soft"), data, data.split("test"), cfg, meteor=False, search_errors=True)


def test_error_analysis_shows_evaluates_records(explorer_env):
    from sat_core.evaluation.analysis import word_type_correctness

    at = open_page("errors")
    expected = _evaluated_gallery(explorer_env, at)
    by_id = {r["image_id"]: r for r in expected["records"]}
    table = at.dataframe[0].value
    assert sorted(table["image_id"]) == sorted(by_id)
    for row in table.to_dict("records"):
        record = by_id[row["image_id"]]
        assert row["caption"] == record["caption"] and row["CIDEr"] == record["scores"]["CIDEr"]
        assert row["errors"] == (", ".join(record["errors"]) or "—") and row["objects"] == record["n_objects"]
        search = record["search_error"]
        assert row["search error"] == ("—" if search is None else
                                       f"yes: {record['best_reference']['caption']}" if search else "no")
        correctness = row["attention correctness"]
        assert (np.isnan(correctness) if record["attention_correctness"] is None
                else correctness == record["attention_correctness"])
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["CIDEr"] == f"{expected['corpus']['CIDEr']:.3f}"
    assert metrics["grounded precision"] == f"{expected['grounded']['precision']:.3f}"
    assert metrics["search errors"] == f"{expected['search']['search_error_rate']:.3f}"
    helps = {m.label: m.help for m in at.metric}
    assert f"{expected['attention']['ceiling']:.3f}" in helps["attention correctness"]  # the most α could reach
    kinds = at.dataframe[2].value if len(at.dataframe) > 2 else None
    rows = word_type_correctness(expected["records"])
    assert (kinds is None and not rows) or list(kinds["words"]) == [r["words"] for r in rows]
    if rows:  # α's entropy beside its object's mask's, explained under the table
        assert list(kinds["mask_entropy"]) == pytest.approx([r["mask_entropy"] for r in rows])
        assert any("mask_entropy" in c.value and "sharper" in c.value for c in at.caption)
        for key in ("on_other_objects", "beside_object"):  # where the rest of α went
            assert list(kinds[key]) == pytest.approx([r[key] for r in rows])
        assert any("on_other_objects" in c.value and "farther away" in c.value for c in at.caption)


def test_error_analysis_table_filters_and_opens_step_view(explorer_env):
    at = open_page("errors")
    table = at.dataframe[0].value
    assert sorted(table["image_id"]) == sorted(explorer_env.test_ids())
    assert list(table["CIDEr"]) == sorted(table["CIDEr"])  # worst first
    labelled = table[table["errors"] != "—"]
    label = labelled["errors"].iloc[0].split(", ")[0]
    at.multiselect(key="err_labels").set_value([label]).run()
    filtered = at.dataframe[0].value
    assert 0 < len(filtered) <= len(table)
    assert all(label in e.split(", ") for e in filtered["errors"])
    assert any(f"**{len(filtered)} images match.**" in m.value for m in at.markdown)
    slices = at.dataframe[1].value
    assert slices["slice"].iloc[0] == "all images" and slices["images"].iloc[0] == len(table)
    assert f"error: {label}" in list(slices["slice"])
    kinds = at.dataframe[2].value
    assert set(kinds["kind"]) <= {"shape", "colour", "size", "count", "relation", "function"}
    target = int(filtered["image_id"].iloc[0])
    first_wrong = filtered["first wrong word"].iloc[0]
    at.selectbox(key="err_open").set_value(target)
    at.button(key="err_open_button").click().run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Step through"
    assert at.sidebar.selectbox(key="scene").value == target
    assert at.checkbox(key="masks").value is True
    if first_wrong:  # stopped at the first wrong word: "3: red" -> step 3 shows "red"
        n, word = first_wrong.split(": ")
        assert any(m.value.startswith(f"**Step {n}:**") and word in m.value for m in at.markdown)
    else:
        assert any(s.value.startswith("Caption complete") for s in at.success)


def test_display_settings_change_the_drawn_map_not_the_hover_values(explorer_env):
    at = open_page("step")
    before = at.get("plotly_chart")[0].proto.spec
    at.radio(key="method").set_value("pyramid")
    at.selectbox(key="cmap").set_value("jet").run()
    after = at.get("plotly_chart")[0].proto.spec
    import json

    image_before, image_after = (json.loads(s)["data"][0] for s in (before, after))
    heat_before, heat_after = (json.loads(s)["data"][1]["z"] for s in (before, after))
    assert image_before != image_after  # the picture changed
    assert heat_before == heat_after  # the exact α under the pointer did not
    assert any("Smoothing is cosmetic" in c.value for c in at.sidebar.caption)
    at.checkbox(key="coverage").check().run()
    assert any(m.value.startswith("**Coverage Σ_t α_t over the first 1 steps**") for m in at.markdown)


@pytest.mark.parametrize("searched", [False, True])
def test_error_analysis_reads_stored_eval_records(explorer_env, tmp_path, monkeypatch, searched):
    """A shipped checkpoint's eval_records.json (as sat_core.ship writes it) with figures from metrics.json."""
    import json
    import shutil

    from sat_core.data.karpathy import load_karpathy
    from sat_core.evaluation.evaluate import evaluate

    folder = tmp_path / "evaluated"
    shutil.copytree(explorer_env.roots / "tiny-soft", folder)
    data = load_karpathy(explorer_env.world / "dataset.json", explorer_env.world)
    result = evaluate(explorer_env.checkpoint("soft"), data, "test", DecodeConfig(beam_size=1, max_len=6),
                      meteor=False, search_errors=searched)  # every test image: records of the gallery's split
    records = result.pop("records")
    for k, record in enumerate(records):  # captions the app cannot have decoded itself
        record.update(caption=f"stored caption {record['image_id']}", errors=["wrong_count"] if k else [])
    if searched:  # scenes-world records keep their scored counts (scenes_grounding.CountItem)
        said = [(2, 2, True), (1, 2, False), (3, 2, False), (None, 3, True)]
        for k, (record, (n, scene, right)) in enumerate(zip(records, said)):
            record["grounding"] = {**(record.get("grounding") or {}), "groups": [scene] + [1] * (k > 0), "counts": [
                {"category": "dog", "colour": None, "said": n, "scene": scene, "right": right}]}
    (folder / "eval_records.json").write_text(json.dumps({"split": "test", "beam": 1, "records": records}))
    result["grounded"]["precision"] = 0.5
    if searched:
        result["search"]["search_error_rate"] = 0.25
    (folder / "metrics.json").write_text(json.dumps(result))
    monkeypatch.setenv("SAT_CHECKPOINT_DIRS", os.pathsep.join([str(explorer_env.roots), str(tmp_path)]))
    at = open_page("errors", {"ckpt": "evaluated"})
    table = at.dataframe[0].value
    shown = table.set_index("image_id")
    for k, r in enumerate(records):
        assert shown.loc[r["image_id"], "caption"] == r["caption"]
        assert shown.loc[r["image_id"], "errors"] == ("wrong_count" if k else "—")
        assert shown.loc[r["image_id"], "objects"] == r["n_objects"]
        assert shown.loc[r["image_id"], "file"] == r["filename"]
    assert ("search error" in table) == searched  # only records evaluated with --search-errors have it
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["grounded precision"] == "0.500"
    assert metrics.get("search errors") == ("0.250" if searched else None)
    assert metrics["CIDEr"] == f"{result['corpus']['CIDEr']:.3f}"
    assert any("eval_records.json" in c.value for c in at.caption)
    headers = [h.value for h in at.subheader]
    assert ("Counts: what the captions said against the scene" in headers) == searched
    assert ("Counts by the kind of scene" in headers) == searched
    if searched:
        kinds = at.dataframe[-1].value
        assert list(kinds["the scene's groups"]) == ["2 + 1", "2", "3 + 1"]  # most counts scored first
        assert list(kinds["scenes"]) == [2, 1, 1] and list(kinds["right"]) == [0.0, 1.0, 1.0]
        counts = at.dataframe[-2].value.set_index("in the scene")
        assert list(counts.index) == [2, 3]
        assert counts.loc[2, "counts scored"] == 3 and counts.loc[2, "right"] == pytest.approx(1 / 3)
        assert (counts.loc[2, "said 1"], counts.loc[2, "said 2"], counts.loc[2, "said 3"]) == (1, 1, 1)
        assert counts.loc[3, "said plural"] == 1 and counts.loc[3, "right"] == 1.0
    # Another decoding than the records were made with: the page decodes the split itself instead of showing them.
    at.sidebar.slider(key="beam").set_value(2).run()
    assert not at.exception, at.exception
    captions = list(at.dataframe[0].value["caption"])
    assert captions and not any(c.startswith("stored caption") for c in captions)
    assert any("computed over" in c.value and "beam 2" in c.value for c in at.caption)


def test_error_analysis_marks_the_unsure_captions_and_sorts_least_sure_first(explorer_env, tmp_path, monkeypatch):
    """The tiny soft model with a confidence mark between its gallery captions' log p: the table's log p is the
    records', *unsure* marks the captions under the mark, the filter keeps only those, the order puts the least
    likely first. Without a mark there is no unsure column."""
    from sat_core.checkpoint import save_checkpoint
    from sat_core.evaluation.confidence import ConfidenceReference

    plain = open_page("errors")
    table = plain.dataframe[0].value
    assert "unsure" not in table and "log p" in table
    expected = {r["image_id"]: r["logprob"] for r in _evaluated_gallery(explorer_env, plain)["records"]}
    assert dict(zip(table["image_id"], table["log p"])) == pytest.approx(expected)
    logprobs = sorted(expected.values())
    mark = (logprobs[2] + logprobs[3]) / 2  # the three least likely captions lie under it
    loaded = explorer_env.checkpoint("soft")
    save_checkpoint(tmp_path / "marked", loaded.model, model_config=loaded.model_config, vocab=loaded.vocab,
                    preprocess=loaded.preprocess,
                    training={"confidence": ConfidenceReference(mark, 0.1, 400).to_dict()},
                    model_card="# Marked\n")
    monkeypatch.setenv("SAT_CHECKPOINT_DIRS", os.pathsep.join([str(explorer_env.roots), str(tmp_path)]))
    at = open_page("errors", {"ckpt": "marked"})
    table = at.dataframe[0].value
    assert sorted(table.loc[table["unsure"] == "yes", "log p"]) == pytest.approx(logprobs[:3])
    slices = at.dataframe[1].value.set_index("slice")
    assert slices.loc["unsure captions", "images"] == 3 and slices.loc["the other captions", "images"] == len(table) - 3
    at.checkbox(key="err_unsure").check().run()
    assert len(at.dataframe[0].value) == 3 and set(at.dataframe[0].value["unsure"]) == {"yes"}
    at.checkbox(key="err_unsure").uncheck().run()
    at.selectbox(key="err_sort").set_value("log p ↑ (least sure first)").run()
    assert list(at.dataframe[0].value["log p"]) == pytest.approx(logprobs)
