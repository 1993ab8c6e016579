"""The step-through decode of this browser session, shared by the step and teaching pages.

One ``DecodeSession`` per (checkpoint, image, settings) lives in session state; the step count and
the forced words (also in the URL) say where it should be, and ``DecodeSession.sync`` gets it there with
as few decoder steps as possible (one per click on Next). With *follow* on (the default) and a beam wider
than 1, each next word is that of the Caption page's caption — the beam's best, the caption error analysis
scored — until a forced word leaves it; otherwise it is the most probable word (greedy decoding).
"""

from __future__ import annotations

import dataclasses
import streamlit as st

from sat_core.decoding import DecodeSession
from sat_core.errors import SatError

from explorer import resources as res
from explorer.guards import beams
from explorer.state import FORCED, STEP, Context

TOP_K = 5
PLAYING, NOTICE = "_playing", "_step_notice"
PLAY_TO_END = 99  # a step past any length cap: "the whole caption" (links from error analysis)
FOLLOW = "follow"  # widget key (and URL parameter): replay the Caption page's caption
FROM_ERRORS = "_from_errors"  # the error analysis row that opened this view: its labels and first wrong word


def following(ctx: Context) -> bool:
    """Whether the step-through replays the beam's caption (a beam wider than 1 and *follow* on)."""
    return ctx.decode.beam_size > 1 and bool(st.session_state.get(FOLLOW, True))


def followed_tokens(ctx: Context) -> list[int]:
    """The Caption page's caption as token ids (with <end> when it finished); none when not following."""
    return list(beams(ctx)[0].tokens) if following(ctx) else []


def _key(ctx: Context) -> tuple:
    d = ctx.decode
    return (ctx.ckpt_key, ctx.image.key, d.max_len, d.hard_mode, d.seed)


def current_session(ctx: Context) -> tuple[DecodeSession, str | None]:
    """The session at the wanted step, and an error message if a forced word had to be dropped."""
    store = st.session_state.setdefault("_decode_session", {})
    key = _key(ctx)
    if store.get("key") != key:
        if store.get("key") is not None and not st.session_state.pop("_step_keep", False):
            old = store["key"]
            what = ("checkpoint" if old[0] != key[0] else "image" if old[1] != key[1] else "decoding settings")
            if int(st.session_state.get(STEP) or 1) > 1 or st.session_state.get(FORCED):
                notice(f"Back to step 1: the {what} changed, so the old steps no longer apply.")
            reset()  # another image or model: start again at the first word
        cfg = dataclasses.replace(ctx.decode, beam_size=1, precision=res.NUMBERS_PRECISION)  # the pages' numbers
        store.update(key=key, session=DecodeSession(ctx.loaded.model, ctx.loaded.vocab, ctx.image.tensor, cfg,
                                                    top_k=TOP_K))
    session: DecodeSession = store["session"]
    error = None
    n = max(1, int(st.session_state.get(STEP) or 1))
    forced = dict(st.session_state.get(FORCED) or {})
    follow = followed_tokens(ctx)
    try:
        session.sync(n, forced, follow)
    except SatError as err:
        error = f"{err} The forced words were dropped."
        st.session_state[FORCED] = {}
        session.sync(n, {}, follow)
    if len(session.steps) < n and n != PLAY_TO_END:
        notice(f"The caption ends after {len(session.steps)} words, so step {n} does not exist: showing step "
               f"{len(session.steps)}.")
    st.session_state[STEP] = len(session.steps)
    return session, error


def next_step() -> None:
    st.session_state[STEP] = int(st.session_state.get(STEP) or 1) + 1


def back() -> None:
    st.session_state[STEP] = max(1, int(st.session_state.get(STEP) or 1) - 1)


def play() -> None:
    """Start (or stop) stepping one word per tick of the step view's timer."""
    st.session_state[PLAYING] = not st.session_state.get(PLAYING, False)


def tick(session: DecodeSession) -> bool:
    """One animation tick: the next word, or stop at the end. True while still playing."""
    if not st.session_state.get(PLAYING):
        return False
    if session.done:
        st.session_state[PLAYING] = False
        return False
    next_step()
    return True


def notice(text: str) -> None:
    """A message for the next draw of the step view (why the view moved)."""
    st.session_state[NOTICE] = text


def pop_notice() -> str | None:
    return st.session_state.pop(NOTICE, None)


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
