"""Files written so a crash never leaves half a file under the final name; safetensors read and write.

Every write goes to a temporary name next to the target, is fsynced, then renamed into place.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import torch

from sat_core.errors import CheckpointError


def fsync_dir(directory: Path) -> None:
    """Make a rename durable: fsync the directory entry (a no-op where the OS cannot)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Any) -> Path:
    """Call ``write(tmp_path)``, fsync, then rename over ``path``; the temp file never survives."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        write(tmp)
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    text = json.dumps(obj, indent=2) + "\n"  # serialise first: a TypeError must not touch the disk
    return atomic_write(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _storable(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors, none sharing memory (safetensors refuses shared storage)."""
    out, seen = {}, set()
    for key, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{key!r} is a {type(tensor).__name__}, not a tensor")
        tensor = tensor.detach().to("cpu").contiguous()
        ptr = tensor.untyped_storage().data_ptr()
        if tensor.numel() and ptr in seen:
            tensor = tensor.clone()  # tied weights: store each name separately
        seen.add(ptr)
        out[key] = tensor
    return out


def save_tensors_atomic(
    path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> Path:
    """Write ``tensors`` to a .safetensors file atomically (metadata: str -> str)."""
    from safetensors.torch import save_file

    storable = _storable(tensors)
    return atomic_write(Path(path), lambda tmp: save_file(storable, str(tmp), metadata=metadata))


def read_tensors(path: str | Path, *, device: str = "cpu") -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read a .safetensors file; a missing, truncated or corrupt file raises CheckpointError."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"The weights file {str(path)!r} does not exist.")
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as exc:  # safetensors raises SafetensorError / OSError with terse texts
        raise CheckpointError(
            f"The weights file {str(path)!r} is truncated or corrupt and cannot be read as safetensors "
            f"({exc}). Copy or download the checkpoint again."
        ) from exc
    return tensors, metadata
