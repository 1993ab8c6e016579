"""The run log: with SAT_RUN_LOG=FILE (the load test sets it), one JSON line per thing the server did for a
browser — a page run, a fragment rerun (a step click, a Play tick), a refused upload — with its seconds on the
server. What a class costs the server, apart from the browsers that drive it."""

from __future__ import annotations

import json
import os
from typing import Any

import streamlit as st


def record(kind: str, page: str, seconds: float | None = None, **fields: Any) -> None:
    """Append one line: ``kind`` ("page", "fragment", "refused upload"), the page, the image source, the seconds."""
    path = os.environ.get("SAT_RUN_LOG")
    if not path:
        return
    line = {"kind": kind, "page": page, "source": st.session_state.get("source"),
            **({"seconds": seconds} if seconds is not None else {}), **fields}
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
