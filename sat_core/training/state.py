"""A run's resumable state: nested training state (optimizer state, RNG states, counters) <-> flat tensors + a
JSON skeleton, the RNGs' states as JSON, and putting back ``last/`` when a kill landed inside its swap.

The trainer stores resumable state as safetensors + JSON like everything else: nothing is pickled.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sat_core.errors import SatError
from sat_core.paths import CONFIG_FILE, WEIGHTS_FILE

STATE_TENSORS, STATE_JSON = "state.safetensors", "state.json"


def flatten_state(obj: Any) -> tuple[dict[str, torch.Tensor], Any]:
    """Split a nested structure into flat tensors and a JSON-serialisable skeleton.

    Handles dicts (any hashable JSON-like keys, int keys kept as ints), lists, tuples, tensors,
    numpy arrays and scalars, Python numbers, strings, bools and None. ``unflatten_state`` inverts it.
    """
    tensors: dict[str, torch.Tensor] = {}
    return tensors, _encode(obj, "state", tensors)


def _encode(obj: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        key = _unused_key(path, tensors)
        tensors[key] = obj
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError(f"{path}: numpy arrays of Python objects cannot be stored")
        raw = torch.from_numpy(np.ascontiguousarray(obj).reshape(-1).view(np.uint8).copy())
        key = _unused_key(path, tensors)
        tensors[key] = raw  # raw bytes: exact for every numpy dtype, incl. uint32 RNG keys
        return {"__ndarray__": key, "dtype": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return {"__npscalar__": obj.dtype.str, "value": _encode(obj.item(), path, tensors)}
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}  # JSON has no nan/inf
    if isinstance(obj, dict):
        return {"__dict__": [[_encode(k, f"{path}.key", tensors), _encode(v, f"{path}.{k}", tensors)]
                             for k, v in obj.items()]}
    if isinstance(obj, list):
        return [_encode(v, f"{path}.{i}", tensors) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, f"{path}.{i}", tensors) for i, v in enumerate(obj)]}
    raise TypeError(f"{path}: cannot store a {type(obj).__name__} in a checkpoint")


def _unused_key(path: str, tensors: dict[str, torch.Tensor]) -> str:
    """The path itself, or path#n when another entry (e.g. key 1 and key "1") already took it."""
    key, n = path, 1
    while key in tensors:
        key, n = f"{path}#{n}", n + 1
    return key


def unflatten_state(tensors: dict[str, torch.Tensor], skeleton: Any) -> Any:
    """Rebuild the structure ``flatten_state`` split (tensor dtypes and int keys preserved)."""
    if isinstance(skeleton, list):
        return [unflatten_state(tensors, v) for v in skeleton]
    if not isinstance(skeleton, dict):
        return skeleton
    if "__tensor__" in skeleton:
        return tensors[skeleton["__tensor__"]]
    if "__ndarray__" in skeleton:
        raw = tensors[skeleton["__ndarray__"]].numpy()
        return raw.view(np.dtype(skeleton["dtype"])).reshape(skeleton["shape"]).copy()
    if "__npscalar__" in skeleton:
        return np.dtype(skeleton["__npscalar__"]).type(unflatten_state(tensors, skeleton["value"]))
    if "__float__" in skeleton:
        return float(skeleton["__float__"])
    if "__tuple__" in skeleton:
        return tuple(unflatten_state(tensors, v) for v in skeleton["__tuple__"])
    if "__dict__" in skeleton:
        return {unflatten_state(tensors, k): unflatten_state(tensors, v) for k, v in skeleton["__dict__"]}
    raise ValueError(f"Unknown entry in a state skeleton: {sorted(skeleton)}")


def saved_world(last: Path) -> int | None:
    """How many processes trained the run whose ``last/`` this is (None: saved before it was kept)."""
    require_state(last)
    return json.loads((last / STATE_JSON).read_text()).get("world")


# What a run folder holds that a new run would replace; log.jsonl is set aside as log.previous.jsonl instead.
RUN_FILES = ("train_config.json", "last", "best", "log.jsonl", "steps.csv", "tb")


def earlier_run(run_dir: Path) -> list[str]:
    """The names of an earlier run's files and folders in ``run_dir`` (none: a fresh or missing folder)."""
    return [name for name in RUN_FILES if (run_dir / name).exists()]


def clear_earlier_run(run_dir: Path) -> bool:
    """Remove an earlier run's checkpoints and step logs from ``run_dir``, keeping its log as log.previous.jsonl
    (mixed with the new epochs it would misreport the run); True when there was one."""
    found = earlier_run(run_dir)
    for name in found:
        path = run_dir / name
        if name == "log.jsonl":
            path.replace(run_dir / "log.previous.jsonl")
        elif path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return bool(found)


def require_state(last: Path) -> None:
    """Refuse --resume before any slow work when ``last/`` holds no resumable state."""
    _recover_swap(last)
    if not (last / STATE_JSON).is_file() or not (last / CONFIG_FILE).is_file():
        raise SatError(f"{last} holds no resumable state ({STATE_JSON} missing): the run stopped before its "
                       "first checkpoint. Start a new run instead of --resume.")


def _recover_swap(last: Path) -> None:
    """Put back the newest complete checkpoint when a kill landed inside a swap of ``last/``.

    ``save_checkpoint`` moves the old folder to ``.last.*.old`` and then renames the finished
    ``.last.*.tmp`` into place; a kill between the two leaves no ``last/`` but both folders on disk.
    A staging folder is complete once its state tensors (written last) are there.
    """
    if last.exists():
        return
    needed = (WEIGHTS_FILE, CONFIG_FILE, STATE_JSON, STATE_TENSORS)

    def position(folder: Path) -> tuple[int, int]:
        state = json.loads((folder / STATE_JSON).read_text())
        return state["step"], state["epoch"]  # the epoch-end save follows a mid-epoch one at the same step

    found = [p for p in last.parent.glob(f".{last.name}.*") if all((p / n).is_file() for n in needed)]
    if found:
        try:
            os.rename(max(found, key=position), last)
        except OSError:
            pass  # another DDP rank put it back first


def rng_tensors() -> dict[str, Any]:
    """torch's RNG states (CPU and every GPU) for the state's tensors."""
    return {"torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def rng_json() -> dict[str, Any]:
    """NumPy's and Python's RNG states for state.json."""
    return {"numpy_rng": numpy_state(), "python_rng": python_state()}


def restore_rngs(tensors: dict[str, Any], state: dict[str, Any]) -> None:
    """Put back what ``rng_tensors`` (unflattened) and ``rng_json`` saved."""
    torch.set_rng_state(tensors["torch_rng"])
    if tensors["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(tensors["cuda_rng"])
    name, keys, pos, has_gauss, cached = state["numpy_rng"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    random.setstate(python_rng(state["python_rng"]))


def numpy_state() -> list[Any]:
    """NumPy's global RNG state as JSON."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]


def python_state() -> list[Any]:
    """Python's global RNG state as JSON."""
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def python_rng(state: list[Any]) -> tuple:
    """``python_state``'s JSON back as ``random.setstate`` takes it."""
    return (state[0], tuple(state[1]), state[2])
