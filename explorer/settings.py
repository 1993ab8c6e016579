"""Where the server looks for checkpoints and test scenes: repo defaults, command line, environment.

    streamlit run explorer/app.py -- --checkpoints DIR [DIR …] --world DIR
    SAT_CHECKPOINT_DIRS=DIR1:DIR2 SAT_WORLD_DIR=DIR streamlit run explorer/app.py

Only folders named here (and the repo's ``checkpoints/``) may be loaded from; a path typed into
the app outside them is refused (sat_core.paths.resolve_checkpoint_path).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CHECKPOINTS = REPO_ROOT / "checkpoints"
DEFAULT_WORLD = REPO_ROOT / "data" / "world"


@dataclass(frozen=True)
class ServerSettings:
    checkpoint_roots: tuple[Path, ...]
    world_dir: Path
    device: str = "cpu"


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> ServerSettings:
    """Combine the defaults, ``argv`` (the app's own arguments, after ``--``) and the environment."""
    parser = argparse.ArgumentParser(prog="streamlit run explorer/app.py --", add_help=False)
    parser.add_argument("--checkpoints", nargs="*", default=[])
    parser.add_argument("--world", default=None)
    parser.add_argument("--device", default=None)
    args, _ = parser.parse_known_args(list(argv))
    env_dirs = [d for d in environ.get("SAT_CHECKPOINT_DIRS", "").split(os.pathsep) if d.strip()]
    roots: list[Path] = []
    for folder in [DEFAULT_CHECKPOINTS, *map(Path, env_dirs), *map(Path, args.checkpoints)]:
        resolved = folder.expanduser().resolve()
        if resolved not in roots:
            roots.append(resolved)
    world = args.world or environ.get("SAT_WORLD_DIR") or str(DEFAULT_WORLD)
    device = args.device or environ.get("SAT_DEVICE") or "cpu"
    return ServerSettings(tuple(roots), Path(world).expanduser().resolve(), device)


def server_settings() -> ServerSettings:
    """Settings of this server; command-line arguments count only under ``streamlit run … app.py``."""
    argv = sys.argv[1:] if Path(sys.argv[0]).name == "app.py" else []
    return parse_settings(argv, os.environ)
