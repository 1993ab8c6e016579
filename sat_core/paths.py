"""Which checkpoint folders a user may load from: typed paths resolved and checked against allowed roots.

The explorer loads only from the folders its server was started with; links and '..' are followed
before the check, so neither can reach outside them. The commands take any path, and find a checkpoint
by name (``--checkpoint scenes_soft``) in the folders of SAT_CHECKPOINT_DIRS and the shipped checkpoints,
which lie in the repository's ``checkpoints/`` or, after ``pip install .``, inside the package.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from sat_core.errors import CheckpointError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CHECKPOINT_FILES = (WEIGHTS_FILE, CONFIG_FILE, "metrics.json", "MODEL_CARD.md")
CHECKPOINT_DIRS_ENV = "SAT_CHECKPOINT_DIRS"  # folders holding a user's checkpoints, os.pathsep-separated


def shipped_checkpoints() -> Path:
    """The folder of the checkpoints shipped with the project: the copy a ``pip install .`` puts inside the
    package, else the repository's ``checkpoints/`` (a source tree, or ``pip install -e .``)."""
    package = Path(__file__).resolve().parent
    installed = package / "checkpoints"
    return installed if installed.is_dir() else package.parent / "checkpoints"


def checkpoint_dirs(environ: Mapping[str, str] = os.environ) -> list[Path]:
    """The folders named in SAT_CHECKPOINT_DIRS, in order."""
    return [_expand(Path(d.strip())) for d in environ.get(CHECKPOINT_DIRS_ENV, "").split(os.pathsep) if d.strip()]


def find_checkpoint(user_path: str | Path, environ: Mapping[str, str] = os.environ) -> Path:
    """A checkpoint path typed on a command line: as given when it exists (or is absolute), else by name in
    the folders of SAT_CHECKPOINT_DIRS, then among the shipped checkpoints — where ``checkpoints/NAME``, the
    README's spelling, stands for NAME, so the README's commands run from any folder.

    Found nowhere: CheckpointError naming every place looked in and what to give instead.
    """
    path = _expand(Path(user_path))
    if path.exists() or path.is_absolute():
        return path
    shipped = shipped_checkpoints()
    tried = [Path.cwd() / path]
    places = [(root, path) for root in checkpoint_dirs(environ)] + [(shipped, path)]
    if len(path.parts) > 1 and path.parts[0] == "checkpoints":
        places.append((shipped, Path(*path.parts[1:])))
    for root, name in places:
        candidate = root / name
        if candidate.exists():
            return candidate
        tried.append(candidate)
    names = ", ".join(p.name for p in list_checkpoints(shipped, max_depth=1)) or "none found"
    raise CheckpointError(
        f"No checkpoint at {str(user_path)!r}: the path does not exist. Looked in: "
        f"{', '.join(str(t) for t in dict.fromkeys(tried))}. Give the path of a checkpoint folder, the name "
        f"of a shipped one ({names}; in {shipped}), or add the folder holding yours to {CHECKPOINT_DIRS_ENV}."
    )


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
