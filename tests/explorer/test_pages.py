"""Soft vs hard, score a caption, look elsewhere, error analysis, α display settings."""

from __future__ import annotations

import os

import numpy as np

from sat_core.config import DecodeConfig
from sat_core.decoding import Intervention, beam_search, sample_hard, score_caption
from sat_core.regions import grid_region
from sat_core.images import load_image, preprocess

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


def test_soft_vs_hard_side_by_side_with_seeded_samples(explorer_env):
    scene = explorer_env.test_ids()[0]
    at = open_page("compare")
    # The shipped checkpoints/ may be listed too: pick the tiny test checkpoints explicitly.
    at.selectbox(key="cmp_soft").set_value("tiny-soft")
    at.selectbox(key="cmp_hard").set_value("tiny-hard").run()
    assert at.selectbox(key="cmp_soft").value == "tiny-soft" and at.selectbox(key="cmp_hard").value == "tiny-hard"
    headers = [m.value for m in at.markdown if m.value.startswith("#### ")]
    assert headers == ["#### tiny-soft · soft attention", "#### tiny-hard · hard attention"]
    captions = [m.value for m in at.markdown if m.value.startswith("**Caption:**")]
    for attention, shown in zip(("soft", "hard"), captions):
        loaded, tensor = tensor_for(explorer_env, attention, scene)
        hyp = beam_search(loaded.model, tensor.unsqueeze(0), loaded.vocab, DecodeConfig(beam_size=1))[0][0]
        assert shown.replace("<mark>**", "").replace("**</mark>", "") == f"**Caption:** {hyp.caption}"
    assert any("argmax α: row" in c.value for c in at.caption)  # the hard side marks a location
    loaded, tensor = tensor_for(explorer_env, "hard", scene)
    expected = sample_hard(loaded.model, loaded.vocab, tensor, 5, seed=0, cfg=DecodeConfig(beam_size=1))
    table = at.dataframe[0].value
    assert list(table["caption"]) == [h.caption for h in expected]
    at.number_input(key="cmp_n").set_value(3)
    at.number_input(key="cmp_seed").set_value(7).run()
    assert len(at.dataframe[0].value) == 3
    assert any("(seed 7)" in c.value for c in at.caption)
    at.slider(key="cmp_step").set_value(2).run()
    assert any(f"step 2:" in str(c.proto.spec) for c in at.get("plotly_chart"))


def test_score_a_typed_caption_flags_unknown_words(explorer_env):
    scene = explorer_env.test_ids()[0]
    at = open_page("score")
    at.selectbox(key="score_ref").set_value("(type your own)").run()
    loaded, tensor = tensor_for(explorer_env, "soft", scene)
    known = [w for w in loaded.vocab.itos[4:7]]
    text = " ".join([*known, "zorblax"])
    at.text_input(key="score_text").set_value(text).run()
    warnings = [w.value for w in at.warning]
    assert warnings and "zorblax" in warnings[0], warnings
    scored = score_caption(loaded.model, loaded.vocab, tensor, text)
    table = at.dataframe[0].value
    assert list(table["word"]) == [*known, "<unk>", "<end>"]
    np.testing.assert_allclose(table["log p"], np.round(scored.logprobs, 3))
    assert list(table["known"]) == [True, True, True, False, True]
    assert any(f"**log p = {scored.logprob:.2f}**" in m.value for m in at.markdown)


def test_score_a_reference_next_to_the_models_decode(explorer_env):
    scene = explorer_env.test_ids()[0]
    at = open_page("score")
    reference = at.selectbox(key="score_ref").options[1]
    at.selectbox(key="score_ref").set_value(reference).run()
    loaded, tensor = tensor_for(explorer_env, "soft", scene)
    expected = score_caption(loaded.model, loaded.vocab, tensor, reference)
    assert list(at.dataframe[0].value["word"]) == [*reference.split(), "<end>"]
    own = beam_search(loaded.model, tensor.unsqueeze(0), loaded.vocab, DecodeConfig())[0][0]
    assert any(m.value == f"#### The model's decode: {own.caption}" for m in at.markdown)
    assert any(f"log p {expected.logprob:.2f} vs" in m.value for m in at.markdown)


def test_look_elsewhere_decodes_with_the_region_removed(explorer_env):
    scene = explorer_env.test_ids()[0]
    at = open_page("elsewhere")
    at.radio(key="ew_how").set_value("Rectangle of grid cells").run()
    at.slider(key="ew_rows").set_value((0, 13))
    at.slider(key="ew_cols").set_value((0, 6))
    at.radio(key="ew_mode").set_value("include").run()
    loaded, tensor = tensor_for(explorer_env, "soft", scene)
    region = grid_region((14, 14), range(0, 14), range(0, 7))
    cfg = DecodeConfig()
    original = beam_search(loaded.model, tensor.unsqueeze(0), loaded.vocab, cfg)[0][0]
    changed = beam_search(loaded.model, tensor.unsqueeze(0), loaded.vocab, cfg,
                          intervention=Intervention(region, "include"))[0][0]
    captions = [m.value for m in at.markdown if m.value.startswith("**Caption:**")]
    assert captions == [f"**Caption:** {original.caption}", f"**Caption:** {changed.caption}"]
    assert any("98 of 196 cells chosen" in c.value for c in at.caption)
    verdict = "did not change" if original.words == changed.words else "The caption changed"
    assert any(verdict in m.value for m in at.markdown)


def test_look_elsewhere_by_ground_truth_object(explorer_env):
    at = open_page("elsewhere")
    at.radio(key="ew_how").set_value("Ground-truth object").run()
    labels = at.selectbox(key="ew_object").options
    scene = next(e for e in explorer_env.dataset["images"] if e["imgid"] == explorer_env.test_ids()[0])
    assert labels == [f"{o['id']}: {o['size']} {o['colour']} {o['shape']}" for o in scene["objects"]]
    assert not at.error


def _evaluated_gallery(env, at):
    """sat_core.evaluate over the gallery's scenes with the sidebar's decoding settings."""
    from sat_core.data import load_karpathy
    from sat_core.evaluate import evaluate_images

    data = load_karpathy(env.world / "dataset.json", env.world)
    cfg = DecodeConfig(beam_size=at.sidebar.slider(key="beam").value, max_len=at.sidebar.slider(key="maxlen").value)
    return evaluate_images(env.checkpoint("soft"), data, data.split("test"), cfg, meteor=False)


def test_error_analysis_shows_evaluates_records(explorer_env):
    from sat_core.analysis import word_type_correctness

    at = open_page("errors")
    expected = _evaluated_gallery(explorer_env, at)
    by_id = {r["image_id"]: r for r in expected["records"]}
    table = at.dataframe[0].value
    assert sorted(table["image_id"]) == sorted(by_id)
    for row in table.to_dict("records"):
        record = by_id[row["image_id"]]
        assert row["caption"] == record["caption"] and row["CIDEr"] == record["scores"]["CIDEr"]
        assert row["errors"] == (", ".join(record["errors"]) or "—") and row["objects"] == record["n_objects"]
        correctness = row["attention correctness"]
        assert (np.isnan(correctness) if record["attention_correctness"] is None
                else correctness == record["attention_correctness"])
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["CIDEr"] == f"{expected['corpus']['CIDEr']:.3f}"
    assert metrics["grounded precision"] == f"{expected['grounded']['precision']:.3f}"
    kinds = at.dataframe[2].value if len(at.dataframe) > 2 else None
    rows = word_type_correctness(expected["records"])
    assert (kinds is None and not rows) or list(kinds["words"]) == [r["words"] for r in rows]


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


def test_error_analysis_reads_stored_eval_records(explorer_env, tmp_path, monkeypatch):
    """A shipped checkpoint's eval_records.json (as sat_core.ship writes it) with figures from metrics.json."""
    import json
    import shutil

    from sat_core.data import load_karpathy
    from sat_core.evaluate import evaluate

    folder = tmp_path / "evaluated"
    shutil.copytree(explorer_env.roots / "tiny-soft", folder)
    data = load_karpathy(explorer_env.world / "dataset.json", explorer_env.world)
    result = evaluate(explorer_env.checkpoint("soft"), data, "test", DecodeConfig(beam_size=1, max_len=6),
                      meteor=False)  # every test image: records of the gallery's split
    records = result.pop("records")
    for k, record in enumerate(records):  # captions the app cannot have decoded itself
        record.update(caption=f"stored caption {record['image_id']}", errors=["wrong_count"] if k else [])
    (folder / "eval_records.json").write_text(json.dumps({"split": "test", "beam": 1, "records": records}))
    result["grounded"]["precision"] = 0.5
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
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["grounded precision"] == "0.500"
    assert metrics["CIDEr"] == f"{result['corpus']['CIDEr']:.3f}"
    assert any("eval_records.json" in c.value for c in at.caption)
