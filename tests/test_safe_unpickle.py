"""sat_core.safe_unpickle: torch.save files read as tensors and inert records; crafted files run nothing."""

from __future__ import annotations

import os
import pickle
import sys
import zipfile

import pytest
import torch
from torch import nn

from sat_core.errors import CheckpointError
from sat_core.safe_unpickle import ModuleRecord, flat_state, safe_load


def test_tensors_containers_and_modules_round_trip(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.LSTMCell(5, 6))
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model[0].weight.sum().backward()
    optimizer.step()
    obj = {"epoch": 3, "bleu-4": 0.25, "name": "x", "none": None, "pair": (1, [2.5, "y"]),
           "view": base[:, 1:3], "t": base.t(), "ints": torch.tensor([1, -2], dtype=torch.int32),
           "half": torch.randn(3, dtype=torch.float16), "flags": torch.tensor([True, False]),
           "model": model, "optimizer": optimizer}
    path = tmp_path / "file.pth"
    torch.save(obj, path)
    loaded = safe_load(path)
    assert {k: loaded[k] for k in ("epoch", "bleu-4", "name", "none", "pair")} == {
        "epoch": 3, "bleu-4": 0.25, "name": "x", "none": None, "pair": (1, [2.5, "y"])}
    for key in ("view", "t", "ints", "half", "flags"):
        assert loaded[key].dtype == obj[key].dtype and torch.equal(loaded[key], obj[key])
    record = loaded["model"]
    assert isinstance(record, ModuleRecord) and not isinstance(record, nn.Module)
    assert record.class_path == "torch.nn.modules.container.Sequential"
    assert record.children()["3"].class_name == "LSTMCell" and record.children()["2"].state["inplace"] is False
    state, expected = flat_state(record), model.state_dict()
    assert sorted(state) == sorted(expected)
    assert all(torch.equal(state[k], expected[k]) for k in expected)
    assert loaded["optimizer"].class_path == "torch.optim.sgd.SGD"


def test_devices_dtypes_and_sizes_are_plain_values(tmp_path):
    path = tmp_path / "meta.pth"
    torch.save({"where": torch.device("cuda", 1), "cpu": torch.device("cpu"), "dtype": torch.float16,
                "size": torch.Size([2, 3]), "bytes": torch.tensor([7, 255], dtype=torch.uint8)}, path)
    loaded = safe_load(path)
    assert (loaded["where"], loaded["cpu"], loaded["dtype"], loaded["size"]) == ("cuda:1", "cpu", torch.float16, (2, 3))
    assert loaded["bytes"].tolist() == [7, 255]


def _torch_zip(path, pickle_bytes: bytes) -> None:
    """A file laid out as torch.save writes it, with the given data.pkl."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle_bytes)
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")


def _call(module: str, name: str, arg: str) -> bytes:
    """A protocol-4 pickle calling module.name(arg): STACK_GLOBAL, TUPLE1, REDUCE."""
    def text(s: str) -> bytes:
        raw = s.encode()
        return b"\x8c" + bytes([len(raw)]) + raw

    return b"\x80\x04" + text(module) + text(name) + b"\x93" + text(arg) + b"\x85R."


class Exploit:
    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("module,name", [("os", "system"), ("posix", "system"), ("subprocess", "getoutput"),
                                         ("builtins", "exec"), ("builtins", "eval"), ("functools", "partial"),
                                         ("torch.nn.modules.linear", "Linear.__init__.__globals__"),
                                         ("torch", "load"), ("numpy", "load")])
def test_crafted_globals_are_refused_and_never_run(tmp_path, module, name):
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').close()" if name in ("exec", "eval") else f"touch {marker}"
    path = tmp_path / "evil.pth"
    _torch_zip(path, _call(module, name, code))
    with pytest.raises(CheckpointError) as exc:
        safe_load(path)
    assert f"{module}.{name}" in str(exc.value) and "nothing in the file was run" in str(exc.value)
    assert not marker.exists()


def test_torch_saved_exploit_is_refused(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "BEST_checkpoint_evil.pth.tar"
    torch.save({"epoch": 1, "encoder": nn.Linear(2, 2), "decoder": Exploit(marker)}, path)
    with pytest.raises(CheckpointError, match=r"posix\.system|os\.system"):
        safe_load(path)
    assert not marker.exists()


def test_raw_pickles_and_non_torch_files_are_refused(tmp_path):
    marker = tmp_path / "ran"
    raw = tmp_path / "raw.pkl"
    raw.write_bytes(pickle.dumps(Exploit(marker)))
    with pytest.raises(CheckpointError, match="not a torch.save zip archive"):
        safe_load(raw)
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="No file at"):
        safe_load(tmp_path / "missing.pth")
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(CheckpointError, match="not a torch.save file"):
        safe_load(other)


def test_layer_classes_are_recorded_without_importing_them(tmp_path):
    path = tmp_path / "record.pth"
    _torch_zip(path, _call("torchvision.models.no_such_module_xyz", "Thing", "arg"))
    record = safe_load(path)
    assert isinstance(record, ModuleRecord) and record.args == ("arg",)
    assert record.class_path == "torchvision.models.no_such_module_xyz.Thing"
    assert "torchvision.models.no_such_module_xyz" not in sys.modules


def test_damaged_storage_is_a_checkpoint_error(tmp_path):
    path = tmp_path / "t.pth"
    torch.save({"w": torch.ones(4)}, path)
    damaged = tmp_path / "damaged.pth"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(damaged, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            dst.writestr(item, data[:4] if "/data/" in item.filename else data)
    with pytest.raises(CheckpointError, match="damaged or not a torch checkpoint"):
        safe_load(damaged)
