"""Provenance: every caption says how it was decoded; a supervised model carries "not in the paper" on every page;
one click goes back to the paper's decoding."""

from __future__ import annotations

import pytest

pytest.importorskip("streamlit")  # the app's tests: skipped where streamlit is not installed

from tests.explorer.test_pages import open_page

PAPER = "the paper's decoding (plain beam search, as the checkpoint was evaluated)"
PAGES = ["caption", "step", "compare", "score", "elsewhere", "errors", "teach", "card"]


def _captions(at) -> list[str]:
    return [c.value for c in at.caption]


@pytest.mark.parametrize("page", ["caption", "step", "score", "compare", "errors"])
def test_every_caption_says_how_it_was_decoded(explorer_env, page):
    at = open_page(page, {"ckpt": "tiny-soft"})
    lines = [c for c in _captions(at) if "beam search, beam size 3, no length normalisation" in c]
    assert lines and all(PAPER in c for c in lines), _captions(at)


def test_a_changed_decoding_says_so_and_one_click_goes_back_to_the_papers(explorer_env):
    at = open_page("caption", {"ckpt": "tiny-soft"})
    assert at.sidebar.button(key="paper_decoding").disabled  # already the paper's
    at.sidebar.slider(key="beam").set_value(5).run()
    at.sidebar.slider(key="lnorm").set_value(1.0).run()
    line = next(c for c in _captions(at) if c.startswith("Decoded by"))
    assert line.startswith("Decoded by beam search, beam size 5, length normalisation 1")
    assert "changed in the sidebar from the decoding the checkpoint was evaluated with (beam 3, length " \
           "normalisation 0, at most 20 words)" in line and PAPER not in line
    at.sidebar.button(key="paper_decoding").click().run()
    assert at.sidebar.slider(key="beam").value == 3 and at.sidebar.slider(key="lnorm").value == 0.0
    assert any(c.startswith("Decoded by beam search, beam size 3") and PAPER in c for c in _captions(at))
    at.sidebar.slider(key="maxlen").set_value(12).run()  # the length cap is part of the checkpoint's decoding
    line = next(c for c in _captions(at) if c.startswith("Decoded by"))
    assert "no length normalisation, at most 12 words: changed in the sidebar" in line and PAPER not in line
    at.sidebar.button(key="paper_decoding").click().run()
    assert at.sidebar.slider(key="maxlen").value == 20


@pytest.mark.parametrize("page", PAGES)
def test_a_supervised_model_is_marked_not_in_the_paper_on_every_page(explorer_env, page):
    at = open_page(page, {"ckpt": "tiny-hard-normed"})  # trained, its record says, with attention_lambda 0.5
    assert any(c.startswith("**Not in the paper:** this model's attention was also trained on the objects' masks")
               and "λ_a = 0.5" in c for c in _captions(at)), page
    plain = open_page(page, {"ckpt": "tiny-soft"})
    assert not any(c.startswith("**Not in the paper:**") for c in _captions(plain))
