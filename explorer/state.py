"""Session state shared by the pages, and its mirror in the URL (``st.query_params``).

A link reproduces a view: the checkpoint, the scene, decoding and α-display settings, the step and
the forced words are all query parameters. They are read once, when a session starts, and written
back after every change. Uploaded images cannot travel in a link; the URL then names no scene.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import streamlit as st

from sat_core.checkpoint import LoadedCheckpoint
from sat_core.config import DecodeConfig

from explorer.maps import MapSettings
from explorer.resources import Gallery, PreparedImage
from explorer.settings import ServerSettings

# Widget keys that are also URL parameters, with how to read them from text.
_BOOL = {"1": True, "true": True, "0": False, "false": False}
URL_WIDGETS: dict[str, Callable[[str], Any]] = {
    "ckpt": str, "cmp_soft": str, "cmp_hard": str, "source": str, "scene": int, "beam": int, "maxlen": int,
    "lnorm": float, "hard_mode": str,
    "seed": int, "method": str,
    "sigma": float, "norm": str, "opacity": float,
    "cmap": str, "coverage": lambda v: _BOOL[v.lower()], "masks": lambda v: _BOOL[v.lower()],
    "follow": lambda v: _BOOL[v.lower()],
    "cmp_source": str, "cmp_scale": str, "cmp_ref": int, "cmp_text": str, "cmp_step": int, "cmp_seed": int, "cmp_n": int,
    "score_ref": str, "score_text": str,
    "ew_how": str, "ew_mode": str, "ew_object": int, "ew_cells": str,
    "ew_rows": lambda v: tuple(int(x) for x in v.strip("()").split(",")),
    "ew_cols": lambda v: tuple(int(x) for x in v.strip("()").split(",")),
}
URL_WIDGETS.update({"closer_word": int, "err_labels": lambda v: [x for x in v.split(",") if x], "err_sort": str})
PAGE_DEFAULTS = {"closer_word": 0, "err_sort": "CIDEr ↑ (worst first)"}  # not applied up front: pages own them
_DECODE = DecodeConfig()
DECODE_WIDGETS = {"beam": "beam_size", "maxlen": "max_len", "lnorm": "length_norm", "hard_mode": "hard_mode",
                  "seed": "seed"}
DEFAULTS: dict[str, Any] = {
    "source": "Gallery scene", **{key: getattr(_DECODE, name) for key, name in DECODE_WIDGETS.items()},
    "method": "nearest", "sigma": 0.0, "norm": "word", "opacity": 0.6, "cmap": "viridis",
    "coverage": False, "masks": False, "follow": True,
    "cmp_source": "soft", "cmp_step": 1, "cmp_seed": 0, "cmp_n": 5, "cmp_scale": "shared", "ew_mode": "exclude",
}
STEP, FORCED = "step", "forced"  # plain state of the step-through view
# Widget defaults that come from the selected checkpoint (its evaluation's beam and length normalisation), with the
# checkpoint they came from: {"for": name, "beam": 5, "lnorm": 1.0}.
CHECKPOINT_DEFAULT = "_checkpoint_default"


def follow_checkpoint(name: str, defaults: Mapping[str, Any]) -> None:
    """Set widgets to the checkpoint's own defaults when the checkpoint changes (before they are drawn).

    A link's own values win on the session's first run; links leave out values equal to these defaults.
    """
    previous = st.session_state.get(CHECKPOINT_DEFAULT)
    if previous is not None and previous.get("for") == name:
        return
    st.session_state[CHECKPOINT_DEFAULT] = {"for": name, **defaults}
    for key, value in defaults.items():
        if previous is None and key in st.query_params:
            continue  # restored from the link
        st.session_state[key] = value


def parse_forced(text: str) -> dict[int, str]:
    """'2:red,4:big' -> {2: 'red', 4: 'big'}; malformed parts are dropped."""
    forced = {}
    for part in text.split(","):
        index, _, word = part.partition(":")
        if index.strip().isdigit() and word.strip():
            forced[int(index)] = word.strip()
    return forced


def format_forced(forced: Mapping[int, str]) -> str:
    return ",".join(f"{i}:{w}" for i, w in sorted(forced.items()))


def restore_from_url() -> None:
    """Once per session: copy valid query parameters into session state (before any widget exists)."""
    if st.session_state.get("_restored"):
        return
    st.session_state["_restored"] = True
    params = st.query_params
    for key, parse in URL_WIDGETS.items():
        if key in params:
            try:
                st.session_state[key] = parse(params[key])
            except (KeyError, ValueError):
                pass  # a hand-edited link with a bad value: keep the default
    if "step" in params and params["step"].isdigit():
        st.session_state[STEP] = int(params["step"])
    if "force" in params:
        st.session_state[FORCED] = parse_forced(params["force"])


def current_params() -> dict[str, str]:
    """The URL parameters that describe the current view (defaults left out)."""
    out: dict[str, str] = {}
    for key in URL_WIDGETS:
        value = st.session_state.get(key)
        default = st.session_state.get(CHECKPOINT_DEFAULT, {}).get(key, DEFAULTS.get(key, PAGE_DEFAULTS.get(key)))
        if value is None or value == default:
            continue
        if key == "scene" and st.session_state.get("source") == "Upload":
            continue
        if isinstance(value, (list, tuple)):
            if not value:
                continue
            out[key] = ",".join(map(str, value))
        else:
            out[key] = str(int(value)) if isinstance(value, bool) else str(value)
    if st.session_state.get(STEP):
        out["step"] = str(st.session_state[STEP])
    if st.session_state.get(FORCED):
        out["force"] = format_forced(st.session_state[FORCED])
    return out


def write_url() -> str:
    """Mirror the current view into the URL; return the query string."""
    params = current_params()
    if dict(st.query_params) != params:
        st.query_params.from_dict(params)
    return urlencode(params)


def set_pending(**values: Any) -> None:
    """Widget values to apply at the start of the next run (widgets already drawn cannot change)."""
    st.session_state.setdefault("_pending", {}).update(values)


def apply_pending() -> None:
    """Pending values, then defaults for widgets not set yet (widgets are drawn without defaults,
    so a value from the URL or from another page never conflicts with one)."""
    for key in URL_WIDGETS:  # owned by the session, not the widget: a page switch cannot clean them up
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]
    for key, value in st.session_state.pop("_pending", {}).items():
        st.session_state[key] = value
    for key, value in DEFAULTS.items():
        st.session_state.setdefault(key, value)


def keep_choice(key: str, options: list[Any]) -> None:
    """Drop a stored widget value that is no longer among the options (e.g. from an old link)."""
    if key in st.session_state and st.session_state[key] not in options:
        del st.session_state[key]


def clamp(key: str, low: float, high: float) -> None:
    if key in st.session_state:
        value = st.session_state[key]
        if isinstance(value, tuple):
            st.session_state[key] = tuple(min(max(v, low), high) for v in value)
        else:
            st.session_state[key] = type(value)(min(max(value, low), high))


@dataclass
class Context:
    """What the shared sidebar chose, for the pages to use."""

    settings: ServerSettings
    checkpoints: dict[str, str]  # display name -> folder
    ckpt_name: str | None
    loaded: LoadedCheckpoint | None
    ckpt_error: str | None
    gallery: Gallery | None
    gallery_error: str | None
    image: PreparedImage | None
    image_error: str | None
    image_source: tuple | None  # (name, bytes or path, gallery record): to prepare for another model
    decode: DecodeConfig
    maps: MapSettings
    query: str = ""
    data: Any = None  # the DataSource the gallery came from (the checkpoint's world unless one was named)

    @property
    def ckpt_key(self) -> str:
        from explorer.resources import stamp

        return stamp(self.loaded.path) if self.loaded is not None else ""

    @property
    def source(self):
        """The dataset every page reads (explorer.settings.DataSource)."""
        return self.data if self.data is not None else self.settings.source


def set_context(ctx: Context) -> None:
    st.session_state["_ctx"] = ctx


def context() -> Context:
    return st.session_state["_ctx"]
