"""The README as a user meets it: short, its links alive, its Python example runs and says what it claims.

The example is the README's ``python`` block, run as written in a folder holding ``scene.png`` (a scene of
the shapes world) and the repository's ``checkpoints/``; its output is checked against the objects it
leaves behind and against the caption CLI on the same picture.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from sat_core import caption as caption_cli
from sat_core.worlds.writer import generate

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
TEST_COMMAND = "python3 -m pip install -r requirements.txt && python3 -m pytest"  # what .ci/run calls
MAX_LINES = 300
# Development history belongs to git: no session or issue numbers in the documentation.
HISTORY = re.compile(r"[Ss]essions? [0-9]|[Ii]ssues? [0-9]|issue #?[0-9]")


def readme() -> str:
    return README.read_text(encoding="utf-8")


def python_example() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", readme(), flags=re.S | re.M)
    assert len(blocks) == 1, f"the README should hold one ```python block, not {len(blocks)}"
    return blocks[0]


def test_readme_is_short() -> None:
    lines = readme().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines; keep it to {MAX_LINES} and move detail to docs/"


def test_readme_states_the_test_command() -> None:
    assert TEST_COMMAND in readme()


def test_local_links_exist() -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme())
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local, "the README links no file of the repository"
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, f"README.md links files that do not exist: {missing}"


@pytest.mark.parametrize("path", ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))])
def test_docs_name_no_development_sessions_or_issues(path: str) -> None:
    text = (REPO / path).read_text(encoding="utf-8")
    found = [line for line in text.splitlines() if HISTORY.search(line)]
    assert not found, f"{path} names sessions or issues (history belongs to git): {found[:3]}"


def test_python_example_captions_a_picture(tmp_path, monkeypatch, capsys) -> None:
    dataset = json.loads(generate(tmp_path / "world", 0, 0, 1, workers=1).read_text())
    record = dataset["images"][0]
    shutil.copy(tmp_path / "world" / record["filepath"] / record["filename"], tmp_path / "scene.png")
    (tmp_path / "checkpoints").symlink_to(REPO / "checkpoints", target_is_directory=True)
    monkeypatch.chdir(tmp_path)

    namespace: dict = {"__name__": "readme_example"}
    exec(compile(python_example(), "README.md", "exec"), namespace)  # noqa: S102 — the README's own code
    lines = capsys.readouterr().out.splitlines()

    best, alpha, failed, ckpt = namespace["best"], namespace["alpha"], namespace["failed"], namespace["ckpt"]
    assert failed == []
    assert best.words, "the example's caption is empty"
    assert all(w in ckpt.vocab.stoi for w in best.words)
    assert lines[0] == best.caption
    # One α map per word plus the <end> step's, each a distribution over the 14×14 grid.
    assert alpha.shape == (len(best.words) + 1, 14, 14)
    np.testing.assert_allclose(alpha.sum(axis=(1, 2)), 1.0, atol=1e-4)
    assert len(lines) == 1 + len(best.words)
    for word, a, line in zip(best.words, alpha, lines[1:]):
        row, col = np.unravel_index(a.argmax(), a.shape)
        assert line.split() == [word, "looks", "most", "at", "cell", f"({row},", f"{col}),", "α", "=",
                                f"{a.max():.2f}"]

    # The example says what the command line says about the same picture.
    assert caption_cli.main(["--checkpoint", "checkpoints/shapes_soft", "scene.png"]) == 0
    assert capsys.readouterr().out.strip() == f"scene.png: {best.caption}"
