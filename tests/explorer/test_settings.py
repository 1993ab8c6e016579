"""Where the server looks for checkpoints and scenes."""

from __future__ import annotations

import os
from pathlib import Path

from explorer.settings import DEFAULT_CHECKPOINTS, DEFAULT_WORLD, parse_settings
from explorer.sidebar import checkpoint_names


def test_defaults_then_environment_then_command_line(tmp_path):
    a, b, c = (tmp_path / n for n in "abc")
    settings = parse_settings([], {})
    assert settings.checkpoint_roots == (DEFAULT_CHECKPOINTS.resolve(),)
    assert settings.world_dir == DEFAULT_WORLD.resolve() and settings.device == "cpu"
    env = {"SAT_CHECKPOINT_DIRS": f"{a}{os.pathsep}{b}", "SAT_WORLD_DIR": str(c)}
    settings = parse_settings(["--checkpoints", str(c), str(a), "--world", str(b)], env)
    assert settings.checkpoint_roots == (DEFAULT_CHECKPOINTS.resolve(), a, b, c)  # no duplicates
    assert settings.world_dir == b  # the command line wins over the environment
    assert parse_settings([], env).world_dir == c


def test_checkpoint_names_are_short_and_unique(tmp_path):
    roots = (tmp_path / "one", tmp_path / "two")
    paths = [str(roots[0] / "soft"), str(roots[1] / "soft"), str(roots[1] / "runs" / "best")]
    names = checkpoint_names(paths, roots)
    assert list(names) == ["soft", "two/soft", "runs/best"]
    assert names["two/soft"] == paths[1]
    assert Path(names["runs/best"]).name == "best"
