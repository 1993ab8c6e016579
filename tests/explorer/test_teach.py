"""How it works: image and α beside the equations, the hard model's objective, the penalty with a scale."""

from __future__ import annotations

import numpy as np

from sat_core.evaluation.alpha import doubly_stochastic

import pytest
pytest.importorskip("streamlit")  # the app's tests: skipped where streamlit is not installed

from tests.explorer.test_step import alpha_chart, open_step, plotly_array, reference_session


def open_teach(params=None, steps: int = 1):
    at = open_step(params)
    for _ in range(steps - 1):
        at.button(key="step_next").click().run()
    at.switch_page("views/teach.py")
    at.run()
    assert not at.exception, at.exception
    return at


def latex(at) -> str:
    return " ".join(x.value for x in at.latex)


def test_soft_model_shows_image_alpha_gate_and_a_scaled_penalty(explorer_env):
    scene = explorer_env.test_ids()[0]
    ref = reference_session(explorer_env, "soft", scene)
    first = ref.step()
    at = open_teach()
    assert at.image, "the image is on the page"
    heat = next(t for t in alpha_chart(at)["data"] if t["type"] == "heatmap")
    np.testing.assert_allclose(plotly_array(heat["z"]), first.alpha, rtol=1e-5, atol=1e-7)
    text = latex(at)
    assert rf"\beta_t = {first.beta:.3f}" in text
    L = first.alpha.size
    value = float(doubly_stochastic(ref.alphas))
    uniform = L * (1 - 1 / L) ** 2
    shown = " ".join(m.value for m in at.markdown)
    assert "Over the 1 step so far:" in shown and "1 steps" not in shown + text
    assert f"{value:.2f} \\;=\\; {value / L:.3f}\\ \\text{{per region}}" in text
    assert f"{uniform:.2f} \\;=\\; {uniform / L:.3f}\\ \\text{{per region}}" in text
    assert "REINFORCE" not in " ".join(s.value for s in at.subheader)


def test_plural_steps_after_three_steps(explorer_env):
    scene = explorer_env.test_ids()[0]
    ref = reference_session(explorer_env, "soft", scene)
    for _ in range(3):
        ref.step()
    at = open_teach(steps=3)
    L = ref.alphas.shape[1]
    text = latex(at)
    assert any(m.value == "Over the 3 steps so far:" for m in at.markdown)
    assert f"{L * (1 - 3 / L) ** 2:.2f}" in text


def test_hard_model_shows_reinforce_and_no_gate(explorer_env):
    at = open_teach({"ckpt": "tiny-hard"})
    text = latex(at)
    assert r"\beta" not in text  # no gate for hard attention
    assert r"\lambda_r" in text and r"\lambda_e" in text and r"b_k = 0.9\, b_{k-1} + 0.1" in text
    hard = explorer_env.checkpoint("hard").model_config.hard
    assert rf"\lambda_e = {hard.entropy_weight:g}" in text
    assert any(s.value == "4 · Training signal: REINFORCE over sampled locations" for s in at.subheader)
    assert any("hard attention is trained without it" in m.value for m in at.markdown)
    assert not any("gate β_t" in m.value for m in at.markdown)
    assert r"\arg\max_i \alpha_{ti} = \text{row" in text and "s_t = \\text{row" not in text  # nothing sampled
    sampled = latex(open_teach({"ckpt": "tiny-hard", "hard_mode": "sample", "seed": "2"}))
    assert r"s_t = \text{row" in sampled


def test_the_page_says_when_a_models_attention_was_supervised(explorer_env):
    supervised = [x.value for x in open_teach({"ckpt": "tiny-hard-normed"}).info if "supervised attention" in x.value]
    assert len(supervised) == 1 and "λ_a = 0.5" in supervised[0] and "not in the paper" in supervised[0]
    assert not [x.value for x in open_teach().info if "supervised attention" in x.value]
