"""Nested training state (optimizer state, RNG states, counters) <-> flat tensors + a JSON skeleton.

The trainer stores resumable state as safetensors + JSON like everything else: nothing is pickled.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch


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
