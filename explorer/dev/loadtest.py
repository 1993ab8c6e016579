"""A classroom at once: N concurrent browser sessions upload different images and step through them.

    python -m explorer.dev.loadtest [--sessions N] [--steps N] [--checkpoint DIR] [--world DIR] [--json OUT]

Starts the app on 127.0.0.1 twice, each time fresh: first for ONE session (the reference), then for
``--sessions`` sessions at once (Playwright contexts in one headless Chromium). Each session opens the
app, uploads its own image (a new scene of the checkpoint's own world, all different), waits for the
caption, then opens *Step through* and clicks Next up to ``--steps`` times. Measured:

  time to caption  upload -> the caption page has finished running with the caption shown
  step time        click on Next -> the next step shown
  errors           exceptions, timeouts, error boxes on the page; captions or steps that differ
                   from what sat_core decodes for the same image (a session shown another's result)
  peak memory      the server's RSS (process tree, polled) and VmHWM, single session vs all at once

Targets: 0 errors (every caption and step as sat_core decodes them the app's way), server CPU per session flow
under 1 s, server-side p95 under 1 s per caption and under 100 ms per Next click (the app logs its own runs,
fragment reruns included, when SAT_RUN_LOG names a file), peak memory under 2x a single session's.
Not part of the test run: it takes minutes and wants a quiet machine (the browser shares the CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from explorer.dev.browser import (
    IDLE_WITH_TEXT_JS, SCRIPT_STATE_JS, AppServer, find_chromium, launch_chromium, require_browser,
)
from explorer.settings import DEFAULT_CHECKPOINTS, REPO_ROOT

TARGET_P95_S, TARGET_MEMORY_RATIO, TARGET_SERVER_CPU_S = 5.0, 2.0, 1.0
TARGET_SERVER_CAPTION_S, TARGET_SERVER_CLICK_S = 1.0, 0.1  # the app's own run log: a caption, a step click
SERVER_CORES, BROWSER_CORES = "0", "1"  # with --pin: the server and the browsers never share a core
VIEWPORT = {"width": 1280, "height": 800}  # smaller than the screenshots': less for Chromium to paint


@dataclass
class Upload:
    name: str
    data: bytes
    mime: str


@dataclass
class SessionResult:
    index: int
    image: str
    time_to_caption_s: float | None = None
    step_times_s: list[float] = field(default_factory=list)
    caption: str | None = None
    step_words: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


# ---- images ---------------------------------------------------------------------------------------

def make_images(n: int, seed: int = 0, kind: str = "shapes") -> list[Upload]:
    """``n`` different images of the checkpoint's own world ``kind`` (PNG): scenes it could have been trained on,
    drawn from a seed no split of the shipped world uses."""
    from sat_core.worlds.writer import generate

    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp), 0, 0, n, seed=1000 + seed, workers=1, kind=kind)
        entries = json.loads((Path(tmp) / "dataset.json").read_text())["images"]
        return [Upload(f"{kind}_{k:02d}.png", (Path(tmp) / e["filepath"] / e["filename"]).read_bytes(), "image/png")
                for k, e in enumerate(entries)]


def world_of_checkpoint(checkpoint: Path) -> str:
    """The embedded world the checkpoint's gallery comes from (as the app chooses it: by its encoder)."""
    from explorer.settings import world_of

    config = json.loads((checkpoint / "config.json").read_text())
    return world_of(config["model"]["encoder"])


def default_checkpoint() -> Path:
    """The checkpoint the explorer opens on (its first soft model of the default world) when it loads, else the
    first shipped soft checkpoint that does."""
    from sat_core.checkpoint import load_checkpoint
    from sat_core.errors import SatError

    for name in ("scenes_soft", "shapes_soft"):
        try:
            load_checkpoint(DEFAULT_CHECKPOINTS / name)
        except (SatError, OSError) as err:
            print(f"{name} does not load ({str(err)[:120]}…); trying the next", flush=True)
            continue
        return DEFAULT_CHECKPOINTS / name
    raise SystemExit("No shipped checkpoint loads: pass --checkpoint DIR.")


# ---- server memory and CPU ------------------------------------------------------------------------

def _status_kb(pid: int, field_name: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of one process (fields 14 and 15 of /proc/<pid>/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc/<pid>/task/<tid>/children)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
    return out


class Monitor:
    """Polls, in a thread, the server tree's summed VmRSS (peak kept) and the CPU time of the server
    and of this script's other children (Playwright's driver, Chromium). CPU is kept per process, last
    value seen, so a Chromium renderer that exits with its browser context still counts."""

    def __init__(self, server_pid: int, interval_s: float = 0.25):
        self.server_pid, self.interval_s = server_pid, interval_s
        self.peak_kb = 0
        self._first: dict[int, float] = {}  # CPU seconds when the monitor started (0 for later processes)
        self._last: dict[int, float] = {}
        self._server_pids: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss_kb(self) -> int:
        return sum(_status_kb(p, "VmRSS") for p in process_tree(self.server_pid))

    def _sample(self, first: bool = False) -> None:
        server = process_tree(self.server_pid)
        self._server_pids.update(server)
        self.peak_kb = max(self.peak_kb, sum(_status_kb(p, "VmRSS") for p in server))
        for pid in set(server) | set(process_tree(os.getpid())):
            cpu = _cpu_s(pid)
            if cpu is not None:
                self._last[pid] = cpu
                self._first.setdefault(pid, cpu if first else 0.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> Monitor:
        self._sample(first=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()

    def cpu_s(self, server: bool) -> float:
        """CPU seconds used while monitoring, by the server tree or by everything else."""
        pids = [p for p in self._last if (p in self._server_pids) == server]
        return sum(self._last[p] - self._first[p] for p in pids)

    @property
    def peak_mb(self) -> float:
        return self.peak_kb / 1024

    def hwm_mb(self) -> float:
        """The server process's own high-water mark (VmHWM) since it started."""
        return _status_kb(self.server_pid, "VmHWM") / 1024


# ---- one browser session --------------------------------------------------------------------------

async def wait_text(page: Any, needle: str, timeout_s: float, what: str) -> None:
    """Wait until the run is over and ``needle`` shows (async twin of browser.wait_for_text)."""
    try:
        await page.wait_for_function(IDLE_WITH_TEXT_JS, arg=[needle], timeout=timeout_s * 1000, polling=200)
    except Exception as err:
        state = await page.evaluate(SCRIPT_STATE_JS)
        raise TimeoutError(f"{what}: {needle!r} not shown within {timeout_s:.0f} s (script {state})") from err
    shown = await page.get_by_test_id("stException").all_inner_texts()
    if shown:
        raise RuntimeError(f"{what}: exception on the page: {shown[0][:300]}")


async def run_session(browser: Any, url: str, upload: Upload, result: SessionResult, steps: int,
                      timeout_s: float) -> None:
    """Upload, wait for the caption, step through; fills ``result`` (errors included, never raises)."""
    context = await browser.new_context(viewport=VIEWPORT)
    try:
        page = await context.new_page()
        page.set_default_timeout(timeout_s * 1000)
        await page.goto(url, timeout=timeout_s * 1000)
        await wait_text(page, "Choose a gallery scene or upload", timeout_s, "the first page")
        started = time.monotonic()
        await page.locator('[data-testid="stSidebar"] input[type=file]').set_input_files(
            files=[{"name": upload.name, "mimeType": upload.mime, "buffer": upload.data}])
        await wait_text(page, "log p(caption)", timeout_s, "the caption")  # drawn once the caption is decoded
        result.time_to_caption_s = time.monotonic() - started
        main = page.get_by_test_id("stMain")
        lines = [t for t in await main.get_by_test_id("stMarkdownContainer").all_inner_texts()
                 if t.startswith("Caption:")]
        result.caption = lines[0].removeprefix("Caption:").split(" … (cut at")[0].strip() if lines else None
        await page.get_by_test_id("stSidebarNavLink").filter(has_text="Step through").first.click()
        await wait_text(page, "Step 1:", timeout_s, "step 1")
        for n in range(2, steps + 1):
            button = page.locator(".st-key-step_next button").first
            if await button.is_disabled():
                break  # the caption is complete
            started = time.monotonic()
            await button.click()
            await wait_text(page, f"Step {n}:", timeout_s, f"step {n}")
            result.step_times_s.append(time.monotonic() - started)
        text = await main.inner_text()
        line = next((ln for ln in text.splitlines() if ln.startswith("Step ") and ":" in ln), "")
        result.step_words = line.partition(":")[2].split()
        result.errors += [f"error box: {t[:300]}" for t in
                          await page.get_by_test_id("stAlertContentError").all_inner_texts()]
    except Exception as err:  # a failed session is a measurement, not a crash of the load test
        result.errors.append(f"{type(err).__name__}: {str(err)[:500]}")
    finally:
        await context.close()


def niced_chromium(chromium: str, nice: int, folder: Path, cores: str = "") -> str:
    """A wrapper that runs Chromium at a lower priority: in a classroom the browsers run on the
    students' machines, so here the server should get the CPU first when both want it."""
    if nice <= 0 and not cores:
        return chromium
    wrapper = folder / "chromium-niced"
    pin = f"taskset -c {cores} " if cores else ""
    wrapper.write_text(f'#!/bin/sh\nexec {pin}nice -n {int(nice)} "{chromium}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


async def warm_up(url: str, timeout_s: float, chromium: str) -> None:
    """One visit before measuring: the server imports PyTorch and loads the model once, as a classroom's
    server would have done long before the lesson."""
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await launch_chromium(p, chromium)
        try:
            page = await browser.new_page(viewport=VIEWPORT)
            await page.goto(url, timeout=timeout_s * 1000)
            await wait_text(page, "Choose a gallery scene or upload", timeout_s, "the warm-up page")
        finally:
            await browser.close()


async def drive(url: str, uploads: Sequence[Upload], steps: int, timeout_s: float, ramp_s: float,
                max_total_s: float, chromium: str) -> list[SessionResult]:
    """All sessions at once in one Chromium (starts spread over ``ramp_s``); bounded by ``max_total_s``."""
    from playwright.async_api import async_playwright

    results = [SessionResult(k, u.name) for k, u in enumerate(uploads)]

    async def one(k: int) -> None:
        await asyncio.sleep(ramp_s * k / max(1, len(uploads)))
        await run_session(browser, url, uploads[k], results[k], steps, timeout_s)

    async with async_playwright() as p:
        browser = await launch_chromium(p, chromium)
        try:
            tasks = [asyncio.create_task(one(k)) for k in range(len(uploads))]
            _, pending = await asyncio.wait(tasks, timeout=max_total_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for k, task in enumerate(tasks):
                if task in pending:
                    results[k].errors.append(f"did not finish within {max_total_s:.0f} s")
        finally:
            await browser.close()
    return results


# ---- phases, checks, report -----------------------------------------------------------------------

def checkpoint_name(checkpoint: Path) -> str:
    """The name the app's sidebar gives ``checkpoint`` when started with ``--checkpoints checkpoint``."""
    import logging

    import streamlit  # noqa: F401

    # The sidebar's cached functions warn that no Streamlit runtime is running: true, and harmless here.
    logging.getLogger("streamlit.runtime.caching.cache_data_api").setLevel(logging.ERROR)
    from sat_core.paths import list_checkpoints

    from explorer.settings import parse_settings
    from explorer.sidebar import checkpoint_names

    roots = parse_settings(["--checkpoints", str(checkpoint)], os.environ).checkpoint_roots
    names = checkpoint_names([str(p) for p in list_checkpoints(roots)], roots)
    for name, path in names.items():
        if Path(path) == checkpoint.resolve():
            return name
    raise SystemExit(f"{checkpoint} is not a checkpoint folder (config.json + model.safetensors).")


def run_phase(label: str, uploads: Sequence[Upload], args: argparse.Namespace, query: str) -> dict[str, Any]:
    """A fresh server, the sessions at once, the server's memory; the server stopped afterwards."""
    args.logs.mkdir(parents=True, exist_ok=True)
    pin = ["taskset", "-c", SERVER_CORES] if args.pin else []
    runs = args.logs / f"runs-{label}.jsonl"  # the app's own per-run timings (SAT_RUN_LOG)
    runs.unlink(missing_ok=True)
    server = AppServer(checkpoints=[args.checkpoint], world=args.world, log=args.logs / f"server-{label}.log",
                       prefix=pin, env={"SAT_RUN_LOG": str(runs)})
    print(f"[{label}] starting the app on {server.url} …", flush=True)
    with server:
        asyncio.run(warm_up(f"{server.url}/?{query}", args.timeout, args.chromium))
        at_start = Monitor(server.pid).rss_kb() / 1024
        warm_runs = len(runs.read_text().splitlines()) if runs.is_file() else 0
        print(f"[{label}] {len(uploads)} session(s) …", flush=True)
        started = time.monotonic()
        with Monitor(server.pid) as monitor:
            results = asyncio.run(drive(f"{server.url}/?{query}", uploads, args.steps, args.timeout,
                                        args.ramp, args.max_seconds, args.chromium))
        wall = time.monotonic() - started
        hwm = monitor.hwm_mb()
    peak = max(monitor.peak_mb, hwm)
    server_cpu, client_cpu = monitor.cpu_s(server=True), monitor.cpu_s(server=False)
    print(f"[{label}] done in {wall:.1f} s; server peak {peak:.0f} MB; CPU: server {server_cpu:.1f} s, "
          f"browser and this script {client_cpu:.1f} s", flush=True)
    return {"label": label, "sessions": len(uploads), "wall_s": wall, "rss_at_start_mb": at_start,
            "peak_rss_polled_mb": monitor.peak_mb, "vmhwm_mb": hwm, "peak_mb": peak, "server_cpu_s": server_cpu,
            "client_cpu_s": client_cpu, "server_runs": _server_runs(runs, skip=warm_runs),
            "results": [asdict(r) for r in results]}


def _server_runs(path: Path, skip: int) -> list[dict[str, Any]]:
    """The script runs the sessions caused (the warm-up visit's left out), as the app logged them."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()[skip:] if line.strip()]


def check_against_sat_core(phase: dict[str, Any], uploads: Sequence[Upload], checkpoint: Path) -> int:
    """Compare every session's caption and steps with sat_core decoding exactly as the app does: beam search with
    the checkpoint's own decoding (the sidebar follows it), then Step through replaying that caption word by word
    (*Follow*, on by default) in the pages' precision; mismatches."""
    import dataclasses

    from sat_core.checkpoint import load_checkpoint
    from sat_core.decoding import DecodeSession, beam_search
    from sat_core.data.images import load_image, preprocess

    from explorer.resources import NUMBERS_PRECISION

    loaded = load_checkpoint(checkpoint)
    cfg = loaded.decode_defaults()  # beam, length normalisation and cap of the checkpoint's evaluation
    steps_cfg = dataclasses.replace(cfg, beam_size=1, precision=NUMBERS_PRECISION)
    mismatches = 0
    for result, upload in zip(phase["results"], uploads):
        if result["caption"] is None:
            continue  # already an error
        tensor, _ = preprocess(load_image(upload.data, name=upload.name), loaded.preprocess)
        best = beam_search(loaded.model, tensor.unsqueeze(0), loaded.vocab, cfg)[0][0]
        session = DecodeSession(loaded.model, loaded.vocab, tensor, steps_cfg, top_k=5)
        session.sync(len(result["step_words"]), {}, best.tokens if cfg.beam_size > 1 else [])
        words = [s.word for s in session.steps]
        problems = []
        if result["caption"] != best.caption:
            problems.append(f"caption {result['caption']!r}, sat_core says {best.caption!r}")
        if result["step_words"] != words:
            problems.append(f"steps {result['step_words']}, sat_core says {words}")
        if problems:
            mismatches += 1
            result["errors"].append("wrong result: " + "; ".join(problems))
    return mismatches


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(q / 100 * len(ordered)))) - 1]


def summarise(phase: dict[str, Any]) -> dict[str, Any]:
    results = phase["results"]
    captions = [r["time_to_caption_s"] for r in results if r["time_to_caption_s"] is not None]
    steps = [t for r in results for t in r["step_times_s"]]
    runs = phase.get("server_runs", [])
    upload_runs = [r["seconds"] for r in runs if r["page"] == "Caption" and r["source"] == "Upload"]
    # a click's server time: the run that handled it (a fragment rerun of the step view), per press it handled
    clicks = [r["seconds"] / r["presses"] for r in runs if r.get("presses")
              for _ in range(r["presses"])]
    return {
        "server_runs": len(runs), "server_run_p95_s": percentile([r["seconds"] for r in runs], 95),
        "server_click_p50_s": statistics.median(clicks) if clicks else None,
        "server_click_p95_s": percentile(clicks, 95), "server_clicks": len(clicks),
        "fragment_runs": sum(1 for r in runs if r.get("kind") == "fragment"),
        "server_caption_p50_s": statistics.median(upload_runs) if upload_runs else None,
        "server_caption_p95_s": percentile(upload_runs, 95),
        "sessions": phase["sessions"], "sessions_with_errors": sum(1 for r in results if r["errors"]),
        "errors": sum(len(r["errors"]) for r in results),
        "caption_p50_s": statistics.median(captions) if captions else None,
        "caption_p95_s": percentile(captions, 95), "caption_max_s": max(captions, default=None),
        "step_p50_s": statistics.median(steps) if steps else None, "step_p95_s": percentile(steps, 95),
        "steps_measured": len(steps), "peak_mb": phase["peak_mb"], "rss_at_start_mb": phase["rss_at_start_mb"],
        "wall_s": phase["wall_s"], "server_cpu_s": phase["server_cpu_s"], "client_cpu_s": phase["client_cpu_s"],
    }


def _s(value: float | None, unit: str = "s") -> str:
    return "—" if value is None else f"{value:.2f} {unit}"


def report(many: dict[str, Any], single: dict[str, Any] | None) -> dict[str, Any]:
    """Print the figures against the targets; return them."""
    figures = {"load": summarise(many), "single": summarise(single) if single else None}
    load, one = figures["load"], figures["single"]
    ratio = load["peak_mb"] / one["peak_mb"] if one else None
    figures["memory_ratio"] = ratio
    print(f"\nsessions at once              {load['sessions']}  (wall {load['wall_s']:.1f} s, "
          f"CPU: server {load['server_cpu_s']:.1f} s, browser {load['client_cpu_s']:.1f} s)")
    print(f"errors                        {load['errors']} in {load['sessions_with_errors']} session(s)")
    print(f"time to caption p50 / p95     {_s(load['caption_p50_s'])} / {_s(load['caption_p95_s'])}"
          f"  (max {_s(load['caption_max_s'])})")
    print(f"step time p50 / p95           {_s(load['step_p50_s'])} / {_s(load['step_p95_s'])}"
          f"  ({load['steps_measured']} clicks)")
    print(f"server time to caption        {_s(load['server_caption_p50_s'])} / {_s(load['server_caption_p95_s'])}"
          f"  (p50 / p95 of the Caption page's runs on an upload, timed in the app)")
    print(f"server time per click         {_s(load['server_click_p50_s'])} / {_s(load['server_click_p95_s'])}"
          f"  (p50 / p95 over {load['server_clicks']} Next clicks: the step view's rerun that handled each, timed in "
          "the app)")
    print(f"server runs                   {load['server_runs']} ({load['fragment_runs']} fragment reruns), p95 "
          f"{_s(load['server_run_p95_s'])}")
    print(f"server peak memory            {load['peak_mb']:.0f} MB  (at start {load['rss_at_start_mb']:.0f} MB)")
    per_session = load["server_cpu_s"] / max(1, load["sessions"])
    figures["server_cpu_per_session_s"] = per_session
    print(f"server CPU per session flow   {per_session:.2f} s  (upload, caption, the steps; all sessions together / sessions)")
    if one:
        print(f"single session: caption {_s(one['caption_p50_s'])}, step p50 {_s(one['step_p50_s'])}, "
              f"peak memory {one['peak_mb']:.0f} MB, errors {one['errors']}")
        print(f"peak memory ratio             {ratio:.2f}x a single session's")
    checks = [("0 errors", load["errors"] == 0 and (one is None or one["errors"] == 0)),
              (f"server CPU per session < {TARGET_SERVER_CPU_S:g} s", per_session < TARGET_SERVER_CPU_S),
              (f"server-side p95 time to caption < {TARGET_SERVER_CAPTION_S:g} s",
               load["server_caption_p95_s"] is not None and load["server_caption_p95_s"] < TARGET_SERVER_CAPTION_S),
              (f"server-side p95 per click < {TARGET_SERVER_CLICK_S * 1000:g} ms",
               load["server_click_p95_s"] is not None and load["server_click_p95_s"] < TARGET_SERVER_CLICK_S),
              (f"p95 time to caption in the browser < {TARGET_P95_S:g} s",
               load["caption_p95_s"] is not None and load["caption_p95_s"] < TARGET_P95_S)]
    if ratio is not None:
        checks.append((f"peak memory < {TARGET_MEMORY_RATIO:g}x single", ratio < TARGET_MEMORY_RATIO))
    figures["targets"] = {name: ok for name, ok in checks}
    print("targets: " + ", ".join(f"{name}: {'met' if ok else 'NOT met'}" for name, ok in checks))
    for phase in (single, many):
        for r in (phase or {}).get("results", []):
            for error in r["errors"]:
                print(f"  [{phase['label']} #{r['index']} {r['image']}] {error}")
    return figures


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m explorer.dev.loadtest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=30, help="concurrent browser sessions (default 30)")
    parser.add_argument("--steps", type=int, default=5, help="steps each session goes through (default 5)")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="checkpoint folder the sessions use (default: the one the explorer opens on, "
                             "checkpoints/scenes_soft, when it loads)")
    parser.add_argument("--world", default=None, help="dataset folder of the app's gallery (as `-- --world`)")
    parser.add_argument("--no-single", action="store_true", help="skip the single-session reference run")
    parser.add_argument("--ramp", type=float, default=0.0, help="spread the session starts over this many seconds")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds one page or click may take")
    parser.add_argument("--max-seconds", type=float, default=1200.0, help="bound on one phase's sessions")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated images")
    parser.add_argument("--json", type=Path, default=None, help="write the figures and every session here")
    parser.add_argument("--logs", type=Path, default=REPO_ROOT / "test-artifacts" / "loadtest",
                        help="folder for the servers' logs")
    parser.add_argument("--chromium", default=None, help="Chromium executable (default /usr/bin/chromium)")
    parser.add_argument("--browser-nice", type=int, default=10,
                        help="run Chromium with this niceness so the server gets the CPU first (0: off)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=(os.cpu_count() or 1) >= 2,
                        help=f"server on core {SERVER_CORES}, browsers on core {BROWSER_CORES} (taskset), so the "
                             "server's figures are its own (default: on with 2+ cores)")
    args = parser.parse_args(argv)
    if not 1 <= args.sessions <= 100 or not 1 <= args.steps <= 40:
        parser.error("--sessions must be 1..100 and --steps 1..40")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    require_browser(args.chromium)
    from urllib.parse import urlencode

    args.checkpoint = args.checkpoint or default_checkpoint()
    query = urlencode({"source": "Upload", "ckpt": checkpoint_name(args.checkpoint)})
    kind = world_of_checkpoint(args.checkpoint)
    print(f"checkpoint {args.checkpoint}; images of its world, {kind}", flush=True)
    uploads = make_images(args.sessions, args.seed, kind)
    with tempfile.TemporaryDirectory() as tmp:
        args.chromium = niced_chromium(args.chromium or find_chromium(), args.browser_nice, Path(tmp),
                                       BROWSER_CORES if args.pin else "")
        single = None if args.no_single else run_phase("single", uploads[:1], args, query)
        many = run_phase(f"{args.sessions}-sessions", uploads, args, query)
    print("checking every caption and step against sat_core …", flush=True)
    for phase in (single, many):
        if phase is not None:
            phase["mismatches"] = check_against_sat_core(phase, uploads, args.checkpoint)
    figures = report(many, single)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        command = "python -m explorer.dev.loadtest " + " ".join(sys.argv[1:] if argv is None else argv)
        out = {"command": command, "figures": figures, "single": single, "load": many}
        args.json.write_text(json.dumps(out, indent=2))
        print(f"written {args.json}")


if __name__ == "__main__":
    main()
