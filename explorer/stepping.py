"""The step-through decode of this browser session, shared by the step and teaching pages.

One ``DecodeSession`` per (checkpoint, image, settings) lives in session state; the step count and
the forced words (also in the URL) say where it should be, and ``DecodeSession.sync`` gets it there with
as few decoder steps as possible (one per click on Next).
"""

from __future__ import annotations

import dataclasses
import streamlit as st

from sat_core.decoding import DecodeSession
from sat_core.errors import SatError

from explorer.state import FORCED, STEP, Context

TOP_K = 5


def _key(ctx: Context) -> tuple:
    d = ctx.decode
    return (ctx.ckpt_key, ctx.image.key, d.max_len, d.hard_mode, d.seed)


def current_session(ctx: Context) -> tuple[DecodeSession, str | None]:
    """The session at the wanted step, and an error message if a forced word had to be dropped."""
    store = st.session_state.setdefault("_decode_session", {})
    key = _key(ctx)
    if store.get("key") != key:
        if store.get("key") is not None and not st.session_state.pop("_step_keep", False):
            reset()  # another image or model: start again at the first word
        cfg = dataclasses.replace(ctx.decode, beam_size=1)
        store.update(key=key, session=DecodeSession(ctx.loaded.model, ctx.loaded.vocab, ctx.image.tensor, cfg,
                                                    top_k=TOP_K))
    session: DecodeSession = store["session"]
    error = None
    n = max(1, int(st.session_state.get(STEP) or 1))
    forced = dict(st.session_state.get(FORCED) or {})
    try:
        session.sync(n, forced)
    except SatError as err:
        error = f"{err} The forced words were dropped."
        st.session_state[FORCED] = {}
        session.sync(n, {})
    st.session_state[STEP] = len(session.steps)
    return session, error


def next_step() -> None:
    st.session_state[STEP] = int(st.session_state.get(STEP) or 1) + 1


def back() -> None:
    st.session_state[STEP] = max(1, int(st.session_state.get(STEP) or 1) - 1)


def play(max_len: int) -> None:
    st.session_state[STEP] = max_len  # the session stops at <end> before that


def reset() -> None:
    st.session_state[STEP] = 1
    st.session_state[FORCED] = {}


def force(word: str) -> None:
    """Replace the current step's word; later forced words no longer apply."""
    n = int(st.session_state.get(STEP) or 1)
    forced = {i: w for i, w in (st.session_state.get(FORCED) or {}).items() if i < n - 1}
    forced[n - 1] = word
    st.session_state[FORCED] = forced


def keep_on_next_change() -> None:
    """The next change of image or model keeps the step and forced words (links, error analysis)."""
    st.session_state["_step_keep"] = True
