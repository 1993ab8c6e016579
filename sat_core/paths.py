"""Which checkpoint folders a user may load from: typed paths resolved and checked against allowed roots.

The explorer loads only from the folders its server was started with; links and '..' are followed
before the check, so neither can reach outside them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from sat_core.errors import CheckpointError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CHECKPOINT_FILES = (WEIGHTS_FILE, CONFIG_FILE, "metrics.json", "MODEL_CARD.md")


def resolve_checkpoint_path(user_path: str, allowed_roots: Sequence[Path]) -> Path:
    """Resolve a typed path (symlinks and '..' followed) and refuse it unless inside an allowed root.

    A relative path is tried against the working directory, then against each root.
    """
    roots = [Path(r).expanduser().resolve() for r in allowed_roots]
    where = ", ".join(str(r) for r in roots) or "(none configured)"
    text = (user_path or "").strip()
    if not text:
        raise CheckpointError(
            f"No checkpoint path given. Type the path of a checkpoint folder inside: {where}."
        )
    if not roots:
        raise CheckpointError(
            "No checkpoint folders are allowed here; start the app with a checkpoint folder."
        )
    raw = _expand(Path(text))
    candidates = [raw] if raw.is_absolute() else [Path.cwd() / raw] + [root / raw for root in roots]
    inside = []
    for candidate in candidates:
        try:
            resolved = candidate.resolve()
        except (OSError, RuntimeError) as exc:  # symlink loops
            raise CheckpointError(f"The path {text!r} cannot be resolved ({exc}).") from exc
        if _inside(resolved, roots):
            if resolved.exists():
                _check_files_inside(resolved, roots, text, where)
                return resolved
            inside.append(resolved)
    if inside:
        return inside[0]  # inside the roots but missing: read_checkpoint says so
    raise CheckpointError(
        f"{text!r} points to {candidates[0].resolve()}, outside the folders checkpoints may be loaded "
        f"from: {where}. Copy the checkpoint into one of them (links and '..' are followed first)."
    )


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path.is_relative_to(root) for root in roots)


def _check_files_inside(path: Path, roots: Sequence[Path], text: str, where: str) -> None:
    """A folder inside the roots must not reach outside through links to its files."""
    folder = path if path.is_dir() else path.parent
    for name in CHECKPOINT_FILES:
        target = (folder / name).resolve()
        if (folder / name).exists() and not _inside(target, roots):
            raise CheckpointError(
                f"{text!r} holds {name}, a link to {target}, outside the folders checkpoints may be "
                f"loaded from: {where}. Copy the real file into the checkpoint folder."
            )


def _expand(path: Path) -> Path:
    try:
        return path.expanduser()
    except RuntimeError:  # "~nouser/…": keep it literal
        return path


def list_checkpoints(roots: Path | str | Iterable[Path | str], *, max_depth: int = 3) -> list[Path]:
    """Checkpoint folders (config.json + model.safetensors) under the roots, sorted, symlinks not followed."""
    if isinstance(roots, (str, Path)):
        roots = [roots]
    found: set[Path] = set()
    for root in roots:
        root = _expand(Path(root))
        if not root.is_dir():
            continue
        root = root.resolve()
        for current, dirs, files in os.walk(root):
            if CONFIG_FILE in files and WEIGHTS_FILE in files:
                found.add(Path(current))
                dirs[:] = []
                continue
            depth = len(Path(current).relative_to(root).parts)
            # Hidden folders include our own staging (.name.xxx.tmp) and replaced (.old) checkpoints.
            dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < max_depth else []
    return sorted(found)
