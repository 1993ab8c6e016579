"""Readable, quantitative α: colour bars in real α values, a legible global scale, an enlarged view,
exports at slide resolution that say what they show."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from sat_core import viz
from sat_core.config import DecodeConfig
from sat_core.decoding import beam_search, score_caption
from sat_core.data.images import load_image, preprocess

pytest.importorskip("streamlit")  # the app's tests: skipped where streamlit is not installed

from explorer import exports, maps
from tests.explorer.conftest import new_app
from tests.explorer.test_step import plotly_array


def _colorbar(chart: dict) -> dict:
    bars = [t for t in chart["data"] if t.get("marker", {}).get("showscale")]
    assert len(bars) == 1, "one colour bar per α map"
    return bars[0]["marker"]


def _open(page: str, params=None):
    at = new_app(params)
    at.switch_page(f"views/{page}.py")
    at.run()
    assert not at.exception, at.exception
    return at


def test_every_step_map_has_a_colour_bar_in_real_alpha_values(explorer_env):
    at = _open("step")
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)
    heat = next(t for t in chart["data"] if t["type"] == "heatmap")
    alpha = plotly_array(heat["z"]).astype(float)
    bar = _colorbar(chart)
    top = float(bar["colorbar"]["ticktext"][-1])
    assert top == pytest.approx(alpha.max(), rel=1e-2)  # per word, raw cells: full colour is this map's max α
    at.sidebar.radio(key="norm").set_value("global").run()
    bar = _colorbar(json.loads(at.get("plotly_chart")[0].proto.spec))
    assert bar["colorbar"]["ticktext"][-1] == "1" and float(bar["colorbar"]["ticktext"][2]) == pytest.approx(0.25)


def test_global_scale_stays_legible():
    alphas = np.full((1, 196), 1 / 196)  # uniform attention: α ≈ 0.005 everywhere
    heat = viz.normalise_maps(alphas.reshape(1, 14, 14), "global", global_max=1.0)
    assert heat.max() > 0.07  # √0.005: a visible tint, where α / 1 (0.005) was black


def test_the_caption_page_has_an_enlarged_view_and_a_scaled_strip(explorer_env):
    at = _open("caption")
    assert at.selectbox(key="closer_word").value == 0
    closer = json.loads(at.get("plotly_chart")[-1].proto.spec)
    assert "step 1" in closer["layout"]["title"]["text"] and _colorbar(closer)
    at.selectbox(key="closer_word").set_value(1).run()
    closer = json.loads(at.get("plotly_chart")[-1].proto.spec)
    assert "step 2" in closer["layout"]["title"]["text"]
    assert any("What the encoder saw" in str(i.proto) for i in at.image)


def test_slide_export_is_wide_and_names_caption_checkpoint_image_and_crop(explorer_env):
    loaded = explorer_env.checkpoint("soft")
    path = explorer_env.scene_path(explorer_env.test_ids()[0])
    original = load_image(path)
    tensor, crop_info = preprocess(original, loaded.preprocess)
    cfg = DecodeConfig(beam_size=3, length_norm=0.5, max_len=12)
    best = beam_search(loaded.model, tensor[None], loaded.vocab, cfg)[0][0]
    numbers = score_caption(loaded.model, loaded.vocab, tensor, best.tokens, precision="fp32")
    crop = np.asarray(original.crop(crop_info.box).resize((112, 112)))
    image = SimpleNamespace(name=path.name, crop=crop, crop_info=crop_info)
    ctx = SimpleNamespace(ckpt_name="tiny-soft", decode=cfg, maps=maps.MapSettings(), loaded=loaded)
    meta = exports.export_meta(ctx, image, best, numbers)
    assert meta["checkpoint"] == "tiny-soft" and meta["image"] == path.name
    assert meta["crop"]["box"] == list(crop_info.box) and meta["truncated"] == (not best.finished)
    # every decoding setting travels with the figure: enough to decode the caption again
    assert DecodeConfig.from_dict(meta["decoding"]) == cfg
    again = beam_search(loaded.model, tensor[None], loaded.vocab, DecodeConfig.from_dict(meta["decoding"]))[0][0]
    assert again.caption == meta["caption"]
    assert "beam 3, length normalisation 0.5, max length 12" in exports.decoding_text(meta["decoding"])
    words = maps.step_words(best.words, len(best.alphas))
    for n_words in (len(words), 2):
        png = exports.slide_png(image, words[:n_words], _cut(best, n_words), maps.MapSettings(), meta)
        picture = Image.open(io.BytesIO(png))
        assert picture.width >= 1600, (n_words, picture.size)
    text = viz.alphas_json(words, best.alphas, best.betas, best.grid, meta=meta)
    assert json.loads(text)["meta"]["caption"] == best.caption


def _cut(best, n):
    return SimpleNamespace(alphas=best.alphas[:n], grid=best.grid, caption=best.caption)


def test_links_restore_the_enlarged_word_and_the_error_filters(explorer_env):
    at = _open("caption")
    at.selectbox(key="closer_word").set_value(2).run()
    assert at.query_params["closer_word"] == "2"
    again = _open("caption", dict(at.query_params))
    assert again.selectbox(key="closer_word").value == 2
    errors = _open("errors")
    labelled = errors.dataframe[0].value
    label = next(e for e in labelled["errors"] if e != "—").split(", ")[0]
    errors.multiselect(key="err_labels").set_value([label])
    errors.selectbox(key="err_sort").set_value("image_id").run()
    assert errors.query_params["err_labels"] == label and errors.query_params["err_sort"] == "image_id"
    restored = _open("errors", dict(errors.query_params))
    assert restored.multiselect(key="err_labels").value == [label]
    assert restored.selectbox(key="err_sort").value == "image_id"
    assert list(restored.dataframe[0].value["image_id"]) == sorted(restored.dataframe[0].value["image_id"])


@pytest.mark.parametrize("page", ["compare", "elsewhere", "teach"])
def test_the_other_pages_maps_carry_a_colour_bar_too(explorer_env, page):
    at = _open(page)
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    maps_drawn = [c for c in charts if any(t["type"] == "heatmap" for t in c["data"])]
    assert maps_drawn, f"no α map on {page}"
    peaks = [plotly_array(next(t for t in c["data"] if t["type"] == "heatmap")["z"]).astype(float).max()
             for c in maps_drawn]
    for chart, peak in zip(maps_drawn, peaks):
        top = float(_colorbar(chart)["colorbar"]["ticktext"][-1])
        # Soft vs hard and Look elsewhere draw their two maps on one scale: the higher of the two peaks
        assert top == pytest.approx(max(peaks) if page in ("compare", "elsewhere") else peak, rel=1e-2)
