"""The explorer in a real Chromium: upload, caption, step through, a bad file and recovery.

Every expected word is computed here with sat_core on the same image and settings, so a page that
shows a stale, wrong or empty caption fails.
"""

from __future__ import annotations

import json
import re

import pytest

from sat_core.config import DecodeConfig
from sat_core.decoding import DecodeSession, beam_search
from sat_core.data.images import load_image, preprocess

from explorer.dev.browser import (
    choose_option, choose_upload, click_key, go_to, shoot, upload, wait_for_text, wait_idle,
)
from tests.browser.conftest import ARTIFACTS, FIRST_PAGE_S, RUN_LOG, TIMEOUT_S, BrowserEnv
from tests.explorer.conftest import photo_jpeg

pytestmark = pytest.mark.browser
STEPS = 4  # steps shown in the step-through test (Next clicked STEPS - 1 times)


def expected_caption(env: BrowserEnv, data: bytes) -> str:
    """The caption the app must show: the tiny soft model's best beam at the sidebar's defaults."""
    loaded = env.checkpoint("soft")
    tensor, _ = preprocess(load_image(data), loaded.preprocess)
    best = beam_search(loaded.model, tensor.unsqueeze(0), loaded.vocab, DecodeConfig(beam_size=3, max_len=20))[0][0]
    return best.caption or "(empty)"


def expected_steps(env: BrowserEnv, data: bytes, n: int, max_len: int = 20) -> list[str]:
    """The first ``n`` greedy words, as the step-through view decodes them."""
    loaded = env.checkpoint("soft")
    tensor, _ = preprocess(load_image(data), loaded.preprocess)
    session = DecodeSession(loaded.model, loaded.vocab, tensor, DecodeConfig(beam_size=1, max_len=max_len,
                                                                             precision="fp32"), top_k=5)
    for _ in range(n):
        if not session.done:
            session.step()
    return [s.word for s in session.steps]


def shown_caption(page) -> str:
    lines = page.get_by_test_id("stMain").get_by_test_id("stMarkdownContainer").filter(
        has_text=re.compile(r"^Caption:")).all_inner_texts()
    assert len(lines) == 1, lines
    return lines[0].removeprefix("Caption:").split(" … (cut at the length cap")[0].strip()


def main_text(page) -> str:
    return page.get_by_test_id("stMain").inner_text()


def test_upload_caption_then_step_through(page, browser_env):
    data = browser_env.test_scene(0).read_bytes()
    choose_upload(page, TIMEOUT_S)
    assert "Choose a gallery scene or upload an image" in main_text(page)
    upload(page, "scene.png", data)
    wait_for_text(page, "Where the model looked for each word", TIMEOUT_S, "the caption of scene.png")
    caption = expected_caption(browser_env, data)
    assert caption != "(empty)" and len(caption.split()) >= STEPS  # the tiny model says something
    assert shown_caption(page) == caption
    assert page.get_by_test_id("stMain").get_by_test_id("stImage").count() >= 2  # the crop view and the α strip
    assert "beam size 3" in main_text(page)
    shoot(page, ARTIFACTS / "caption-upload.png")

    page.get_by_test_id("stMain").get_by_text("Look closer at one word").wait_for()
    choose_option(page, "closer_word", 1, TIMEOUT_S)  # the second word, enlarged beside the image
    wait_for_text(page, "(step 2)", TIMEOUT_S, "the enlarged α map of word 2")
    assert "What the encoder saw" in main_text(page)
    shoot(page, ARTIFACTS / "caption-enlarged.png")

    words = expected_steps(browser_env, data, STEPS)
    go_to(page, "Step through", "What happens in one step", TIMEOUT_S)
    for n in range(1, STEPS + 1):
        if n == 2:
            page.keyboard.press("ArrowRight")  # the → key is Next
            wait_for_text(page, "Step 2:", TIMEOUT_S, "step 2 after →")
        elif n > 2:
            click_key(page, "step_next", TIMEOUT_S)
            wait_for_text(page, f"Step {n}:", TIMEOUT_S, f"step {n}")
        text = main_text(page)
        assert f"α at step {n} (word “{words[n - 1]}”)" in text, text[:600]
        running = re.search(rf"Step {n}:\s*(.*)", text).group(1).split()
        assert running == words[:n]  # the running caption, current word last
        alpha = page.get_by_test_id("stPlotlyChart").first
        assert alpha.locator(".main-svg").first.is_visible()  # plotly drew the α figure
    assert page.get_by_test_id("stPlotlyChart").count() >= 2  # α and the top-k bars
    assert "sampled location" not in main_text(page)  # a soft model has no location
    shoot(page, ARTIFACTS / "step-through.png")
    page.keyboard.press("ArrowLeft")  # the ← key is Back
    wait_for_text(page, f"Step {STEPS - 1}:", TIMEOUT_S, "one step back after ←")

    full = expected_steps(browser_env, data, 40)
    choose_option(page, "play_speed", "fast (0.4 s)", TIMEOUT_S)
    click_key(page, "step_play", TIMEOUT_S)
    # it moves by itself, a word per tick, to the end (a tick is too short to catch a given middle step)
    wait_for_text(page, f"Step {len(full)}:", TIMEOUT_S + 0.4 * len(full), "Play reaching the end")
    wait_for_text(page, "▶ Play", TIMEOUT_S, "Play stopping at the end")
    running = re.search(rf"Step {len(full)}:\s*(.*)", main_text(page)).group(1).split()
    assert running == full
    shoot(page, ARTIFACTS / "step-played.png")


def test_bad_upload_shows_the_message_and_the_next_upload_works(page, browser_env):
    choose_upload(page, TIMEOUT_S)
    upload(page, "holiday.png", b"this is just text, not a picture\n")
    wait_for_text(page, "is not an image", TIMEOUT_S, "the message about holiday.png")
    errors = page.get_by_test_id("stAlertContentError").all_inner_texts()
    assert len(errors) == 1 and "'holiday.png' is not an image: its content is a text file" in errors[0], errors
    assert "Caption:" not in main_text(page)
    assert page.get_by_test_id("stException").count() == 0
    shoot(page, ARTIFACTS / "bad-upload.png")

    photo = photo_jpeg()
    upload(page, "astronaut.jpg", photo, mime="image/jpeg")
    wait_for_text(page, "Where the model looked for each word", TIMEOUT_S, "the caption of astronaut.jpg")
    assert shown_caption(page) == expected_caption(browser_env, photo)
    assert page.get_by_test_id("stAlertContentError").count() == 0
    assert "looks unlike the pictures this model learnt from" in main_text(page)  # a photo is far from the training scenes
    shoot(page, ARTIFACTS / "good-upload-after-bad.png")
    refused = [json.loads(line) for line in RUN_LOG.read_text().splitlines()]
    refused = [r for r in refused if r["kind"] == "refused upload" and "'holiday.png'" in r["reason"]]
    assert len(refused) == 1 and "is not an image" in refused[0]["reason"]  # once, not once a rerun


def step_number(page) -> int:
    return int(re.search(r"Step (\d+):", main_text(page)).group(1))


def test_rapid_clicks_and_key_presses_are_queued_never_dropped(page, app_url, browser_env):
    """A class clicks fast: 15 quick clicks on Next move 15 steps, 10 quick ← presses move 10 back."""
    words = expected_steps(browser_env, browser_env.test_scene(0).read_bytes(), 40, max_len=40)
    clicks = min(15, len(words) - 1)
    assert clicks >= 12, words  # the tiny model says enough words for the test to mean something
    page.goto(f"{app_url}/step?ckpt=tiny-soft&maxlen=40&follow=0")
    wait_for_text(page, "Step 1:", FIRST_PAGE_S, "the step view")
    wait_idle(page, TIMEOUT_S, "the step view")
    logged = len(RUN_LOG.read_text().splitlines()) if RUN_LOG.is_file() else 0
    box = page.locator(".st-key-step_next button").first.bounding_box()
    for _ in range(clicks):  # as fast as a hand: 60 ms apart, whatever the server is doing
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_timeout(60)
    wait_for_text(page, f"Step {clicks + 1}:", TIMEOUT_S, f"step {clicks + 1} after {clicks} clicks")
    wait_idle(page, TIMEOUT_S, "the clicks' reruns")
    assert step_number(page) == clicks + 1
    running = re.search(rf"Step {clicks + 1}:\s*(.*)", main_text(page)).group(1).split()
    assert running == words[: clicks + 1]
    page.get_by_text("Step through").first.click()  # the keys go to the page, not to a widget
    for _ in range(10):
        page.keyboard.press("ArrowLeft")
        page.wait_for_timeout(60)
    wait_for_text(page, f"Step {clicks + 1 - 10}:", TIMEOUT_S, "ten steps back after ten ← presses")
    wait_idle(page, TIMEOUT_S, "the presses' reruns")
    assert step_number(page) == clicks + 1 - 10
    shoot(page, ARTIFACTS / "step-rapid-clicks.png")
    runs = [json.loads(line) for line in RUN_LOG.read_text().splitlines()[logged:]]
    pressed = [r for r in runs if r["page"] == "Step through" and r.get("presses")]
    assert sum(r["presses"] for r in pressed) == clicks + 10  # every press reached the server, and the log
    assert any(r["kind"] == "fragment" for r in pressed)  # a click reruns the step view alone


def test_the_first_pages_own_url_opens_it(page, app_url):
    page.goto(f"{app_url}/caption?ckpt=tiny-soft")
    wait_for_text(page, "log p(caption)", FIRST_PAGE_S, "the Caption page at /caption")
    wait_idle(page, TIMEOUT_S, "the Caption page")
    assert "Page not found" not in page.inner_text("body")
    assert "/caption" in page.url



def test_the_presenter_view_has_large_type_no_sidebar_and_steps_with_the_keys(page, app_url, browser_env):
    words = expected_steps(browser_env, browser_env.test_scene(0).read_bytes(), 40, max_len=40)
    page.goto(f"{app_url}/present?ckpt=tiny-soft&maxlen=40&follow=0")
    wait_for_text(page, "Step 1:", FIRST_PAGE_S, "the presenter view")
    wait_idle(page, TIMEOUT_S, "the presenter view")
    assert not page.get_by_test_id("stSidebar").is_visible()
    size = page.locator(".sat-present-caption").evaluate("e => parseFloat(getComputedStyle(e).fontSize)")
    assert size >= 36, size  # readable from the back of a lecture hall
    for _ in range(3):
        page.keyboard.press("ArrowRight")
        page.wait_for_timeout(60)
    wait_for_text(page, "Step 4:", TIMEOUT_S, "step 4 after three → presses")
    wait_idle(page, TIMEOUT_S, "the presses' reruns")
    assert page.locator(".sat-present-caption").inner_text().split() == words[:4]
    shoot(page, ARTIFACTS / "presenter-view.png")
