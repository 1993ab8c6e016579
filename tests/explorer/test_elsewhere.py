"""Look elsewhere: regions (sliders, objects, drawn cells), the word-by-word diff, the verdict, links."""

from __future__ import annotations

import json

import numpy as np

from sat_core.config import DecodeConfig
from sat_core.decoding import Intervention, beam_search, score_caption
from sat_core.regions import format_cells, grid_region
from sat_core.data.words import word_diff

import pytest
pytest.importorskip("streamlit")  # the app's tests: skipped where streamlit is not installed

from explorer.components.regions import selection_cells

from tests.explorer.test_pages import open_page, tensor_for
from tests.explorer.test_step import plotly_array


def test_a_plotly_selection_maps_to_grid_cells():
    grid, side = (14, 14), 112  # 8 px cells, centres at 4, 12, 20, …
    box = {"box": [{"xref": "x", "yref": "y", "x": [30, 10], "y": [0, 17]}], "lasso": [], "points": []}
    assert selection_cells(box, grid, side).tolist() == grid_region(grid, [0, 1], [1, 2, 3]).tolist()
    lasso = {"lasso": [{"x": [0, 40, 0], "y": [0, 0, 40]}]}
    region = selection_cells(lasso, grid, side)
    assert region[0, 0] and region[0, 3] and not region[0, 5] and not region[4, 4] and region.sum() == 10
    points = {"points": [{"x": 100, "y": 4, "point_index": 12}, {"x": 4, "y": 108}]}
    assert np.argwhere(selection_cells(points, grid, side)).tolist() == [[0, 12], [13, 0]]
    assert not selection_cells({}, grid, side).any() and not selection_cells(None, grid, side).any()


def _expected(env, scene, region, mode):
    loaded, tensor = tensor_for(env, "soft", scene)
    cfg = DecodeConfig()
    original = beam_search(loaded.model, tensor.unsqueeze(0), loaded.vocab, cfg)[0][0]
    edit = Intervention(region, mode)
    changed = beam_search(loaded.model, tensor.unsqueeze(0), loaded.vocab, cfg, intervention=edit)[0][0]
    before = score_caption(loaded.model, loaded.vocab, tensor, original.caption, precision="fp32")
    after = score_caption(loaded.model, loaded.vocab, tensor, original.caption, intervention=edit, precision="fp32")
    return original, changed, before, after


def _with_end(hyp):
    return [*hyp.words, "<end>"] if hyp.finished else list(hyp.words)


def test_the_diff_and_the_verdict_show_what_the_numbers_say(explorer_env):
    scene = explorer_env.test_ids()[0]
    at = open_page("elsewhere")
    at.radio(key="ew_how").set_value("rect").run()
    at.slider(key="ew_rows").set_value((0, 13))
    at.slider(key="ew_cols").set_value((0, 6))
    at.radio(key="ew_mode").set_value("include").run()
    region = grid_region((14, 14), range(0, 14), range(0, 7))
    original, changed, before, after = _expected(explorer_env, scene, region, "include")
    captions = [m.value for m in at.markdown if m.value.startswith("**Caption:**")]
    assert captions == [f"**Caption:** {original.caption}", f"**Caption:** {changed.caption}"]
    assert any("98 of 196 cells chosen" in c.value for c in at.caption)
    edits = word_diff(_with_end(original), _with_end(changed))
    table = at.dataframe[0].value
    assert list(table["change"]) == [e.op for e in edits]
    assert list(table["word without"]) == [e.before or "" for e in edits]
    assert list(table["word with"]) == [e.after or "" for e in edits]
    rows = table[table["word without"] != ""]
    delta = after.logprobs - before.logprobs
    np.testing.assert_allclose(rows["Δ log p"], np.round(delta[: len(rows)], 3), atol=1.5e-3)
    text = next(m.value for m in at.markdown if "log p moved by" in m.value)
    assert f"**{delta.sum():+.2f} nats** in total" in text
    if original.words == changed.words:
        assert text.startswith("**The caption did not change.**")
    else:
        first = next(e for e in edits if e.op != "same")
        at_word = (first.before_index if first.before_index is not None else first.after_index) + 1
        assert text.startswith(f"**The caption changed at word {at_word}**")
    assert "depended" not in text


def test_drawn_cells_from_a_link_are_the_region(explorer_env):
    scene = explorer_env.test_ids()[0]
    region = grid_region((14, 14), range(3, 9), range(2, 12))
    at = open_page("elsewhere", {"ew_how": "drawn", "ew_cells": format_cells(region), "ew_mode": "include"})
    assert at.radio(key="ew_how").value == "drawn" and at.radio(key="ew_mode").value == "include"
    assert any("60 of 196 cells chosen" in c.value for c in at.caption)
    picker = json.loads(at.get("plotly_chart")[0].proto.spec)
    marks = next(t for t in picker["data"] if t.get("name") == "region")
    cells = {(int(y // 8), int(x // 8)) for x, y in zip(plotly_array(marks["x"]), plotly_array(marks["y"]))}
    assert cells == {tuple(rc) for rc in np.argwhere(region)}
    original, changed, _, _ = _expected(explorer_env, scene, region, "include")
    captions = [m.value for m in at.markdown if m.value.startswith("**Caption:**")]
    assert captions == [f"**Caption:** {original.caption}", f"**Caption:** {changed.caption}"]


def test_a_link_restores_the_rectangle_and_mode(explorer_env):
    at = open_page("elsewhere")
    at.radio(key="ew_how").set_value("rect").run()
    at.slider(key="ew_rows").set_value((2, 5))
    at.slider(key="ew_cols").set_value((1, 9))
    at.radio(key="ew_mode").set_value("include").run()
    link = dict(at.query_params)
    assert link["ew_mode"] == "include"
    again = open_page("elsewhere", link)
    assert again.slider(key="ew_rows").value == (2, 5) and again.slider(key="ew_cols").value == (1, 9)
    assert again.radio(key="ew_mode").value == "include"
    assert any("36 of 196 cells chosen" in c.value for c in again.caption)


def test_nothing_drawn_yet_says_so(explorer_env):
    at = open_page("elsewhere")
    at.radio(key="ew_how").set_value("drawn").run()
    assert any("No cells chosen yet" in i.value for i in at.info)
    assert not at.dataframe


def test_look_elsewhere_by_ground_truth_object(explorer_env):
    at = open_page("elsewhere")
    at.radio(key="ew_how").set_value("object").run()
    labels = at.selectbox(key="ew_object").options
    scene = next(e for e in explorer_env.dataset["images"] if e["imgid"] == explorer_env.test_ids()[0])
    assert labels == [f"{o['id']}: {o['size']} {o['colour']} {o['shape']}" for o in scene["objects"]]
    at.selectbox(key="ew_object").set_value(labels[0]).run()
    assert dict(at.query_params)["ew_object"] == "0"
    assert not at.error


def test_it_opens_on_the_scenes_largest_object_with_the_finding_first(explorer_env):
    from explorer.guards import object_masks

    at = open_page("elsewhere", {"ckpt": "tiny-soft"})
    assert at.radio(key="ew_how").value == "object"  # a ground-truth object, not a patch of background
    image = at.session_state["_ctx"].image
    sizes = [int(m.sum()) for m in object_masks(image)]
    assert at.selectbox(key="ew_object").value == sizes.index(max(sizes))
    body = [e for e in at.main if getattr(e, "type", "") in ("markdown", "subheader")]
    kinds = [(getattr(e, "value", "") or "") for e in body]
    finding = next(i for i, v in enumerate(kinds) if v.startswith("**The caption"))
    maps_title = next(i for i, v in enumerate(kinds) if v.startswith("#### Where the model looked"))
    assert finding < maps_title  # the verdict is read before the maps that show it
