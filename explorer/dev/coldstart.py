"""How soon a newcomer sees something: a cold server, one Chromium, the landing page.

    python -m explorer.dev.coldstart [--runs 3] [--world DIR] [--checkpoints DIR …]

Each run starts a fresh ``streamlit run explorer/app.py`` (nothing cached, the browser already open)
and reports, from the moment the server process starts: when it answers its health check, when the
introduction is readable, and when the first caption is on the page. Runs are separate processes, so
the operating system's file cache is warm after the first; the first run is the coldest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence

from explorer.dev.browser import VIEWPORT, AppServer, launch_chromium, require_browser

INTRO_TEXT = "where does the model look"
CAPTION_TEXT = "log p(caption)"  # the metric next to the caption: drawn once it is decoded


def one_run(playwright, args) -> dict[str, float]:
    browser = launch_chromium(playwright, args.chromium)
    page = browser.new_page(viewport=VIEWPORT)
    started = time.monotonic()
    with AppServer(checkpoints=args.checkpoints, world=args.world) as server:
        healthy = time.monotonic() - started
        page.goto(server.url)
        page.get_by_text(INTRO_TEXT).first.wait_for(timeout=120_000)
        intro = time.monotonic() - started
        page.get_by_text(CAPTION_TEXT, exact=True).first.wait_for(timeout=120_000)
        caption = time.monotonic() - started
    browser.close()
    return {"server_up_s": round(healthy, 2), "intro_s": round(intro, 2), "first_caption_s": round(caption, 2),
            "intro_after_open_s": round(intro - healthy, 2), "caption_after_open_s": round(caption - healthy, 2)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m explorer.dev.coldstart", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--world", default=None, help="dataset folder of the gallery (as `-- --world`)")
    parser.add_argument("--checkpoints", nargs="*", default=[])
    parser.add_argument("--chromium", default=None)
    parser.add_argument("--json", default=None, help="also write the runs as JSON here")
    args = parser.parse_args(argv)
    require_browser(args.chromium)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        runs = [one_run(p, args) for _ in range(args.runs)]
    for k, run in enumerate(runs, 1):
        print(f"run {k}: " + "  ".join(f"{key} {value}" for key, value in run.items()))
    for key in runs[0]:
        print(f"median {key}: {statistics.median(r[key] for r in runs):.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=2)


if __name__ == "__main__":
    main()
