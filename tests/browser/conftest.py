"""The app served on 127.0.0.1 with tiny random-weight checkpoints, and a real Chromium to drive it.

Skipped, with the reason, only when there is no Chromium or the ``playwright`` package is missing.
Screenshots and the server's log go to ``test-artifacts/browser/``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sat_core.checkpoint import LoadedCheckpoint, load_checkpoint, save_checkpoint
from sat_core.config import PreprocessConfig
from sat_core.data.vocab import Vocab
from sat_core.worlds.writer import generate

from explorer.dev.browser import VIEWPORT, AppServer, find_chromium, launch_chromium, wait_for_text
from explorer.settings import REPO_ROOT
from tests.explorer.conftest import N_TEST, N_TRAIN, _tiny

ARTIFACTS = REPO_ROOT / "test-artifacts" / "browser"
TIMEOUT_S = 120.0  # one page or click; generous because the CPU may be shared
RUN_LOG = ARTIFACTS / "runs.jsonl"  # the app's run log (explorer.runlog) for the whole browser session
FIRST_PAGE_S = 300.0  # the first page of a fresh server also imports torch and loads the model and gallery


@dataclass
class BrowserEnv:
    world: Path
    roots: Path  # holds tiny-soft/ and tiny-hard/
    dataset: dict

    def checkpoint(self, attention: str) -> LoadedCheckpoint:
        return load_checkpoint(self.roots / f"tiny-{attention}")

    def test_scene(self, k: int = 0) -> Path:
        entry = [e for e in self.dataset["images"] if e["split"] == "test"][k]
        return self.world / entry["filepath"] / entry["filename"]


def make_tiny_env(base: Path) -> BrowserEnv:
    """A small world and the explorer tests' tiny soft and hard checkpoints (random weights)."""
    world = base / "world"
    generate(world, N_TRAIN, 0, N_TEST, seed=3, workers=1)
    dataset = json.loads((world / "dataset.json").read_text())
    vocab = Vocab.build([s["tokens"] for e in dataset["images"] for s in e["sentences"]])
    roots = base / "ckpts"
    for attention in ("soft", "hard"):
        model, config = _tiny(vocab, attention)
        save_checkpoint(roots / f"tiny-{attention}", model, model_config=config, vocab=vocab,
                        preprocess=PreprocessConfig(), model_card=f"# Tiny {attention} model\n\nRandom weights.\n")
    return BrowserEnv(world, roots, dataset)


@pytest.fixture(scope="session")
def chromium() -> str:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the Python package 'playwright' is not installed (pip install playwright)")
    path = find_chromium()
    if path is None:
        pytest.skip("no Chromium: /usr/bin/chromium is missing and `chromium` is not on the PATH "
                    "(apt-get install -y chromium)")
    return path


@pytest.fixture(scope="session")
def browser_env(tmp_path_factory, chromium) -> BrowserEnv:
    return make_tiny_env(tmp_path_factory.mktemp("browser"))


@pytest.fixture(scope="session")
def app_url(browser_env) -> Iterator[str]:
    """The app, found its checkpoints and gallery through the environment, for the whole session."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    env = {"SAT_CHECKPOINT_DIRS": str(browser_env.roots), "SAT_WORLD_DIR": str(browser_env.world),
           "SAT_RUN_LOG": str(RUN_LOG)}
    RUN_LOG.unlink(missing_ok=True)
    with AppServer(env=env, log=ARTIFACTS / "server.log") as server:
        yield server.url


@pytest.fixture(scope="session")
def browser(chromium) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch_chromium(p, chromium)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, app_url, request) -> Iterator[Any]:
    """A new browser session on the Caption page (tiny soft model); its last view is saved as a PNG."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_S * 1000)
    page.goto(f"{app_url}/?ckpt=tiny-soft")
    wait_for_text(page, "log p(caption)", FIRST_PAGE_S, "the first caption")
    yield page
    page.screenshot(path=str(ARTIFACTS / f"{request.node.name}-last.png"))
    context.close()
