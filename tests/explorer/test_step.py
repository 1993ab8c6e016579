"""Step through, teaching page and links that restore a view."""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import re

import numpy as np

from sat_core.config import DecodeConfig
from sat_core.decoding import DecodeSession, beam_search
from sat_core.data.images import load_image, preprocess

import pytest
pytest.importorskip("streamlit")  # the app's tests: skipped where streamlit is not installed

from tests.explorer.conftest import new_app


def reference_session(env, attention: str, scene: int, max_len: int = 20) -> DecodeSession:
    loaded = env.checkpoint(attention)
    tensor, _ = preprocess(load_image(env.scene_path(scene)), loaded.preprocess)
    return DecodeSession(loaded.model, loaded.vocab, tensor, DecodeConfig(beam_size=1, max_len=max_len, precision="fp32"), top_k=5)


def step_line(at) -> str:
    lines = [m.value for m in at.markdown if m.value.startswith("**Step ")]
    assert len(lines) == 1, [m.value for m in at.markdown]
    return lines[0]


def alpha_chart(at, index: int = 0) -> dict:
    return json.loads(at.get("plotly_chart")[index].proto.spec)


def plotly_array(value) -> np.ndarray:
    """Plotly's JSON stores numpy arrays as base64 ({"dtype", "bdata", "shape"}) or plain lists."""
    if isinstance(value, dict) and "bdata" in value:
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        shape = value.get("shape")
        return flat.reshape([int(x) for x in str(shape).split(",")]) if shape else flat
    return np.asarray(value)


def open_step(params=None):
    at = new_app(params)
    at.switch_page("views/step.py")
    at.run()
    assert not at.exception, at.exception
    return at


class FakeClock:
    """time.monotonic for the step view's Play: moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_next_back_play_follow_the_decode_session(explorer_env, monkeypatch):
    from explorer import stepping

    clock = FakeClock()
    monkeypatch.setattr(stepping, "time", clock)
    scene = explorer_env.test_ids()[0]
    ref = reference_session(explorer_env, "soft", scene)
    first = ref.step()
    at = open_step()
    assert step_line(at).startswith(f"**Step 1:** <mark>**{first.word}**</mark>")
    chart = alpha_chart(at)
    heat = next(t for t in chart["data"] if t["type"] == "heatmap")
    np.testing.assert_allclose(plotly_array(heat["z"]), first.alpha, rtol=1e-5, atol=1e-7)  # hover shows exact α
    bars = alpha_chart(at, 1)["data"][0]
    assert list(plotly_array(bars["y"])) == first.top_words
    np.testing.assert_allclose(plotly_array(bars["x"]), first.top_probs, rtol=1e-5)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["β_t (gate)"] == f"{first.beta:.3f}"
    grid = at.dataframe[0].value.to_numpy()
    np.testing.assert_allclose(grid, np.round(first.alpha, 4), atol=1e-6)

    at.button(key="step_next").click().run()
    second = ref.step()
    assert step_line(at).startswith(f"**Step 2:** {first.word} <mark>**{second.word}**</mark>")
    assert at.query_params["step"] == "2"
    at.button(key="step_back").click().run()
    assert step_line(at).startswith("**Step 1:**")
    ref.back()
    ref.back()
    words = [s.word for s in ref.run()]
    at.button(key="step_play").click().run()  # Play animates: one more word per tick of the view's timer
    shown = [step_line(at)]
    assert at.button(key="step_play").label == "⏸ Pause" and at.button(key="step_next").disabled
    for _ in range(len(words) + 2):
        clock.now += 1.0  # the default speed: a word a second
        at.run()  # what the timer does: rerun the step view
        shown.append(step_line(at))
    numbers = [int(line.split(":**")[0].removeprefix("**Step ")) for line in shown]
    assert numbers[: len(words)] == list(range(1, len(words) + 1)) and set(numbers[len(words):]) == {len(words)}
    assert at.button(key="step_play").label == "▶ Play"  # it stopped at the end
    assert at.button(key="step_next").disabled
    ended = ref.steps[-1].token == ref.vocab.end_id
    expected = f"Caption complete after {len(words)} steps" if ended else f"Caption cut at the length cap of {len(words)}"
    assert any(expected in s.value for s in at.success)


def test_forcing_a_word_continues_from_it(explorer_env):
    scene = explorer_env.test_ids()[0]
    at = open_step()
    choice = at.selectbox(key="force_choice")
    word = choice.options[1]  # a word that was not chosen
    choice.set_value(word)
    at.button(key="force_button").click().run()
    assert step_line(at).startswith(f"**Step 1:** <mark>**<u>{word}</u>***</mark>")
    assert at.query_params["force"] == f"0:{word}"
    at.button(key="step_next").click().run()
    ref = reference_session(explorer_env, "soft", scene)
    ref.step(force=word)
    after = ref.step()
    assert step_line(at).startswith(f"**Step 2:** <u>{word}</u>* <mark>**{after.word}**</mark>")


def test_a_link_restores_scene_step_forced_words_and_display(explorer_env):
    scene = explorer_env.test_ids()[3]
    ref = reference_session(explorer_env, "hard", scene, max_len=12)
    forced = ref.vocab.itos[10]
    ref.step()
    ref.step(force=forced)
    third = ref.step()
    params = {"ckpt": "tiny-hard", "scene": str(scene), "step": "3", "force": f"1:{forced}", "maxlen": "12",
              "method": "pyramid", "sigma": "4.0", "norm": "caption", "opacity": "0.3", "cmap": "inferno"}
    at = open_step(params)
    assert at.sidebar.selectbox(key="ckpt").value == "tiny-hard"
    assert at.sidebar.selectbox(key="scene").value == scene
    assert at.sidebar.slider(key="maxlen").value == 12
    assert at.radio(key="method").value == "pyramid" and at.radio(key="norm").value == "caption"
    assert at.slider(key="opacity").value == 0.3 and at.slider(key="sigma").value == 4.0
    assert at.selectbox(key="cmap").value == "inferno"
    assert f"<u>{ref.steps[1].word}</u>*" in step_line(at)
    assert step_line(at).startswith("**Step 3:**") and f"<mark>**{third.word}**</mark>" in step_line(at)
    # hard attention marks the location (argmax α in expectation mode)
    traces = alpha_chart(at)["data"]
    marker = next(t for t in traces if t["type"] == "scatter")
    row, col = divmod(int(np.argmax(third.alpha)), third.alpha.shape[1])
    cell = 112 / third.alpha.shape[0]
    assert list(plotly_array(marker["x"])) == [(col + 0.5) * cell]
    assert list(plotly_array(marker["y"])) == [(row + 0.5) * cell]
    for key, value in params.items():  # the app writes the same view back into the URL
        assert at.query_params[key] == value, key


def test_bad_values_in_a_link_fall_back_to_defaults(explorer_env):
    at = open_step({"scene": "99999", "beam": "lots", "method": "sharpest", "force": "0:notaword"})
    assert not at.exception
    assert at.sidebar.selectbox(key="scene").value == explorer_env.test_ids()[0]
    assert at.radio(key="method").value == "nearest"
    assert any("not in the model's vocabulary" in e.value for e in at.error)
    assert step_line(at).startswith("**Step 1:**")


def test_teaching_page_fills_equations_with_the_current_step(explorer_env):
    scene = explorer_env.test_ids()[0]
    ref = reference_session(explorer_env, "soft", scene)
    ref.step()
    second = ref.step()
    at = open_step()
    at.button(key="step_next").click().run()
    at.switch_page("views/teach.py")
    at.run()
    assert not at.exception
    latex = " ".join(x.value for x in at.latex)
    assert rf"\beta_t = {second.beta:.3f}" in latex
    assert rf"\max_i \alpha_{{ti}} = {second.alpha.max():.3f}" in latex
    assert f"{second.top_probs[0]:.3f}" in latex
    assert step_line(at).startswith("**Step 2:**")
    at.button(key="teach_next").click().run()
    assert step_line(at).startswith("**Step 3:**")


def test_sampled_hard_attention_marks_the_sampled_location(explorer_env):
    scene = explorer_env.test_ids()[1]
    loaded = explorer_env.checkpoint("hard")
    tensor, _ = preprocess(load_image(explorer_env.scene_path(scene)), loaded.preprocess)
    cfg = DecodeConfig(beam_size=1, max_len=20, hard_mode="sample", seed=3, precision="fp32")
    first = DecodeSession(loaded.model, loaded.vocab, tensor, cfg, top_k=5).step()
    at = open_step({"ckpt": "tiny-hard", "scene": str(scene), "hard_mode": "sample", "seed": "3"})
    marker = next(t for t in alpha_chart(at)["data"] if t["type"] == "scatter")
    assert marker["name"] == "sampled location"
    row, col = divmod(first.location, first.alpha.shape[1])
    cell = 112 / first.alpha.shape[0]
    assert list(plotly_array(marker["x"])) == [(col + 0.5) * cell]
    assert list(plotly_array(marker["y"])) == [(row + 0.5) * cell]


def test_a_reset_says_why_and_rewrites_the_link(explorer_env):
    at = open_step()
    at.button(key="step_next").click().run()
    at.button(key="step_next").click().run()
    assert at.query_params["step"] == "3"
    other = [i for i in explorer_env.test_ids() if i != at.sidebar.selectbox(key="scene").value][0]
    at.sidebar.selectbox(key="scene").set_value(other).run()
    assert any("Back to step 1: the image changed" in i.value for i in at.info)
    assert step_line(at).startswith("**Step 1:**") and at.query_params.get("step", "1") == "1"
    at.button(key="step_next").click().run()
    at.sidebar.slider(key="maxlen").set_value(5).run()
    assert any("Back to step 1: the decoding settings changed" in i.value for i in at.info)


def test_the_page_says_what_forcing_does_and_which_distribution_is_shown(explorer_env):
    at = open_step()
    view_word = step_line(at).split("<mark>**")[1].split("**")[0]
    assert any(m.value.startswith("**p(word 1 | image): the 5 most probable**") and view_word in m.value
               for m in at.markdown)
    assert any("α and β of this step stay as they are" in c.value for c in at.caption)
    at.button(key="step_next").click().run()
    assert any(m.value.startswith("**p(word 2 | image, words 1–1)") for m in at.markdown)
    assert at.toggle(key="follow").value is True  # Next follows the Caption page's caption
    at.toggle(key="follow").set_value(False).run()
    assert any("beam size 3, so its caption can differ" in c.value for c in at.caption)
    assert at.query_params["follow"] == "0"


def step_words(at) -> list[str]:
    return html.unescape(re.sub(r"<[^>]+>|\*", "", step_line(at))).split()[2:]  # "**Step 4:** a <mark>…" -> the words


def test_step_through_replays_the_caption_pages_caption_and_says_where_beam_search_chose(explorer_env):
    """With a beam wider than 1, Next takes the beam's words: stepping to the end gives the Caption page's caption,
    and where the beam took a word that is not its step's most probable, the page says which greedy would take."""
    loaded = explorer_env.checkpoint("soft")
    cfg = dataclasses.replace(loaded.decode_defaults(), beam_size=10)  # the tiny model's beam 3 says what greedy says
    found = None
    for scene in explorer_env.test_ids():
        tensor, _ = preprocess(load_image(explorer_env.scene_path(scene)), loaded.preprocess)
        best = beam_search(loaded.model, tensor[None], loaded.vocab, cfg)[0][0]
        follower = DecodeSession(loaded.model, loaded.vocab, tensor, dataclasses.replace(cfg, beam_size=1, precision="fp32"))
        follower.sync(99, {}, follow=best.tokens)
        chosen = [s for s in follower.steps if s.rank != 1]
        if chosen:
            found = scene, best, chosen[0]
            break
    assert found, "no test scene where the beam's caption leaves greedy decoding"
    scene, best, view = found
    at = open_step({"scene": str(scene), "step": "99", "beam": "10"})
    assert step_words(at) == best.words + (["<end>"] if best.finished else [])
    caption = new_app({"scene": str(scene), "beam": "10"})
    caption.run()
    assert any(m.value == f"**Caption:** {best.caption}" for m in caption.markdown)
    at = open_step({"scene": str(scene), "step": str(view.index + 1), "beam": "10"})
    note = next(i.value for i in at.info if i.value.startswith("**Beam search chose"))
    assert f"chose “{view.word}”" in note and f"would have said “{view.top_words[0]}”" in note
    at.switch_page("views/teach.py").run()  # How it works shows the same step and says why the word was chosen
    assert not at.exception, at.exception
    assert any(f"greedy decoding would take “{view.top_words[0]}”" in c.value for c in at.caption)
    assert any("by beam search" in x.value for x in at.latex)
    at.switch_page("views/step.py").run()
    at.toggle(key="follow").set_value(False).run()  # greedy: the step's word is its most probable one
    assert step_words(at)[-1] == view.top_words[0]
    assert not any(i.value.startswith("**Beam search chose") for i in at.info)


def test_a_link_to_a_scene_this_gallery_lacks_says_so_and_shows_its_first_image(explorer_env):
    at = new_app({"scene": "987654"})
    at.run()
    assert not at.exception, at.exception
    first = explorer_env.test_ids()[0]
    assert at.sidebar.selectbox(key="scene").value == first
    notes = [i.value for i in at.sidebar.info
             if i.value.startswith("Scene 987654 (from the link) is not in this gallery")]
    assert len(notes) == 1 and "made with another dataset or split" in notes[0]
    other = explorer_env.test_ids()[1]
    at.sidebar.selectbox(key="scene").set_value(other).run()  # the user's own choice: the notice goes
    assert not any(i.value.startswith("Scene 987654") for i in at.sidebar.info)
    fine = new_app({"scene": str(other)})
    fine.run()
    assert fine.sidebar.selectbox(key="scene").value == other and not any(
        i.value.startswith("Scene ") for i in fine.sidebar.info)


def test_the_presenter_view_shows_the_step_through_steps_in_large_type(explorer_env):
    at = open_step()
    at.button(key="step_next").click().run()
    at.button(key="step_next").click().run()
    words = step_line(at).split(":**", 1)[1]
    at.switch_page("views/present.py").run()
    assert not at.exception, at.exception
    html = " ".join(m.value for m in at.markdown)
    assert 'class="sat-present-caption"' in html and "Step 3:" in html  # the same step as Step through
    assert '[data-testid="stSidebar"]' in html and "display: none" in html  # no sidebar on the projector
    assert "font-size: 2.6rem" in html
    at.button(key="present_next").click().run()
    assert "Step 4:" in " ".join(m.value for m in at.markdown)
    at.switch_page("views/step.py").run()
    assert step_line(at).startswith("**Step 4:**")  # back in Step through where the presenter left it
    assert words.split()[-1].replace("<mark>", "").replace("</mark>", "").strip("*") in step_line(at)


@pytest.mark.parametrize("mark, shown", [(0.0, True), (-1e6, False)])
def test_a_finished_caption_under_the_checkpoints_mark_is_flagged_unsure(explorer_env, tmp_path, monkeypatch,
                                                                         mark, shown):
    """Played to its end, a caption whose log p lies under the checkpoint's mark (any caption under 0) gets the
    Caption page's unsure note; with a mark no caption goes under, none."""
    import os

    from sat_core.checkpoint import save_checkpoint
    from sat_core.evaluation.confidence import ConfidenceReference

    loaded = explorer_env.checkpoint("soft")
    save_checkpoint(tmp_path / "marked", loaded.model, model_config=loaded.model_config, vocab=loaded.vocab,
                    preprocess=loaded.preprocess, training={"confidence": ConfidenceReference(mark, 0.1, 400).to_dict()})
    monkeypatch.setenv("SAT_CHECKPOINT_DIRS", os.pathsep.join([str(explorer_env.roots), str(tmp_path)]))
    at = open_step({"ckpt": "marked", "scene": str(explorer_env.test_ids()[0]), "step": "99"})
    done = [s.value for s in at.success if s.value.startswith(("Caption complete", "Caption cut"))]
    assert len(done) == 1  # played to its end (finished, or cut at the length cap)
    notes = [i.value for i in at.info if i.value.startswith("**The model is unsure of this caption.**")]
    assert len(notes) == int(shown)
    if notes:
        logprob = float(done[0].split("log p = ")[1].split(")")[0])
        assert f"(log p = {logprob:.2f})" in notes[0]
