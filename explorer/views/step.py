"""Step through: one word at a time, with α, the next-word distribution and β of every step."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from sat_core import viz
from sat_core.decoding import DecodeSession, StepView
from sat_core.alpha import alpha_summary
from sat_core.regions import mask_in_crop

from explorer import maps, stepping
from explorer.components.figures import draw_alpha, draw_topk
from explorer.components.text import crop_note, draw_caption, draw_help
from explorer.guards import need_image, need_model, object_masks
from explorer.maps import MapSettings
from explorer.resources import PreparedImage
from explorer.state import Context, context, write_url


def draw_controls(session: DecodeSession, max_len: int) -> None:
    c1, c2, c3, c4 = st.columns(4)
    c1.button("◀ Back", key="step_back", on_click=stepping.back, disabled=len(session.steps) <= 1, width="stretch")
    c2.button("Next ▶", key="step_next", on_click=stepping.next_step, disabled=session.done, width="stretch",
              type="primary")
    c3.button("Play ▶▶", key="step_play", on_click=stepping.play, args=(max_len,), disabled=session.done,
              width="stretch", help="Run to the end of the caption")
    c4.button("Reset", key="step_reset", on_click=stepping.reset, width="stretch")


def draw_force(view: StepView) -> None:
    """Pick another word of the top-k for the current step; decoding continues from it."""
    others = [w for w in view.top_words if w != view.word] or view.top_words
    c1, c2 = st.columns([3, 1])
    c1.selectbox(f"Force a different word at step {view.index + 1}", others, key="force_choice")
    # The callback reads the choice when clicked (args bound now would hold the previous run's value).
    c2.button("Force word", key="force_button", on_click=lambda: stepping.force(st.session_state["force_choice"]),
              width="stretch")


def overlay_for_step(image: PreparedImage, session: DecodeSession, settings: MapSettings,
                     with_masks: bool) -> np.ndarray:
    alphas = session.alphas  # (T, L)
    overlay = maps.overlays(image.crop, alphas, session.grid, settings)[-1]
    masks = object_masks(image) if with_masks else []
    if masks:
        overlay = viz.outline_masks(overlay, [mask_in_crop(m, image.crop_info) for m in masks], (255, 255, 255))
    return overlay


def draw_step(ctx: Context, image: PreparedImage, session: DecodeSession, hard: bool) -> None:
    view = session.steps[-1]
    summary = alpha_summary(view.alpha)
    with_masks = bool(object_masks(image)) and st.checkbox("Outline ground-truth objects", key="masks")
    left, right = st.columns([3, 2])
    with left:
        st.markdown(f"**α at step {view.index + 1}** (word “{view.word}”) — hover a cell for its exact value")
        draw_alpha(overlay_for_step(image, session, ctx.maps, with_masks), view.alpha, key="step_alpha",
                   location=view.location if hard else None,
                   location_label="sampled location" if ctx.decode.hard_mode == "sample" else "argmax α")
        c = image.crop_info
        st.caption(crop_note(c.box, c.original_size, c.image_size))
    with right:
        st.markdown(f"**Top {len(view.top_words)} next words at step {view.index + 1}**")
        draw_topk(view.top_words, view.top_probs, view.word, key="step_topk")
        m1, m2, m3 = st.columns(3)
        m1.metric("β_t (gate)", f"{view.beta:.3f}")
        m2.metric(f"p({view.word})", f"{np.exp(view.logprob):.3f}")
        m3.metric("max α_t", f"{summary.max:.3f}", help=f"at row {summary.argmax[0]}, col {summary.argmax[1]}")
        st.caption(f"α is spread over about {summary.effective_regions:.1f} of {view.alpha.size} cells "
                   f"(exp of its entropy {summary.entropy:.2f} nats).")
        draw_force(view)
    with st.expander("α values of this step (grid rows × columns)"):
        st.dataframe(pd.DataFrame(np.round(view.alpha, 4)), width="stretch")


def draw_coverage(image: PreparedImage, session: DecodeSession, settings: MapSettings) -> None:
    alphas = session.alphas  # (T, L)
    overlay, cover = maps.coverage_overlay(image.crop, alphas, session.grid, settings)
    st.markdown(f"**Coverage Σ_t α_t over the first {len(alphas)} steps** (max {cover.max():.2f})")
    draw_alpha(overlay, cover, key="step_coverage", value_name="Σα", height=300)


def main() -> None:
    st.title("Step through")
    ctx = context()
    loaded = need_model(ctx)
    image = need_image(ctx)
    session, error = stepping.current_session(ctx)
    write_url()  # the step may have been clamped at the end of the caption
    if error:
        st.error(error)
    draw_controls(session, ctx.decode.max_len)
    forced = {s.index for s in session.steps if s.forced}
    words = [s.word for s in session.steps]
    draw_caption(words, len(words) - 1, forced, prefix=f"**Step {len(words)}:** ")
    if session.done:
        st.success(f"Caption complete after {len(words)} steps: log p = {session.logprob:.2f}")
    draw_step(ctx, image, session, loaded.model.hard)
    if ctx.maps.coverage:
        draw_coverage(image, session, ctx.maps)
    st.download_button("Download α values so far (JSON)",
                       viz.alphas_json(words, session.alphas, session.betas, session.grid),
                       "steps_alphas.json", "application/json", key="step_json")
    draw_help("What happens in one step", (
        "At step t the decoder scores every region with f_att(a_i, h_{t−1}); a softmax turns the scores into α_t. "
        "The context ẑ_t = β_t Σ_i α_ti a_i feeds the LSTM, whose new state gives the next-word distribution "
        "(the bar chart). **Next** takes its most probable word; **Force word** replaces the current word and "
        "decoding continues from it (forced words are underlined and starred). The encoder ran once: "
        "every step is one decoder step. See *How it works* for the equations with this step's numbers."))


main()
