"""The step-through decode of this browser session, shared by the step and teaching pages.

One ``DecodeSession`` per (checkpoint, image, settings) lives in session state; the step count and
the forced words (also in the URL) say where it should be, and ``DecodeSession.sync`` gets it there with
as few decoder steps as possible (one per click on Next). With *follow* on (the default) and a beam wider
than 1, each next word is that of the Caption page's caption — the beam's best, the caption error analysis
scored — until a forced word leaves it; otherwise it is the most probable word (greedy decoding).
"""

from __future__ import annotations

import dataclasses
import math
import time

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
        feats = res.annotations(ctx.ckpt_key, ctx.image.key, ctx.loaded, ctx.image.tensor)
        store.update(key=key, session=DecodeSession(ctx.loaded.model, ctx.loaded.vocab, feats, cfg, top_k=TOP_K))
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


PRESSES = "_presses"  # Back / Next presses not yet reported in the run log


def next_step() -> None:
    st.session_state[STEP] = int(st.session_state.get(STEP) or 1) + 1
    st.session_state[PRESSES] = st.session_state.get(PRESSES, 0) + 1


def back() -> None:
    st.session_state[STEP] = max(1, int(st.session_state.get(STEP) or 1) - 1)
    st.session_state[PRESSES] = st.session_state.get(PRESSES, 0) + 1


def apply_presses(moves: list[int]) -> None:
    """Queued presses from the browser (``components.stepper``), in order: +1 Next, −1 Back."""
    for move in moves:
        next_step() if move > 0 else back()


def take_presses() -> int:
    """How many presses this run handled (for the run log); counts them as reported."""
    return int(st.session_state.pop(PRESSES, 0))


PLAY_FROM = "_play_from"  # (clock when Play started, the step it started at, seconds a word)


def play(interval: float = 1.0) -> None:
    """Start (or stop) stepping one word every ``interval`` seconds of the clock."""
    playing = not st.session_state.get(PLAYING, False)
    st.session_state[PLAYING] = playing
    if playing:
        st.session_state[PLAY_FROM] = (time.monotonic(), int(st.session_state.get(STEP) or 1), interval)


def play_target(started: float, first: int, interval: float, now: float) -> int:
    """The step Play should show at ``now``: one word per ``interval`` from ``first``, by the clock, so a late tick
    catches up instead of slowing the pace (and a tick up to a quarter of a word early still counts)."""
    return first + max(0, math.floor((now - started) / interval + 0.25))


def advance_play(interval: float) -> None:
    """At a tick of Play, before the session is synced: move to the step the clock asks for."""
    step = int(st.session_state.get(STEP) or 1)
    started, first, pace = st.session_state.get(PLAY_FROM) or (time.monotonic(), step, interval)
    if pace != interval:  # the speed changed while playing: keep the new pace from here
        started, first = time.monotonic(), step
        st.session_state[PLAY_FROM] = (started, first, interval)
    st.session_state[STEP] = max(step, play_target(started, first, interval, time.monotonic()))


def stop_at_end(session: DecodeSession) -> bool:
    """Stop Play once the caption is complete; True when it just stopped."""
    if st.session_state.get(PLAYING) and session.done:
        st.session_state[PLAYING] = False
        return True
    return False


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
