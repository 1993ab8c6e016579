"""SAT Explorer: caption images, step through decoding, compare soft and hard attention, find errors.

    streamlit run explorer/app.py [-- --checkpoints DIR … --data DATASET.json --images DIR]

This file is the router and the shared sidebar only; each page is a file in ``views/``. The
introduction is drawn before anything slow is imported, so a newcomer reads it while PyTorch and the
model load.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import streamlit as st

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:  # `streamlit run explorer/app.py` puts only explorer/ on the path
    sys.path.insert(0, str(_REPO))

PAGES = [
    ("views/caption.py", "Caption", "caption", ":material/image:"),
    ("views/step.py", "Step through", "step", ":material/skip_next:"),
    ("views/present.py", "Presenter view", "present", ":material/slideshow:"),
    ("views/compare.py", "Soft vs hard", "compare", ":material/compare:"),
    ("views/score.py", "Score a caption", "score", ":material/edit_note:"),
    ("views/elsewhere.py", "Look elsewhere", "elsewhere", ":material/visibility_off:"),
    ("views/errors.py", "Error analysis", "errors", ":material/bug_report:"),
    ("views/teach.py", "How it works", "teach", ":material/school:"),
    ("views/card.py", "Checkpoint card", "card", ":material/description:"),
]
INTRO = (
    "*Show, Attend and Tell* (Xu et al., 2015) captions an image word by word. A CNN turns the image into a "
    "grid of annotation vectors; before each word an LSTM decides **where to look** — the attention weights "
    "α over the grid (*soft* attention blends the regions, *hard* attention picks one) — and then **which word "
    "to say**. This explorer shows those decisions.\n\n"
    "**Caption**: the caption and where each word looked · **Step through**: one word at a time, force your "
    "own · **Presenter view**: the same steps for a projector, large type, ← / → · **Soft vs hard**: both "
    "models on the same words · **Score a caption**: how likely the model finds "
    "yours · **Look elsewhere**: keep attention out of a region and see what changes · **Error analysis**: "
    "every image of a dataset, by error · **How it works**: the equations with this image's numbers · "
    "**Checkpoint card**: what the model is and what it was trained on. Choose a checkpoint and an image "
    "(or upload one) in the sidebar."
)


def draw_intro() -> None:
    st.markdown("# SAT Explorer: where does the model look?")
    with st.expander("What this is, and what each page shows", expanded=not st.session_state.get("_intro_seen")):
        st.markdown(INTRO)
    st.session_state["_intro_seen"] = True


def log_run(page: str, started: float) -> None:
    """One line of the run log (``explorer.runlog``, SAT_RUN_LOG) per script run."""
    from explorer import runlog, stepping

    runlog.record("page", page, time.perf_counter() - started, presses=stepping.take_presses())


def main() -> None:
    started = time.perf_counter()
    st.set_page_config(page_title="SAT Explorer", page_icon=":material/visibility:", layout="wide")
    here = Path(__file__).parent
    pages = [st.Page(here / path, title=title, url_path=url, icon=icon) for path, title, url, icon in PAGES]
    # "/" is a hidden page that opens the first one, so every page — the first too — has its own url (/caption).
    home = st.Page(lambda: None, title=PAGES[0][1], url_path="home", default=True, visibility="hidden")
    page = st.navigation([home, *pages])
    if page is home:
        st.switch_page(pages[0], query_params=st.query_params.to_dict())
    if page.title == PAGES[0][1]:
        draw_intro()  # before the slow imports below: readable within a second of the page opening
    with st.spinner("Loading PyTorch and the checkpoint (the first visit after the server starts takes a few seconds)…"):
        from explorer.settings import server_settings
        from explorer.sidebar import draw_sidebar
        from explorer.state import set_context
        from sat_core.allocator import keep_freed_memory

        keep_freed_memory()  # the server encodes images in batches: keep freed memory (once per process)
        set_context(draw_sidebar(server_settings()))
    st.session_state["_page_run"] = True  # fragments tell their own reruns from the page's (explorer.runlog)
    try:
        page.run()
    finally:  # st.stop and page switches end a run by raising
        st.session_state["_page_run"] = False
        log_run(page.title, started)


main()
