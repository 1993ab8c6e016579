"""Score a caption: the text box, punctuation, unknown words, one y axis, links."""

from __future__ import annotations

import json

import numpy as np

from sat_core.config import DecodeConfig
from sat_core.decoding import beam_search, score_caption

import pytest
pytest.importorskip("streamlit")  # the app's tests: skipped where streamlit is not installed

from tests.explorer.test_pages import open_page, tensor_for


def logp_charts(at) -> list[dict]:
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    return [s for s in specs if s["layout"].get("yaxis", {}).get("title", {}).get("text") == "log p"]


def test_the_text_box_is_there_at_once_with_the_first_reference(explorer_env):
    scene = explorer_env.test_ids()[0]
    at = open_page("score")
    reference = " ".join(next(e for e in explorer_env.dataset["images"] if e["imgid"] == scene)["sentences"][0]["tokens"])
    assert at.text_input(key="score_text").value == reference
    assert list(at.dataframe[0].value["word"]) == [*reference.split(), "<end>"]


def test_punctuation_is_stripped_and_only_unknown_words_are_listed(explorer_env):
    scene = explorer_env.test_ids()[0]
    loaded, tensor = tensor_for(explorer_env, "soft", scene)
    known = loaded.vocab.itos[4:7]
    at = open_page("score")
    at.text_input(key="score_text").set_value(f"{known[0].capitalize()} {known[1]}, {known[2]}! zorblax.").run()
    warnings = [w.value for w in at.warning]
    assert warnings == ["Not in the model's vocabulary, scored as <unk>: zorblax"]
    text = " ".join([*known, "zorblax"])
    assert any(f"Scored as: *{text}*" in c.value for c in at.caption)
    scored = score_caption(loaded.model, loaded.vocab, tensor, text, precision="fp32")
    table = at.dataframe[0].value
    assert list(table["word"]) == [*known, "<unk>", "<end>"]
    np.testing.assert_allclose(table["log p"], np.round(scored.logprobs, 3))
    assert list(table["known"]) == [True, True, True, False, True]
    assert any(f"**log p = {scored.logprob:.2f}**" in m.value for m in at.markdown)


def test_the_picker_fills_the_box_and_both_charts_share_one_y_axis(explorer_env):
    scene = explorer_env.test_ids()[0]
    loaded, tensor = tensor_for(explorer_env, "soft", scene)
    own = beam_search(loaded.model, tensor.unsqueeze(0), loaded.vocab, DecodeConfig())[0][0]
    at = open_page("score")
    at.selectbox(key="score_ref").set_value("model").run()
    assert at.text_input(key="score_text").value == own.caption
    at.selectbox(key="score_ref").set_value("ref2").run()
    reference = at.text_input(key="score_text").value
    expected = score_caption(loaded.model, loaded.vocab, tensor, reference, precision="fp32")
    mine = score_caption(loaded.model, loaded.vocab, tensor, own.caption, precision="fp32")
    assert any(m.value == f"#### The model's decode: {own.caption}" for m in at.markdown)
    assert any(f"log p {expected.logprob:.2f} vs {mine.logprob:.2f}" in m.value for m in at.markdown)
    charts = logp_charts(at)
    assert len(charts) == 2
    ranges = [c["layout"]["yaxis"]["range"] for c in charts]
    assert ranges[0] == ranges[1]
    lowest = min(expected.logprobs.min(), mine.logprobs.min())
    assert ranges[0][0] <= lowest and ranges[0][1] == 0


def test_a_link_restores_the_typed_caption(explorer_env):
    at = open_page("score")
    at.text_input(key="score_text").set_value("a big red circle").run()
    link = dict(at.query_params)
    assert link["score_text"] == "a big red circle"
    again = open_page("score", link)
    assert again.text_input(key="score_text").value == "a big red circle"
    assert list(again.dataframe[0].value["word"]) == ["a", "big", "red", "circle", "<end>"]
