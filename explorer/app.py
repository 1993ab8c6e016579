"""SAT Explorer: caption images, step through decoding, compare soft and hard attention, find errors.

    streamlit run explorer/app.py [-- --checkpoints DIR … --world DIR]

This file is the router and the shared sidebar only; each page is a file in ``views/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:  # `streamlit run explorer/app.py` puts only explorer/ on the path
    sys.path.insert(0, str(_REPO))

import streamlit as st  # noqa: E402

from explorer.settings import server_settings  # noqa: E402
from explorer.sidebar import draw_sidebar  # noqa: E402
from explorer.state import set_context  # noqa: E402

PAGES = [
    ("views/caption.py", "Caption", "caption", ":material/image:"),
    ("views/step.py", "Step through", "step", ":material/skip_next:"),
    ("views/compare.py", "Soft vs hard", "compare", ":material/compare:"),
    ("views/score.py", "Score a caption", "score", ":material/edit_note:"),
    ("views/elsewhere.py", "Look elsewhere", "elsewhere", ":material/visibility_off:"),
    ("views/errors.py", "Error analysis", "errors", ":material/bug_report:"),
    ("views/teach.py", "How it works", "teach", ":material/school:"),
    ("views/card.py", "Checkpoint card", "card", ":material/description:"),
]


def main() -> None:
    st.set_page_config(page_title="SAT Explorer", page_icon=":material/visibility:", layout="wide")
    here = Path(__file__).parent
    pages = [st.Page(here / path, title=title, url_path=url, icon=icon, default=(k == 0))
             for k, (path, title, url, icon) in enumerate(PAGES)]
    page = st.navigation(pages)
    set_context(draw_sidebar(server_settings()))
    page.run()


main()
