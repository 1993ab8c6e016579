"""Step through: one word at a time, with α, the next-word distribution and β of every step."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import streamlit as st

from sat_core import viz
from sat_core.decoding import DecodeSession, StepView
from sat_core.evaluation.alpha import alpha_summary
from sat_core.regions import mask_in_crop

from explorer import maps, runlog, stepping
from explorer.components import stepper
from explorer.components.figures import draw_alpha, draw_topk
from explorer.components.text import crop_note, draw_caption, draw_help, draw_references, draw_unsure_note
from explorer.guards import decoding_line, need_image, need_model, object_masks, unsure_note
from explorer.maps import MapSettings
from explorer.resources import PreparedImage
from explorer.state import Context, context, write_url


SPEEDS = {"slow (2 s a word)": 2.0, "normal (1 s)": 1.0, "fast (0.4 s)": 0.4}


def draw_controls(session: DecodeSession) -> None:
    """Back / Next (also the ← and → keys), Play at a chosen speed, Reset."""
    playing = bool(st.session_state.get(stepping.PLAYING))
    c1, c2, c3, c4, c5 = st.columns([1, 1, 1, 1.3, 1])
    c1.button("◀ Back", key="step_back", on_click=stepping.back, disabled=len(session.steps) <= 1 or playing,
              width="stretch", help="Previous word (← key)")
    c2.button("Next ▶", key="step_next", on_click=stepping.next_step, disabled=session.done or playing,
              width="stretch", type="primary", help="Next word (→ key)")
    speed = SPEEDS.get(st.session_state.get("play_speed"), 1.0)
    c3.button("⏸ Pause" if playing else "▶ Play", key="step_play", on_click=stepping.play, args=(speed,),
              disabled=session.done and not playing, width="stretch", help="Add one word at a time")
    c4.selectbox("Speed", list(SPEEDS), index=1, key="play_speed", label_visibility="collapsed")
    c5.button("Reset", key="step_reset", on_click=stepping.reset, width="stretch", disabled=playing)


def draw_force(view: StepView, following: bool) -> None:
    """Pick another word of the top-k for the current step; decoding continues from it."""
    others = [w for w in view.top_words if w != view.word] or view.top_words
    c1, c2 = st.columns([2, 1], vertical_alignment="bottom")
    c1.selectbox(f"Force a different word at step {view.index + 1}", others, key="force_choice")
    # The callback reads the choice when clicked (args bound now would hold the previous run's value).
    c2.button("Force word", key="force_button", on_click=lambda: stepping.force(st.session_state["force_choice"]),
              width="stretch")
    st.caption(f"Forcing replaces word {view.index + 1} only. α and β of this step stay as they are: they were "
               f"computed from h_{view.index}, before any word was picked. The forced word enters the LSTM, so "
               f"the change shows from step {view.index + 2} on — in its distribution first, and in its α, "
               f"which is computed from the new h_{view.index + 1}."
               + (" A word other than the Caption page's leaves its caption: from there on Next takes the most "
                  "probable word." if following else ""))


def draw_beam_choice(view: StepView) -> None:
    """Where the replayed beam caption takes a word greedy decoding would not have taken, say so."""
    if not view.beam_chose:
        return
    where = (f"number {view.rank} of the {len(view.top_words)} most probable words here" if view.rank else
             f"not among the {len(view.top_words)} most probable words here")
    st.info(f"**Beam search chose “{view.word}”** (p = {np.exp(view.logprob):.3f}), {where}: greedy decoding "
            f"would have said “{view.top_words[0]}”. The beam kept the caption that goes on with “{view.word}” "
            "because, finished, it ranked first (the Caption page's beam table shows the captions it beat).",
            icon=":material/alt_route:")


def overlay_for_step(image: PreparedImage, session: DecodeSession, settings: MapSettings,
                     with_masks: bool) -> np.ndarray:
    alphas = session.alphas  # (T, L)
    overlay = maps.overlays(image.crop, alphas, session.grid, settings)[-1]
    masks = object_masks(image) if with_masks else []
    if masks:
        overlay = viz.outline_masks(overlay, [mask_in_crop(m, image.crop_info) for m in masks], (255, 255, 255))
    return overlay


def draw_step(ctx: Context, image: PreparedImage, session: DecodeSession, hard: bool, following: bool) -> None:
    view = session.steps[-1]
    summary = alpha_summary(view.alpha)
    with_masks = bool(object_masks(image)) and st.checkbox("Outline ground-truth objects", key="masks")
    left, right = st.columns([3, 2])
    with left:
        st.markdown(f"**α at step {view.index + 1}** (word “{view.word}”) — hover a cell for its exact value")
        scale = maps.colour_scale(image.crop.shape[0], session.alphas, session.grid, ctx.maps, t=view.index)
        draw_alpha(overlay_for_step(image, session, ctx.maps, with_masks), view.alpha, key="step_alpha",
                   location=view.location if hard else None, scale=scale,
                   location_label="sampled location" if ctx.decode.hard_mode == "sample" else "argmax α")
        c = image.crop_info
        st.caption(crop_note(c.box, c.original_size, c.image_size))
    with right:
        st.markdown(f"**p(word {view.index + 1} | image, words 1–{view.index}): the {len(view.top_words)} most "
                    f"probable** — the distribution “{view.word}” was taken from" if view.index else
                    f"**p(word 1 | image): the {len(view.top_words)} most probable** — the distribution "
                    f"“{view.word}” was taken from")
        draw_topk(view.top_words, view.top_probs, view.word, key="step_topk")
        draw_beam_choice(view)
        if hard:  # hard attention has no gate: the context is the chosen region's vector itself
            m2, m3 = st.columns(2)
        else:
            m1, m2, m3 = st.columns(3)
            m1.metric("β_t (gate)", f"{view.beta:.3f}")
        m2.metric(f"p({view.word})", f"{np.exp(view.logprob):.3f}", help=f"log p = {view.logprob:.3f}")
        m3.metric("max α_t", f"{summary.max:.3f}", help=f"at row {summary.argmax[0]}, col {summary.argmax[1]}")
        st.caption(f"α is spread over about {summary.effective_regions:.1f} of {view.alpha.size} cells "
                   f"(exp of its entropy {summary.entropy:.2f} nats).")
        draw_force(view, following)
    with st.expander("α values of this step (grid rows × columns)"):
        st.dataframe(pd.DataFrame(np.round(view.alpha, 4)), width="stretch")


def draw_coverage(image: PreparedImage, session: DecodeSession, settings: MapSettings) -> None:
    alphas = session.alphas  # (T, L)
    overlay, cover = maps.coverage_overlay(image.crop, alphas, session.grid, settings)
    st.markdown(f"**Coverage Σ_t α_t over the first {len(alphas)} steps** (max {cover.max():.2f})")
    scale = maps.coverage_scale(image.crop.shape[0], cover, session.grid, settings)
    draw_alpha(overlay, cover, key="step_coverage", value_name="Σα", height=300, scale=scale)


def draw_error_origin(image: PreparedImage) -> None:
    """Opened from an error analysis row: the labels that brought the user here and the word the view stops at."""
    origin = st.session_state.get(stepping.FROM_ERRORS)
    if not origin or image.record is None or image.record.id != origin["image_id"]:
        st.session_state.pop(stepping.FROM_ERRORS, None)  # another image: the row no longer applies
        return
    labels = ", ".join(f"**{label}**" for label in origin["labels"]) or "none"
    filtered = [label for label in origin["filter"] if label in origin["labels"]]
    parts = [f"**From error analysis** — error labels of this caption: {labels}"
             + (f" (the table was filtered on {', '.join(filtered)})" if filtered else "") + "."]
    if origin["hallucinated"]:
        parts.append(f"Words no reference uses: {', '.join(dict.fromkeys(origin['hallucinated']))}.")
    if origin["missed"]:
        parts.append(f"Words most references use and the caption does not: {', '.join(origin['missed'])}.")
    if origin["first_error"] is not None:
        parts.append(f"Stopped at its first wrong word, {origin['word'].split(': ', 1)[-1]!r} (word "
                     f"{origin['first_error'] + 1}); **Next** goes on from there.")
    else:
        parts.append("No single word is wrong (the labels are about the caption as a whole): showing all of it.")
    st.warning(" ".join(parts), icon=":material/bug_report:")


def draw_view(ctx: Context, image: PreparedImage, loaded, timer: float | None) -> None:
    """Everything a step changes; a fragment, so a click or a Play tick reruns only this part. Its own reruns (not
    those of the whole page) go to the run log with the presses they handled."""
    started = time.perf_counter()
    fragment_run = not st.session_state.get("_page_run")
    try:
        _draw_view(ctx, image, loaded, timer)
    finally:  # in a page run, the page's line counts the presses (app.log_run)
        if fragment_run:
            presses = stepping.take_presses()
            runlog.record("fragment", "Step through", time.perf_counter() - started, presses=presses,
                          tick=timer is not None and not presses)


def _draw_view(ctx: Context, image: PreparedImage, loaded, timer: float | None) -> None:
    stepping.apply_presses(stepper.pressed("step_keys", "step_next", "step_back"))  # queued ← → and clicks
    if bool(st.session_state.get(stepping.PLAYING)) != (timer is not None):
        st.rerun()  # Play or Pause was clicked: the whole page again, to start or stop the fragment's timer
    if timer is not None:
        stepping.advance_play(timer)
    session, error = stepping.current_session(ctx)
    write_url()  # the step may have moved: the link says where the view is
    note = stepping.pop_notice()
    if note:
        st.info(note, icon="↩️")
    if error:
        st.error(error)
    draw_controls(session)
    forced = {s.index for s in session.steps if s.forced}
    words = [s.word for s in session.steps]
    draw_caption(words, len(words) - 1, forced, prefix=f"**Step {len(words)}:** ")
    if session.done:
        ended = session.steps[-1].token == loaded.vocab.end_id
        st.success(f"Caption complete after {len(words)} steps: log p = {session.logprob:.2f}" if ended else
                   f"Caption cut at the length cap of {ctx.decode.max_len} words (log p = {session.logprob:.2f}); "
                   "raise *Max length* in the sidebar to let it finish.")
        if (unsure := unsure_note(loaded, session.logprob)) is not None:
            draw_unsure_note(*unsure)
    draw_step(ctx, image, session, loaded.model.hard, stepping.following(ctx))
    if ctx.maps.coverage:
        draw_coverage(image, session, ctx.maps)
    st.download_button("Download α values so far (JSON)",
                       viz.alphas_json(words, session.alphas, None if loaded.model.hard else session.betas,
                                       session.grid),
                       "steps_alphas.json", "application/json", key="step_json")
    if stepping.stop_at_end(session):
        st.rerun()  # the end: stop the timer


def main() -> None:
    st.title("Step through")
    ctx = context()
    loaded = need_model(ctx)
    image = need_image(ctx)
    if ctx.decode.beam_size > 1:
        st.toggle(f"Follow the Caption page's caption (beam size {ctx.decode.beam_size})", key=stepping.FOLLOW,
                  help="On: **Next** takes the next word of the caption beam search chose — the one the Caption page "
                       "shows and error analysis scored — even where it is not the most probable word of its step. "
                       "Off: **Next** takes the most probable word (greedy decoding, beam size 1), so the caption "
                       "built here can differ from the Caption page's.")
        if stepping.following(ctx):
            st.caption(f"The caption followed: {decoding_line(ctx)[0].lower()}{decoding_line(ctx)[1:]}")
        else:
            st.caption(f"**Next** takes the most probable word (greedy decoding, beam size 1); the Caption page "
                       f"searches with beam size {ctx.decode.beam_size}, so its caption can differ from the one built "
                       "here.")
    st.page_link("views/present.py", label="Presenter view: these steps in large type for a projector, ← / → to step",
                 icon=":material/slideshow:")
    draw_error_origin(image)
    playing = bool(st.session_state.get(stepping.PLAYING))
    every = SPEEDS.get(st.session_state.get("play_speed"), 1.0) if playing else None
    st.fragment(run_every=every)(draw_view)(ctx, image, loaded, every)
    draw_references(image.references)
    draw_help("What happens in one step", (
        "At step t the decoder scores every region with f_att(a_i, h_{t−1}); a softmax turns the scores into α_t. "
        "The context ẑ_t = β_t Σ_i α_ti a_i feeds the LSTM, whose new state gives the next-word distribution "
        "(the bar chart). **Next** (→) takes the next word of the Caption page's caption (with *Follow* on; beam "
        "search may pick a word that is not this step's most probable, and the page says so) or else the most "
        "probable word, **Back** (←) undoes one, **Play** adds one word per tick; **Force word** replaces the "
        "current word and decoding continues from it (forced words are underlined and starred). The encoder ran "
        "once: every step is one decoder step. See *How it works* for the equations with this step's numbers."))


main()
