"""Presenter view: the step-through for a projector — large type, no sidebar, ← / → to step.

It shows the same decoding as Step through (the same step, the same forced words), so a lecturer can prepare a
step there and present it here.
"""

from __future__ import annotations

import html

import numpy as np
import streamlit as st

from explorer import maps, stepping
from explorer.components import stepper
from explorer.guards import need_image, need_model
from explorer.state import context, write_url

STYLE = """
<style>
  [data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"], [data-testid="stExpandSidebarButton"],
  [data-testid="stHeader"] { display: none; }
  [data-testid="stMainBlockContainer"] { max-width: 100%; padding: 1.5rem 3rem; }
  .sat-present-caption { font-size: 2.6rem; line-height: 1.35; margin: 0.2rem 0 1rem; }
  .sat-present-caption mark { background: #ffe066; padding: 0 0.2em; border-radius: 0.2em; }
  .sat-present-facts { font-size: 1.7rem; line-height: 1.6; }
  .sat-present-hint { font-size: 1.1rem; color: #666; }
</style>
"""


def caption_html(words: list[str]) -> str:
    """The running caption, its last word marked."""
    shown = [html.escape(w) for w in words]
    if shown:
        shown[-1] = f"<mark>{shown[-1]}</mark>"
    return f'<div class="sat-present-caption">{" ".join(shown)}</div>'


def facts_html(word: str, p: float, top_words: list[str], top_probs: list[float], step: int, hard: bool,
               beta: float) -> str:
    rows = [f"Step {step}: <b>{html.escape(word)}</b>, p = {p:.3f}", "<i>the most probable words here:</i>"]
    rows += [f"&nbsp;&nbsp;{html.escape(w)} {q:.3f}" for w, q in zip(top_words[:4], top_probs[:4])]
    if not hard:
        rows.append(f"β = {beta:.3f}")
    return '<div class="sat-present-facts">' + "<br>".join(rows) + "</div>"


def main() -> None:
    st.markdown(STYLE, unsafe_allow_html=True)
    ctx = context()
    loaded = need_model(ctx)
    image = need_image(ctx)
    stepping.apply_presses(stepper.pressed("present_keys", "present_next", "present_back"))
    session, error = stepping.current_session(ctx)
    if error:
        st.error(error)
    write_url()
    view = session.steps[-1]
    st.markdown(caption_html([s.word for s in session.steps]), unsafe_allow_html=True)
    left, right = st.columns([3, 2])
    with left:
        overlay = maps.overlays(image.crop, session.alphas, session.grid, ctx.maps)[-1]
        st.image(overlay, width="stretch")
    with right:
        st.markdown(facts_html(view.word, float(np.exp(view.logprob)), view.top_words, view.top_probs,
                               view.index + 1, bool(loaded.model.hard), view.beta), unsafe_allow_html=True)
        c1, c2 = st.columns(2)
        c1.button("◀ Back", key="present_back", on_click=stepping.back, disabled=len(session.steps) <= 1,
                  width="stretch")
        c2.button("Next ▶", key="present_next", on_click=stepping.next_step, disabled=session.done,
                  type="primary", width="stretch")
        st.markdown('<div class="sat-present-hint">← / → step · the numbers are those of Step through</div>',
                    unsafe_allow_html=True)
        st.page_link("views/step.py", label="Leave the presenter view", icon=":material/close_fullscreen:")


main()
