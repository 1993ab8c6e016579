"""Screenshots of every explorer page, taken in a real Chromium, for the README.

    python -m explorer.dev.screenshots --out docs/screenshots [--checkpoints DIR …] [--world DIR] [--image FILE]

Starts the app on 127.0.0.1 (a free port), opens it in Debian's ``/usr/bin/chromium`` through
Playwright (no browser download), walks through the pages in one browser session and saves one PNG
per page: caption, step (a few steps in), compare, score, elsewhere, errors, teach, card, present.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from explorer.settings import REPO_ROOT
from explorer.dev.browser import (
    AppError, AppServer, CHROMIUM, VIEWPORT, check_local, choose_upload, click_key, go_to, launch_chromium,
    require_browser, shoot, upload, wait_for_text, wait_idle,
)


# ---- the tour -------------------------------------------------------------------------------------

# (file stem, sidebar title, text that shows once the page has fully run)
PAGES = [
    ("caption", "Caption", "Where the model looked for each word"),
    ("step", "Step through", "What happens in one step"),
    ("teach", "How it works", "4 · Training signal"),
    ("compare", "Soft vs hard", "Word by word"),
    ("score", "Score a caption", "Teacher forcing"),
    ("elsewhere", "Look elsewhere", "Where it looked vs what it used"),
    ("errors", "Error analysis", "Attention correctness per word type"),
    ("card", "Checkpoint card", "Open a checkpoint folder"),
    ("present", "Presenter view", "the numbers are those of Step through"),  # last: it hides the sidebar
]
STEPS_IN = 3  # clicks on Next before the step-through screenshot


def tour(page: Any, url: str, out: Path, timeout_s: float, image: Path | None = None,
         scene: int | None = None) -> list[Path]:
    """Visit every page in one browser session and save ``out/<page>.png``; return the files."""
    page.goto(url + (f"/?scene={scene}" if scene is not None else "/"), timeout=timeout_s * 1000)
    saved = []
    for stem, title, needle in PAGES:
        started = time.monotonic()
        if stem == "caption":
            wait_for_text(page, "Caption:", timeout_s, "the first caption")
            if image is not None:
                choose_upload(page, timeout_s)
                upload(page, image.name, image.read_bytes(), mime="application/octet-stream")
                wait_for_text(page, "Caption:", timeout_s, f"the caption of {image.name}")
            wait_for_text(page, needle, timeout_s, "page 'Caption'")
            wait_idle(page, timeout_s, "page 'Caption'")
        else:
            go_to(page, title, needle, timeout_s)
        if stem == "step":
            for n in range(STEPS_IN):
                if page.locator(".st-key-step_next button").first.is_disabled():
                    break  # the caption ended already
                click_key(page, "step_next", timeout_s)
                wait_for_text(page, f"Step {n + 2}:", timeout_s, f"step {n + 2}")
        saved.append(shoot(page, out / f"{stem}.png"))
        print(f"{saved[-1]}  ({time.monotonic() - started:.1f} s)", flush=True)
        if stem == "caption" and image is not None:  # the other pages show a gallery scene (masks, references)
            page.get_by_test_id("stSidebar").get_by_text("Gallery scene", exact=True).click()
            wait_idle(page, timeout_s, "back to the gallery")
    return saved


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m explorer.dev.screenshots", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "screenshots", help="folder for the PNGs")
    parser.add_argument("--checkpoints", nargs="*", default=[], help="checkpoint folders for the app (as `-- --checkpoints`)")
    parser.add_argument("--world", default=None, help="dataset folder of the gallery (as `-- --world`)")
    parser.add_argument("--image", type=Path, default=None, help="upload this image for the Caption page")
    parser.add_argument("--scene", type=int, default=None, help="gallery scene id to show")
    parser.add_argument("--url", default=None, help="use an app already running on this machine instead")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds each page may take (default 300)")
    parser.add_argument("--chromium", default=None, help=f"Chromium executable (default {CHROMIUM})")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    require_browser(args.chromium)
    from playwright.sync_api import sync_playwright

    if args.image is not None and not args.image.is_file():
        raise SystemExit(f"No image file {args.image}.")
    server = None
    if args.url is None:
        log = args.out / "server.log"
        args.out.mkdir(parents=True, exist_ok=True)
        server = AppServer(checkpoints=args.checkpoints, world=args.world, log=log)
        print(f"starting the app on {server.url} (log: {log})", flush=True)
        server.start()
    url = check_local(args.url) if args.url else server.url
    try:
        with sync_playwright() as p:
            browser = launch_chromium(p, args.chromium)
            page = browser.new_page(viewport=VIEWPORT)
            try:
                saved = tour(page, url, args.out, args.timeout, args.image, args.scene)
            except (TimeoutError, AppError) as err:
                page.screenshot(path=str(args.out / "failed.png"))
                raise SystemExit(f"{err}\nWhat the browser showed: {args.out / 'failed.png'}; "
                                 f"the server's log: {args.out / 'server.log'}") from None
            finally:
                browser.close()
    finally:
        if server is not None:
            server.stop()
    if server is not None and server.log is not None:
        server.log.unlink(missing_ok=True)  # kept only when something went wrong
    print(f"{len(saved)} screenshots in {args.out}")


if __name__ == "__main__":
    main()
