"""Back / Next presses that are queued, never dropped: a tiny component that counts the clicks on the page's
step buttons and the ← / → keys in order (``stepper/index.html``) and gives the list as its value.

Streamlit merges the clicks of one button that arrive while a run is busy into one; a list that only grows
cannot lose any. Without a browser (AppTest) the component reports nothing and the buttons' own callbacks step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import streamlit as st
import streamlit.components.v1 as components

_component = components.declare_component("sat_stepper", path=str(Path(__file__).with_name("stepper")))


def pressed(key: str, next_key: str, back_key: str) -> list[int]:
    """The presses (+1 Next, −1 Back) made since the last call, in order; draws the (invisible) counter."""
    value: Any = _component(next=next_key, back=back_key, key=key, default=None)
    if not isinstance(value, dict) or not isinstance(value.get("moves"), list):
        return []
    seen = st.session_state.get(f"_{key}_seen", {"sid": None, "n": 0})
    if seen["sid"] != value.get("sid"):  # a new page load: its list starts empty
        seen = {"sid": value.get("sid"), "n": 0}
    moves = [int(m) for m in value["moves"][seen["n"]:] if m in (1, -1)]
    st.session_state[f"_{key}_seen"] = {"sid": seen["sid"], "n": len(value["moves"])}
    return moves

