"""What the browser tests, the screenshots and the load test share: the app as a local server,
Debian's Chromium through Playwright (no browser download), and waits on Streamlit's script state.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from explorer.settings import REPO_ROOT

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
VIEWPORT = {"width": 1400, "height": 1000}

# True once the script run is over and ``needle`` (or an exception) is in the main area; stale
# elements of the previous run are gone by then. textContent, not innerText: it needs no layout,
# and this runs every 100 ms in every open page.
IDLE_WITH_TEXT_JS = """([needle]) => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
  const main = document.querySelector('[data-testid="stMain"]');
  return !!main && (main.textContent.includes(needle) || !!main.querySelector('[data-testid="stException"]'));
}"""
SCRIPT_STATE_JS = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  return app ? app.getAttribute('data-test-script-state') : null;
}"""


class AppError(RuntimeError):
    """The page shows a Python exception instead of what was expected."""


# ---- the server -----------------------------------------------------------------------------------

def find_chromium() -> str | None:
    """Debian's Chromium, or whatever ``chromium`` is on the PATH; None when there is none."""
    if Path(CHROMIUM).is_file():
        return CHROMIUM
    return shutil.which("chromium")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def app_args(checkpoints: Sequence[Path | str] = (), world: Path | str | None = None) -> list[str]:
    """The app's own arguments (after ``--``)."""
    args: list[str] = []
    if checkpoints:
        args += ["--checkpoints", *(str(Path(c).resolve()) for c in checkpoints)]
    if world is not None:
        args += ["--world", str(Path(world).resolve())]
    return args


class AppServer:
    """``streamlit run explorer/app.py`` on 127.0.0.1 as a child process; a context manager."""

    def __init__(self, *, checkpoints: Sequence[Path | str] = (), world: Path | str | None = None,
                 env: Mapping[str, str] | None = None, log: Path | None = None, startup_timeout: float = 180.0,
                 prefix: Sequence[str] = ()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(log) if log is not None else None
        self.startup_timeout = startup_timeout
        self.command = [*prefix, sys.executable, "-m", "streamlit", "run", str(REPO_ROOT / "explorer" / "app.py"),
                        "--server.headless", "true", "--server.address", "127.0.0.1",
                        "--server.port", str(self.port), "--server.fileWatcherType", "none",
                        "--browser.gatherUsageStats", "false"]
        extra = app_args(checkpoints, world)
        if extra:
            self.command += ["--", *extra]
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, "the server is not started"
        return self.process.pid

    def start(self) -> AppServer:
        """Start the server and wait until /_stcore/health answers; RuntimeError with its log if not."""
        out = open(self.log, "wb") if self.log is not None else subprocess.DEVNULL
        self.process = subprocess.Popen(self.command, cwd=REPO_ROOT, env=self.env, stdout=out,
                                        stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"The app exited with code {self.process.returncode} at start. {self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"The app did not answer on {self.url} within {self.startup_timeout:.0f} s. "
                           f"{self._log_tail()}")

    def stop(self) -> None:
        """Terminate the server (and kill it if it does not stop within 15 s)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=15)

    def _log_tail(self, chars: int = 2000) -> str:
        if self.log is None or not self.log.is_file():
            return "(no server log)"
        return "Server log ends with:\n" + self.log.read_text(errors="replace")[-chars:]

    def __enter__(self) -> AppServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def check_local(url: str) -> str:
    """Refuse any server but one on this machine: the scripts only ever drive 127.0.0.1."""
    host = urlparse(url).hostname
    if host not in LOCAL_HOSTS:
        raise SystemExit(f"Only a local app can be driven (127.0.0.1 or localhost), not {host!r}.")
    return url.rstrip("/")


# ---- the browser ----------------------------------------------------------------------------------

def launch_chromium(playwright: Any, executable: str | None = None) -> Any:
    """Headless Chromium through Playwright (sync or async ``playwright`` object alike)."""
    executable = executable or find_chromium()
    if executable is None:
        raise RuntimeError("No Chromium found: apt-get install -y chromium (never `playwright install`).")
    return playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)


def wait_for_text(page: Any, needle: str, timeout_s: float, what: str) -> None:
    """Wait until the script run is over and ``needle`` shows in the main area (sync page)."""
    try:
        page.wait_for_function(IDLE_WITH_TEXT_JS, arg=[needle], timeout=timeout_s * 1000, polling=100)
    except Exception as err:
        raise TimeoutError(f"{what}: {needle!r} did not show within {timeout_s:.0f} s "
                           f"(script state {script_state(page)!r}). {page_errors(page)}") from err
    if page.get_by_test_id("stException").count():
        raise AppError(f"{what}: the app raised an exception. {page_errors(page)}")


def wait_idle(page: Any, timeout_s: float, what: str, settle_s: float = 0.8) -> None:
    """Wait until the app has not been running for ``settle_s`` (a click's rerun may start late)."""
    deadline = time.monotonic() + timeout_s
    quiet_since = None
    while time.monotonic() < deadline:
        if script_state(page) == "notRunning":
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= settle_s:
                page.wait_for_timeout(300)  # images and plotly charts draw after the run ends
                return
        else:
            quiet_since = None
        page.wait_for_timeout(100)
    raise TimeoutError(f"{what}: the app was still running after {timeout_s:.0f} s (the 'Running…' "
                       f"indicator never went away). {page_errors(page)}")


def script_state(page: Any) -> str | None:
    try:
        return page.evaluate(SCRIPT_STATE_JS)
    except Exception:
        return None


def page_errors(page: Any) -> str:
    """Exceptions and error boxes in the main area, as one line ('' when there are none)."""
    texts = []
    for selector in ('[data-testid="stException"]', '[data-testid="stAlertContentError"]'):
        for element in page.locator(selector).all():
            texts.append(element.inner_text().strip().replace("\n", " ")[:300])
    return ("Errors on the page: " + " | ".join(texts)) if texts else ""


def go_to(page: Any, title: str, needle: str, timeout_s: float) -> None:
    """Open a page through the sidebar navigation (same browser session) and wait for it."""
    page.get_by_test_id("stSidebarNavLink").filter(has_text=title).first.click()
    wait_for_text(page, needle, timeout_s, f"page {title!r}")
    wait_idle(page, timeout_s, f"page {title!r}")


def click_button(page: Any, name: str, timeout_s: float) -> None:
    """Click a button by its label (a keyboard-shortcut hint in the label is allowed)."""
    page.get_by_role("button", name=re.compile("^" + re.escape(name))).first.click()
    wait_idle(page, timeout_s, f"button {name!r}")


def click_key(page: Any, key: str, timeout_s: float) -> None:
    """Click a button by its widget key (Streamlit marks its container with ``st-key-<key>``)."""
    page.locator(f".st-key-{key} button").first.click()
    wait_idle(page, timeout_s, f"button {key!r}")


def choose_option(page: Any, key: str, option: str | int, timeout_s: float) -> None:
    """Pick an option of the selectbox with widget key ``key`` (by its text, or its position)."""
    for _ in range(3):  # a rerun that lands between opening and picking closes the list: open it again
        wait_idle(page, timeout_s, f"before opening {key!r}")
        page.locator(f".st-key-{key}").get_by_role("button", name="Open").click()
        options = page.get_by_role("option")
        target = options.nth(option) if isinstance(option, int) else options.filter(has_text=option).first
        try:
            target.click(timeout=5000)
            break
        except Exception:  # noqa: BLE001 - playwright's timeout: try again
            continue
    else:
        raise AssertionError(f"could not choose {option!r} in {key!r}")
    wait_idle(page, timeout_s, f"choosing {option!r} in {key!r}")


def upload(page: Any, name: str, data: bytes, mime: str = "image/png") -> None:
    """Put a file into the sidebar's uploader (the 'Upload' source must be chosen)."""
    page.locator('[data-testid="stSidebar"] input[type=file]').set_input_files(
        files=[{"name": name, "mimeType": mime, "buffer": data}])


def choose_upload(page: Any, timeout_s: float) -> None:
    page.get_by_test_id("stSidebar").get_by_text("Upload", exact=True).click()
    page.locator('[data-testid="stSidebar"] input[type=file]').wait_for(state="attached", timeout=timeout_s * 1000)
    wait_idle(page, timeout_s, "choosing the Upload source")


def shoot(page: Any, path: Path, min_height: int = 900, max_height: int = 5000) -> Path:
    """Screenshot with the viewport as tall as the page's content (Streamlit scrolls inside stMain), the pointer
    moved off every button first (a last click's tooltip would cover what lies above it)."""
    page.mouse.move(0, 0)
    height = page.evaluate("""() => {
      const block = document.querySelector('[data-testid="stMainBlockContainer"]');
      const side = document.querySelector('[data-testid="stSidebarContent"]');
      return Math.max(block ? block.scrollHeight + 120 : 0, side ? side.scrollHeight : 0);
    }""")
    page.set_viewport_size({"width": VIEWPORT["width"], "height": int(min(max(height, min_height), max_height))})
    page.wait_for_timeout(800)  # plotly re-lays out to the new size
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path))
    page.set_viewport_size(VIEWPORT)
    return path


def require_browser(chromium: str | None) -> None:
    """Exit with what to install when the Playwright package or a Chromium is missing."""
    try:
        import playwright  # noqa: F401
    except ImportError:
        raise SystemExit("The Python package 'playwright' is needed (pip install playwright; "
                         "no `playwright install`: Debian's chromium is used).") from None
    if (chromium or find_chromium()) is None:
        raise SystemExit("No Chromium found: apt-get install -y chromium.")
