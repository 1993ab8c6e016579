"""Slides: the exports' font has α, β, Σ and ×; GIF frames at slide size; the header and the JSON carry the full
decoding settings."""

from __future__ import annotations

import io
import json

import numpy as np
from PIL import Image, ImageDraw

from sat_core import viz

import pytest
pytest.importorskip("streamlit")  # the app's tests: skipped where streamlit is not installed

from explorer import exports, maps


def _ink(font, text: str) -> np.ndarray:
    canvas = Image.new("L", (80, 40), 0)
    ImageDraw.Draw(canvas).text((5, 5), text, fill=255, font=font)
    return np.asarray(canvas)


def test_the_figures_font_has_alpha_beta_sigma_and_times():
    font = viz.text_font(18)
    assert getattr(font, "path", None) == str(maps.FONT) and maps.FONT.is_file()
    assert (maps.FONT.parent / "LICENSE-DejaVu.txt").is_file()
    missing = _ink(font, "\ue000")  # a private-use code point: the font's "no such glyph" box
    for glyph in "αβΣ×":
        drawn = _ink(font, glyph)
        assert drawn.any() and not np.array_equal(drawn, missing), glyph


def test_the_exports_on_the_caption_page_are_slide_sized_and_say_how_the_caption_was_decoded(explorer_env):
    from tests.explorer.test_pages import open_page

    at = open_page("caption", {"ckpt": "tiny-soft", "lnorm": "0.5", "beam": "4"})
    labels = [b.label for b in at.get("download_button")]
    assert f"Download animation (GIF, {exports.GIF_SIDE} px)" in labels
    ctx = at.session_state["_ctx"]
    from explorer.guards import beams, read_back

    # the page's own helpers, outside the page: the same export the buttons give
    best = beams(ctx)[0]
    numbers = read_back(ctx, best)
    meta = exports.export_meta(ctx, ctx.image, best, numbers)
    assert meta["decoding"]["beam_size"] == 4 and meta["decoding"]["length_norm"] == 0.5
    assert meta["decoding"]["max_len"] == ctx.decode.max_len and meta["decoding"]["precision"] == "auto"
    words = maps.step_words(best.words, len(numbers.alphas))
    png = Image.open(io.BytesIO(exports.slide_png(ctx.image, words, numbers, ctx.maps, meta)))
    assert png.width >= 1600
    doc = json.loads(viz.alphas_json(words, numbers.alphas, numbers.betas, numbers.grid, meta=meta))
    assert doc["meta"]["decoding"] == ctx.decode.to_dict() and doc["meta"]["caption"] == best.caption
    gif = Image.open(io.BytesIO(viz.strip_gif(ctx.image.crop, words, numbers.alphas, numbers.grid,
                                              **{**ctx.maps.viz_kwargs(), "panel_size": exports.GIF_SIDE})))
    assert gif.size[0] == exports.GIF_SIDE and gif.size[1] >= exports.GIF_SIDE
    line = exports.decoding_text(meta["decoding"])
    assert line.startswith("beam 4, length normalisation 0.5, max length") and "auto search" in line
