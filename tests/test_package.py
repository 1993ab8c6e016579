"""The installable package: every command has its console entry point, the pins match requirements.txt, a
checkpoint is found by name from any folder, and — built and installed into a fresh virtual environment
(offline: --no-build-isolation --no-deps) — the installed commands and the app run from another folder on
the copies of the shipped checkpoints and data files the package carries.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import tomllib
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from explorer import launch
from sat_core.errors import CheckpointError
from sat_core.paths import CHECKPOINT_DIRS_ENV, find_checkpoint, shipped_checkpoints

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
SCRIPTS: dict[str, str] = PYPROJECT["project"]["scripts"]
# What a build reads: the packaging files, the packages, and what setup.py copies into them.
SOURCES = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "requirements.txt", "NOTICE",
           ".streamlit", "sat_core", "explorer", "checkpoints"]


def commands() -> list[str]:
    """sat_core's command modules: the top-level modules defining main()."""
    found = []
    for path in sorted((REPO / "sat_core").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
            found.append(path.stem)
    return found


# ---- what pyproject.toml declares -----------------------------------------------------------------

def test_every_command_module_has_its_entry_point_and_every_entry_point_a_main() -> None:
    assert len(commands()) >= 9
    expected = {f"sat-{name}": f"sat_core.{name}:main" for name in commands()} | {"sat-explorer": "explorer.launch:main"}
    assert SCRIPTS == expected, "pyproject.toml's [project.scripts] should name one sat-NAME per sat_core/NAME.py main()"


def requirement_lines(path: Path) -> set[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return {line for line in lines if line}


def test_dependencies_are_requirements_txt() -> None:
    project = PYPROJECT["project"]
    declared = set(project["dependencies"]) | {r for extra in project["optional-dependencies"].values() for r in extra}
    assert declared == requirement_lines(REPO / "requirements.txt"), \
        "pyproject.toml's dependencies (and its test extra) should pin what requirements.txt pins"
    assert not any(re.match(r"(pytest|playwright)\b", r) for r in project["dependencies"])  # tests only


# ---- finding a checkpoint by name ---------------------------------------------------------------

def test_a_checkpoint_is_found_by_name_from_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    shipped = shipped_checkpoints()
    assert shipped == REPO / "checkpoints"  # the source tree: the repository's own folder
    assert find_checkpoint("shapes_soft", {}) == shipped / "shapes_soft"
    assert find_checkpoint("checkpoints/shapes_soft", {}) == shipped / "shapes_soft"  # the README's spelling
    mine = tmp_path / "mine"
    (mine / "shapes_soft").mkdir(parents=True)
    (mine / "run").mkdir()
    env = {CHECKPOINT_DIRS_ENV: f"{tmp_path / 'empty'}{os.pathsep}{mine}"}
    assert find_checkpoint("run", env) == mine / "run"
    assert find_checkpoint("shapes_soft", env) == mine / "shapes_soft"  # the user's folders come first
    (tmp_path / "shapes_soft").mkdir()
    assert find_checkpoint("shapes_soft", env) == Path("shapes_soft")  # a path that exists is taken as given
    with pytest.raises(CheckpointError, match="does not exist") as caught:
        find_checkpoint("runs/nope", env)
    message = str(caught.value)
    for place in (tmp_path / "runs/nope", mine / "runs/nope", shipped / "runs/nope", "scenes_soft", CHECKPOINT_DIRS_ENV):
        assert str(place) in message


# ---- the explorer's launcher ------------------------------------------------------------------

def test_launcher_passes_the_server_settings_then_the_user_s_options() -> None:
    argv = launch.streamlit_argv(["--server.port", "8502", "--checkpoints", "runs/a", "--server.address=0.0.0.0",
                                  "--world", "data/scenes"])
    assert argv[:2] == ["run", str(REPO / "explorer" / "app.py")]
    assert "--runner.postScriptGC=false" in argv and "--server.headless=true" in argv  # .streamlit/config.toml
    assert argv.index("--server.port=8502") > argv.index("--server.headless=true")  # the user's win
    assert argv[argv.index("--"):] == ["--", "--checkpoints", "runs/a", "--world", "data/scenes"]
    assert "--server.address=0.0.0.0" in argv[: argv.index("--")]
    assert launch.server_options([REPO / "missing.toml"]) == []


def test_the_server_sends_every_element_whole_so_quick_presses_cannot_leave_the_page_running() -> None:
    """Streamlit's reference to an element the browser already dropped failed the connection (.streamlit/config.toml);
    no element is large enough to be sent as a reference, from `streamlit run` or the launcher alike."""
    import tomllib

    size = tomllib.loads((REPO / ".streamlit/config.toml").read_text())["global"]["minCachedMessageSize"]
    assert size >= 1e12
    assert f"--global.minCachedMessageSize={size}" in launch.streamlit_argv([])


# ---- built, installed, run from elsewhere -------------------------------------------------------

def fresh_env() -> dict[str, str]:
    """This environment without the repository on the path nor any SAT_ setting: as a new user runs it."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("SAT_")}


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=fresh_env(), capture_output=True, text=True, timeout=600)


def copy_sources(dest: Path) -> Path:
    """The files a build reads, copied: building writes build/ and *.egg-info beside them, never in the repo."""
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, dest / name)
    return dest


def venv_with(source: Path, venv: Path, *pip_args: str) -> Path:
    """A virtual environment seeing this machine's packages (torch …), with the project installed from source."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    if sys.prefix != sys.base_prefix:  # run from a virtual environment: the new one's "system" packages are the
        # base interpreter's, not this environment's (setuptools, torch …); a .pth file adds this one's before them
        where = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=venv)
        Path(where.stdout.strip(), "outer-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = run([str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                *pip_args], cwd=source)
    assert done.returncode == 0, done.stdout + done.stderr
    return venv / "bin"


def setuptools_version() -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in version("setuptools").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return ()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if setuptools_version() < (70, 1):  # what pyproject.toml's build-system asks for, not downloaded here
        pytest.skip("building offline needs setuptools>=70.1 installed: python3 -m pip install 'setuptools>=70.1'")
    return copy_sources(tmp_path_factory.mktemp("source"))


def installed_files(package: Path) -> set[str]:
    return {str(p.relative_to(package)) for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.slow
def test_installed_commands_and_app_run_from_another_folder(source: Path, tmp_path: Path) -> None:
    pytest.importorskip("streamlit")  # the installed app is drawn by streamlit's AppTest
    bin_dir = venv_with(source, tmp_path / "venv", ".")
    where = run([str(bin_dir / "python"), "-c", "import sat_core, explorer; print(sat_core.__file__, explorer.__file__)"],
                cwd=tmp_path)
    site = Path(where.stdout.split()[0]).parents[1]
    assert site.is_relative_to(tmp_path / "venv"), where.stdout + where.stderr  # the installed copy, not the repo
    # Every file beside the code, the shipped checkpoints and the server settings travel in the package.
    for package in ("sat_core", "explorer"):
        assert installed_files(source / package) <= installed_files(site / package)
    assert installed_files(source / "checkpoints") == installed_files(site / "sat_core" / "checkpoints")
    assert (site / "explorer" / "streamlit_config.toml").read_bytes() == (REPO / ".streamlit/config.toml").read_bytes()

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:  # each one imports torch
        helps = dict(zip(SCRIPTS, pool.map(lambda name: run([str(bin_dir / name), "--help"], cwd=tmp_path), SCRIPTS)))
    for name, done in helps.items():
        assert done.returncode == 0 and ("usage:" in done.stdout or name in done.stdout), f"{name}: {done.stderr}"
        if done.stdout.startswith("usage: "):  # an installed script names itself, not `python -m`
            assert done.stdout.startswith(f"usage: {name} "), done.stdout[:120]

    from PIL import Image

    Image.new("RGB", (112, 112), (220, 40, 40)).save(tmp_path / "red.png")
    done = run([str(bin_dir / "sat-caption"), "--checkpoint", "shapes_soft", "red.png", "--device", "cpu"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # a plain red picture is far from the shapes world: the caption may run to the length cap, and then says so
    cut = r"( … \(cut at the length cap of \d+ words: --max-len\))?"
    assert re.fullmatch(rf"red\.png: [a-z ]+{cut}\n", done.stdout), done.stdout
    missing = run([str(bin_dir / "sat-caption"), "--checkpoint", "nope", "red.png"], cwd=tmp_path)
    assert missing.returncode == 2 and str(site / "sat_core" / "checkpoints") in missing.stderr, missing.stderr

    assert_first_page_draws(bin_dir / "python", tmp_path)
    assert_server_starts(bin_dir / "sat-explorer", tmp_path)


def assert_first_page_draws(python: Path, cwd: Path) -> None:
    """The installed app.py, drawn by AppTest: the shipped scenes_soft captions a generated scene (no data/ here)."""
    draw = ("from streamlit.testing.v1 import AppTest; from explorer import launch; "
            "at = AppTest.from_file(str(launch.APP), default_timeout=240).run(); "
            "print('exception:', [e.value for e in at.exception]); print(at.sidebar.selectbox[0].value); "
            "print(*[m.value for m in at.markdown if m.value.startswith('**Caption')])")
    drawn = run([str(python), "-c", draw], cwd=cwd)
    assert "exception: []" in drawn.stdout and "scenes_soft" in drawn.stdout, drawn.stdout + drawn.stderr
    assert re.search(r"\*\*Caption:?\*\* \w+", drawn.stdout), drawn.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_server_starts(command: Path, cwd: Path) -> None:
    port = free_port()
    server = subprocess.Popen([str(command), "--server.port", str(port), "--server.address", "127.0.0.1"], cwd=cwd,
                              env=fresh_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as reply:
                    assert reply.read() == b"ok"
                    return
            except OSError:
                time.sleep(0.5)
        pytest.fail(f"sat-explorer did not answer on port {port}")
    finally:
        server.terminate()
        output = server.communicate(timeout=30)[0]
        assert "Traceback" not in output, output


@pytest.mark.slow
def test_editable_install_reads_the_source_tree(source: Path, tmp_path: Path) -> None:
    bin_dir = venv_with(source, tmp_path / "venv", "-e", ".")
    check = ("from sat_core.paths import shipped_checkpoints; from explorer import launch; import sat_core; "
             "print(sat_core.__file__); print(shipped_checkpoints()); print(*launch.server_options()[:1])")
    done = run([str(bin_dir / "python"), "-c", check], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    module, checkpoints, option = done.stdout.split("\n")[:3]
    assert (Path(module), Path(checkpoints)) == (source / "sat_core" / "__init__.py", source / "checkpoints")
    assert option.startswith("--server.")
    helped = run([str(bin_dir / "sat-world"), "--help"], cwd=tmp_path)
    assert helped.returncode == 0 and "usage:" in helped.stdout, helped.stderr
