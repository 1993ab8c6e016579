"""One set of numbers: the same p, log p and α for one image, caption and step on every page; no gate for hard
models; paired maps on one colour scale; corpus and per-image figures told apart."""

from __future__ import annotations

import re

import pytest
pytest.importorskip("streamlit")  # the app's tests: skipped where streamlit is not installed

from tests.explorer.test_compare import charts, open_compare
from tests.explorer.test_pages import open_page


def _caption_page(params):
    at = open_page("caption", params)
    metrics = {m.label: m.value for m in at.metric}
    beam = at.dataframe[0].value
    return at, metrics, beam


def _step_page(params, step: int):
    at = open_page("step", {**params, "step": str(step)})
    metrics = {m.label: (m.value, m.help) for m in at.metric}
    done = [s.value for s in at.success] + [e.value for e in at.warning]
    return at, metrics, done


def test_caption_step_score_and_teaching_show_the_same_numbers(explorer_env):
    params = {"ckpt": "tiny-soft", "maxlen": "6"}
    at, metrics, beam = _caption_page(params)
    caption = re.search(r"\*\*Caption:\*\* (.+?)( …|$)", next(m.value for m in at.markdown
                                                              if m.value.startswith("**Caption:**"))).group(1)
    words = caption.split()
    total = metrics["log p(caption)"]
    assert f"{beam['log p'][0]:.2f}" == total  # the beam table's best row is the caption the page reads

    # Score: the model's caption, word by word; its first len(words) rows are the caption's steps
    score = open_page("score", {**params, "score_ref": "model"})
    own = score.dataframe[1].value
    assert list(own["word"])[: len(words)] == words
    # a caption cut at the length cap has no <end> step on Caption: its log p sums the words only
    steps = len(words) + (1 if bool(beam["finished"][0]) else 0)
    assert abs(sum(own["log p"][:steps]) - float(total)) < 0.005 + 0.0005 * steps  # rows are rounded to 3 decimals

    # Step through and How it works at step 2: the same p(word) and log p as Score's row 2
    step, m, done = _step_page(params, 2)
    p_value, p_help = m[f"p({words[1]})"]
    assert p_value == f"{own['p'][1]:.3f}"
    assert p_help == f"log p = {own['log p'][1]:.3f}"
    teach = open_page("teach", {**params, "step": "2"})
    latex = " ".join(x.value for x in teach.latex)
    assert rf"\log p = {own['log p'][1]:.3f}" in latex
    bars = {w: p for w, p in re.findall(r"p\(\\text\{“(.+?)”\}\) = ([0-9.]+)", latex)}
    if words[1] in bars:  # the word among the four shown: its bar is the same p
        assert bars[words[1]] == f"{own['p'][1]:.3f}"

    # Step through at the end of the caption: the same total as Caption
    step, m, done = _step_page(params, 99)
    assert any(f"log p = {total}" in text for text in done), done


def test_hard_models_show_no_gate(explorer_env):
    params = {"ckpt": "tiny-hard"}
    step = open_page("step", params)
    assert not any(m.label.startswith("β") for m in step.metric)
    assert any(m.label.startswith("p(") for m in step.metric)
    score = open_page("score", params)
    assert "β" not in score.dataframe[0].value.columns
    soft = open_page("score", {"ckpt": "tiny-soft"})
    assert "β" in soft.dataframe[0].value.columns  # soft attention has its gate


def _colourbar_top(chart: dict) -> str:
    bar = next(t for t in chart["data"] if t["type"] == "scatter" and t["marker"].get("showscale"))
    return bar["marker"]["colorbar"]["ticktext"][-1]


def test_soft_vs_hard_draws_both_maps_on_one_named_scale(explorer_env):
    at = open_compare()
    at.slider(key="cmp_step").set_value(2).run()
    left, right = charts(at)[:2]
    named = next(c.value for c in at.caption if c.value.startswith("**Both maps on one colour scale**"))
    top = _colourbar_top(left)
    assert top == _colourbar_top(right)  # one scale
    vmax = float(re.search(r"α = ([0-9.e-]+)", named).group(1))
    assert f"{vmax:.3g}" == top
    at.radio(key="cmp_scale").set_value("own").run()
    own = charts(at)[:2]
    tops = sorted(float(_colourbar_top(c)) for c in own)
    assert float(top) == tops[-1]  # the shared scale is the higher of the two own scales
    assert any(c.value.startswith("**Each map on its own colour scale**") for c in at.caption)


def test_soft_vs_hard_reads_the_sidebars_checkpoint(explorer_env):
    at = open_page("compare", {"ckpt": "tiny-hard-normed"})
    assert at.selectbox(key="cmp_hard").value == "tiny-hard-normed"
    at = open_page("compare", {"ckpt": "tiny-soft"})
    assert at.selectbox(key="cmp_soft").value == "tiny-soft"


def test_error_analysis_names_corpus_and_per_image_figures(explorer_env):
    at = open_page("errors")
    n = len(at.dataframe[0].value)
    assert any(m.value.startswith(f"**Corpus figures, all {n} images**") for m in at.markdown)
    assert any(h.value == "Metrics per slice: means of per-image scores" for h in at.subheader)


def test_the_encoder_runs_once_per_image_for_every_page_and_session(explorer_env, monkeypatch):
    """The caption, the beam's read-backs, the out-of-domain check and a step-through session all read one set of
    annotations: a new upload costs one encoder pass however many pages and sessions look at it."""
    import io

    import numpy as np
    from PIL import Image

    from sat_core.models.captioner import Captioner

    calls = []
    encode = Captioner.encode
    monkeypatch.setattr(Captioner, "encode", lambda self, images: calls.append(len(images)) or encode(self, images))
    pixels = np.random.default_rng(len(calls) + 7).integers(0, 255, (96, 96, 3), dtype=np.uint8)  # an image no
    buffer = io.BytesIO()                                                                            # test has used
    Image.fromarray(pixels).save(buffer, format="PNG")
    upload = ("noise.png", buffer.getvalue(), "image/png")
    at = open_page("caption", {"ckpt": "tiny-soft", "source": "Upload"})
    at.file_uploader[0].set_value(upload).run()
    assert not at.exception and any(m.value.startswith("**Caption:**") for m in at.markdown)
    assert len(at.dataframe[0].value) > 1 and calls == [1]  # several hypotheses read back, one pass
    at.switch_page("views/step.py").run()
    assert not at.exception and at.metric and calls == [1]
    other = open_page("caption", {"ckpt": "tiny-soft", "source": "Upload"})  # another browser session
    other.file_uploader[0].set_value(upload).run()
    assert not other.exception and calls == [1]
