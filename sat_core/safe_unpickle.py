"""Read a ``torch.save`` file (zip format) into tensors and plain containers, running none of its code.

Why this is safe
----------------
A pickle is a small program: its GLOBAL opcodes name any importable callable (``os.system``,
``builtins.exec``, ``subprocess.Popen`` …) and its REDUCE opcode calls it. The only way a pickle can
reach a callable is through ``Unpickler.find_class`` (GLOBAL, STACK_GLOBAL and the extension-registry
opcodes all go through it) or through ``persistent_load``. ``SafeUnpickler`` overrides both:

- ``find_class`` never imports anything. It answers from a fixed table of our own functions that
  build tensors from storages, plain containers (``OrderedDict``, ``set``, a ``defaultdict`` read as a
  plain ``dict``) and dtype markers. A class under ``torch.nn.modules``, ``torch.optim``,
  ``torchvision.models`` or the tutorial's own ``models`` module is answered with an inert
  ``ModuleRecord`` subclass that only stores the state the pickle hands it (``__dict__`` with
  ``_parameters``, ``_buffers``, ``_modules`` …): the real class is never imported, built or called.
  Every other global is refused with a ``CheckpointError`` naming it, before anything is called.
- ``persistent_load`` only accepts torch's ``('storage', type, key, location, numel)`` records and
  reads the raw bytes of ``data/<key>`` from the zip into a tensor of the named dtype.

So every callable a crafted file can reach is one of the functions below or a harmless container
constructor, and the result holds nothing but tensors, numbers, strings, ``None``, containers and
``ModuleRecord`` objects. ``torch.load`` is not used (its ``weights_only=True`` mode refuses whole
modules, and its default mode would run the file's code).
"""

from __future__ import annotations

import io
import zipfile
from collections import OrderedDict
from pathlib import Path
from pickle import Unpickler, UnpicklingError
from typing import Any

import torch

from sat_core.errors import CheckpointError

# Modules whose classes become inert records: torch's layers and optimizers, torchvision's models, and
# the tutorial's own models.py (imported there as ``models``; ``__main__`` when a script defined them).
RECORD_MODULES = ("torch.nn.modules.", "torch.nn.parallel.", "torch.optim.", "torchvision.models.")
RECORD_EXACT_MODULES = ("models", "__main__")

_STORAGE_DTYPES = {
    "FloatStorage": torch.float32, "DoubleStorage": torch.float64, "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool, "UntypedStorage": torch.uint8,
}
_DTYPES = {str(d).removeprefix("torch."): d for d in _STORAGE_DTYPES.values()}


class ModuleRecord:
    """The pickled state of an ``nn.Module`` (or optimizer) without the class: plain data only.

    ``class_path`` says which class the file named (e.g. ``torch.nn.modules.linear.Linear``);
    ``state`` is what the pickle set (for a module: its ``__dict__`` with ``_parameters`` …).
    """

    class_path = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> "ModuleRecord":
        record = object.__new__(cls)
        record.__dict__["state"] = {}
        record.__dict__["args"] = args  # NEWOBJ/REDUCE arguments, kept, never interpreted
        return record

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass  # REDUCE calls the class: nothing to do beyond __new__

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            for part in state:
                if isinstance(part, dict):
                    self.state.update(part)
        elif isinstance(state, dict):
            self.state.update(state)
        else:
            self.state["__state__"] = state

    def __repr__(self) -> str:
        return f"<ModuleRecord {self.class_path}>"

    @property
    def class_name(self) -> str:
        return self.class_path.rsplit(".", 1)[-1]

    def children(self) -> dict[str, Any]:
        return dict(self.state.get("_modules") or {})


_RECORD_CLASSES: dict[str, type[ModuleRecord]] = {}


def _record_class(path: str) -> type[ModuleRecord]:
    """One inert subclass per class name in the file, so records say what they stand for."""
    if path not in _RECORD_CLASSES:
        _RECORD_CLASSES[path] = type("Record", (ModuleRecord,), {"class_path": path})
    return _RECORD_CLASSES[path]


class _StorageType:
    """Stands for ``torch.FloatStorage`` & co. in storage records: only its dtype is used."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


# ---- the only callables a file can reach -----------------------------------------------------------

def _rebuild_tensor(storage: Any, offset: int, size: tuple, stride: tuple, *_ignored: Any) -> torch.Tensor:
    """torch._utils._rebuild_tensor(_v2): a view of a storage read by ``persistent_load``."""
    if not isinstance(storage, torch.Tensor) or storage.dim() != 1:
        raise UnpicklingError("a tensor must be built from a storage of the file")
    if not all(isinstance(v, int) for v in (offset, *size, *stride)):
        raise UnpicklingError("a tensor's offset, size and stride must be integers")
    needed = offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1 if all(size) else 0
    if offset < 0 or any(s < 0 for s in stride) or needed > storage.numel():
        raise UnpicklingError("a tensor reaches past its storage")
    return storage.as_strided(tuple(size), tuple(stride), offset)


def _rebuild_parameter(data: Any, *_ignored: Any) -> torch.Tensor:
    """torch._utils._rebuild_parameter(_with_state): the parameter's data as a plain tensor."""
    if not isinstance(data, torch.Tensor):
        raise UnpicklingError("a parameter must wrap a tensor")
    return data


def _plain_dict(*_factory: Any) -> dict:
    """collections.defaultdict(factory): read as a plain dict; the factory is never called."""
    return {}


def _ordered_dict(*args: Any) -> OrderedDict:
    if args and not isinstance(args[0], (list, tuple, dict)):
        raise UnpicklingError("OrderedDict takes a list of pairs")
    return OrderedDict(*args[:1])


def _plain_set(items: Any = ()) -> set:
    if not isinstance(items, (list, tuple, set)):
        raise UnpicklingError("set takes a list")
    return set(items)


def _device_name(kind: Any, index: Any = None) -> str:
    """torch.device(kind, index) as its name: where the file was saved from, never used."""
    if not isinstance(kind, str) or not (index is None or isinstance(index, int)):
        raise UnpicklingError("a device is a name and an index")
    return kind if index is None else f"{kind}:{index}"


def _plain_tuple(items: Any = ()) -> tuple:  # torch.Size
    if not isinstance(items, (list, tuple)):
        raise UnpicklingError("a size takes a list")
    return tuple(items)


_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("collections", "OrderedDict"): _ordered_dict,
    ("collections", "defaultdict"): _plain_dict,
    ("builtins", "set"): _plain_set,
    ("builtins", "frozenset"): _plain_set,
    ("builtins", "dict"): _plain_dict,  # only ever a defaultdict's factory
    ("torch", "Size"): _plain_tuple,
    ("torch", "device"): _device_name,
    **{("torch", name): _StorageType(dtype) for name, dtype in _STORAGE_DTYPES.items()},
    **{("torch", name): dtype for name, dtype in _DTYPES.items()},
}


_PY2_MODULES = {"__builtin__": "builtins"}


class SafeUnpickler(Unpickler):
    """An unpickler that can only build tensors, containers and ``ModuleRecord``s (see the module doc)."""

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, source: str) -> None:
        super().__init__(io.BytesIO(data))
        self._archive, self._prefix, self._source = archive, prefix, source
        self._storages: dict[str, torch.Tensor] = {}

    def find_class(self, module: str, name: str) -> Any:
        module = _PY2_MODULES.get(module, module)  # protocol 2 names builtins as Python 2 did
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if name.isidentifier() and (module.startswith(RECORD_MODULES) or module in RECORD_EXACT_MODULES):
            return _record_class(f"{module}.{name}")
        raise CheckpointError(
            f"{self._source!r} asks to run {module}.{name} while loading, which a checkpoint never needs; "
            "it was refused and nothing in the file was run. Only tensors, plain containers and model "
            "layers can be read from it: the file may have been tampered with."
        )

    def persistent_load(self, pid: Any) -> torch.Tensor:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str)):
            raise UnpicklingError(f"unsupported persistent record {str(pid)[:80]}")
        _, kind, key, _location, numel = pid
        if key not in self._storages:
            try:
                raw = self._archive.read(f"{self._prefix}data/{key}")
            except KeyError:
                raise UnpicklingError(f"storage data/{key} is missing from the archive") from None
            itemsize = torch.empty((), dtype=kind.dtype).element_size()
            if not isinstance(numel, int) or len(raw) < numel * itemsize:
                raise UnpicklingError(f"storage data/{key} is shorter than its {numel} elements")
            buffer = bytearray(raw[: numel * itemsize])
            self._storages[key] = (torch.frombuffer(buffer, dtype=kind.dtype) if numel
                                   else torch.empty(0, dtype=kind.dtype))
        return self._storages[key]


def safe_load(path: str | Path) -> Any:
    """The object a ``torch.save`` zip file holds, with modules as ``ModuleRecord``s; CheckpointError else."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"No file at {str(path)!r}: give the path of the checkpoint file.")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{str(path)!r} is not a torch.save zip archive (files written by torch 1.6 or later are). "
            "Older torch files and raw pickles are not read, since reading them safely is not supported."
        )
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            pickles = [n for n in names if n.endswith("data.pkl") and n.count("/") == 1]
            if len(pickles) != 1:
                raise CheckpointError(f"{str(path)!r} is a zip archive but not a torch.save file (no data.pkl).")
            prefix = pickles[0][: -len("data.pkl")]
            order = archive.read(prefix + "byteorder").decode() if prefix + "byteorder" in names else "little"
            if order != "little":
                raise CheckpointError(f"{str(path)!r} was written on a big-endian machine; this is not supported.")
            return SafeUnpickler(archive.read(pickles[0]), archive, prefix, str(path)).load()
    except CheckpointError:
        raise
    except (UnpicklingError, zipfile.BadZipFile, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, RuntimeError, OSError) as exc:
        raise CheckpointError(f"{str(path)!r} is damaged or not a torch checkpoint ({exc}).") from exc


def flat_state(obj: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """The state dict of a ``ModuleRecord`` tree (parameters and persistent buffers, dotted names).

    A plain ``{name: tensor}`` dict (a saved ``state_dict()``) is returned as it is.
    """
    if isinstance(obj, dict):
        if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
            raise CheckpointError("expected a module or a state dict (names -> tensors)")
        return {prefix + k: v for k, v in obj.items()}
    if not isinstance(obj, ModuleRecord):
        raise CheckpointError(f"expected a module, found {type(obj).__name__}")
    state = obj.state
    out: dict[str, torch.Tensor] = {}
    skip = state.get("_non_persistent_buffers_set") or set()
    for group in ("_parameters", "_buffers"):
        for name, tensor in (state.get(group) or {}).items():
            if tensor is not None and name not in skip:
                out[prefix + name] = tensor
    for name, child in obj.children().items():
        if child is not None:
            out.update(flat_state(child, f"{prefix}{name}."))
    return out
