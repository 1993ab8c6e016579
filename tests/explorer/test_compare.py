"""Soft vs hard: both models teacher-forced on one caption, step by word, sampled locations as marks."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np

from sat_core.config import DecodeConfig
from sat_core.decoding import beam_search, sample_locations, score_caption

import pytest
pytest.importorskip("streamlit")  # the app's tests: skipped where streamlit is not installed

from explorer.components.text import caption_markdown

from tests.explorer.test_pages import open_page, tensor_for
from tests.explorer.test_step import plotly_array


def open_compare(params=None):
    at = open_page("compare", params)
    # The shipped checkpoints/ may be listed too: pick the tiny test checkpoints explicitly.
    at.selectbox(key="cmp_soft").set_value("tiny-soft")
    at.selectbox(key="cmp_hard").set_value("tiny-hard").run()
    assert not at.exception, at.exception
    return at


def charts(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def trace(chart: dict, kind: str, name: str | None = None) -> dict | None:
    return next((t for t in chart["data"] if t["type"] == kind and (name is None or t.get("name") == name)), None)


def test_both_models_read_the_soft_models_caption_word_by_word(explorer_env):
    scene = explorer_env.test_ids()[0]
    soft, tensor = tensor_for(explorer_env, "soft", scene)
    hard, _ = tensor_for(explorer_env, "hard", scene)
    caption = beam_search(soft.model, tensor.unsqueeze(0), soft.vocab, DecodeConfig())[0][0].caption
    at = open_compare()
    headers = [m.value for m in at.markdown if m.value.startswith("#### ")]
    assert headers == ["#### tiny-soft · soft attention", "#### tiny-hard · hard attention"]
    assert any(f"**{caption}**" in m.value for m in at.markdown)
    expected = [score_caption(m.model, m.vocab, tensor, caption, precision="fp32") for m in (soft, hard)]
    words = [*caption.split(), "<end>"]
    at.slider(key="cmp_step").set_value(2).run()
    step = [m.value for m in at.markdown if m.value.startswith("**Step ")]
    assert step == [f"**Step 2 of {len(words)}:** " + caption_markdown(words, 1)]
    for chart, scored in zip(charts(at), expected):
        assert chart["layout"]["title"]["text"] == f"step 2: “{words[1]}”"  # the same word on both sides
        np.testing.assert_allclose(plotly_array(trace(chart, "heatmap")["z"]).reshape(-1), scored.alphas[1],
                                   rtol=1e-5, atol=1e-7)
    captions = [c.value for c in at.caption if c.value.startswith("log p(")]
    assert captions[0].startswith(f"log p(“{words[1]}”) = {expected[0].logprobs[1]:.3f}")
    assert captions[0].endswith(f"β_t = {expected[0].betas[1]:.3f}")
    assert captions[1].startswith(f"log p(“{words[1]}”) = {expected[1].logprobs[1]:.3f}")
    assert captions[1].endswith("no β gate (hard attention)")
    table = at.dataframe[0].value
    assert list(table["word"]) == words
    np.testing.assert_allclose(table["log p · tiny-hard"], np.round(expected[1].logprobs, 3))


def test_sampled_locations_are_marks_on_the_hard_map_with_one_seed(explorer_env):
    scene = explorer_env.test_ids()[0]
    hard, tensor = tensor_for(explorer_env, "hard", scene)
    at = open_compare()
    seeds = [n for n in at.number_input if "seed" in n.label.lower()]
    assert [n.key for n in seeds] == ["cmp_seed"]  # one seed on the page (the sidebar's shows only when sampling)
    at.number_input(key="cmp_seed").set_value(7)
    at.slider(key="cmp_step").set_value(3).run()
    caption = " ".join(at.dataframe[0].value["word"][:-1])
    paths = sample_locations(hard.model, hard.vocab, tensor, caption, 5, seed=7)
    soft_chart, hard_chart = charts(at)
    assert trace(soft_chart, "scatter", "sampled locations") is None
    marks = trace(hard_chart, "scatter", "sampled locations")
    gh, gw = paths.grid
    cell = 112 / gw
    shown = Counter()
    for x, y, (r, c, k) in zip(plotly_array(marks["x"]), plotly_array(marks["y"]), marks["customdata"]):
        assert (x, y) == ((c + 0.5) * cell, (r + 0.5) * cell)
        shown[r * gw + c] = k
    assert shown == Counter(paths.locations[:, 2].tolist())
    assert any("seed 7" in c.value for c in at.caption)


def test_a_typed_caption_and_a_reference_are_read_by_both(explorer_env):
    scene = explorer_env.test_ids()[0]
    at = open_compare()
    at.radio(key="cmp_source").set_value("typed").run()
    at.text_input(key="cmp_text").set_value("A red circle!").run()
    assert list(at.dataframe[0].value["word"]) == ["a", "red", "circle", "<end>"]
    at.radio(key="cmp_source").set_value("reference").run()
    at.selectbox(key="cmp_ref").set_value(1).run()
    reference = next(e for e in explorer_env.dataset["images"] if e["imgid"] == scene)["sentences"][1]["tokens"]
    assert list(at.dataframe[0].value["word"]) == [*reference, "<end>"]


def test_a_link_restores_caption_source_step_and_seed(explorer_env):
    at = open_compare()
    at.radio(key="cmp_source").set_value("typed").run()
    at.text_input(key="cmp_text").set_value("a big red circle")
    at.number_input(key="cmp_seed").set_value(4)
    at.slider(key="cmp_step").set_value(3).run()
    link = dict(at.query_params)
    assert link["cmp_source"] == "typed" and link["cmp_step"] == "3" and link["cmp_seed"] == "4"
    again = open_page("compare", link)
    assert again.radio(key="cmp_source").value == "typed"
    assert again.text_input(key="cmp_text").value == "a big red circle"
    assert again.slider(key="cmp_step").value == 3
    assert again.number_input(key="cmp_seed").value == 4
    assert [m.value for m in again.markdown if m.value.startswith("**Step ")][0].startswith("**Step 3 of 5:**")
    assert charts(again)[0]["layout"]["title"]["text"] == "step 3: “red”"


def test_when_the_sidebar_samples_its_seed_is_the_only_one(explorer_env):
    scene = explorer_env.test_ids()[0]
    hard, tensor = tensor_for(explorer_env, "hard", scene)
    at = open_compare({"hard_mode": "sample", "seed": "9"})
    seeds = [n.key for n in at.number_input]  # main area and sidebar
    assert seeds.count("seed") == 1 and "cmp_seed" not in seeds
    caption = " ".join(at.dataframe[0].value["word"][:-1])
    paths = sample_locations(hard.model, hard.vocab, tensor, caption, 5, seed=9)
    marks = trace(charts(at)[1], "scatter", "sampled locations")
    assert sum(k for _, _, k in marks["customdata"]) == 5
    gw = paths.grid[1]
    assert Counter({r * gw + c: k for r, c, k in marks["customdata"]}) == Counter(paths.locations[:, 0].tolist())
