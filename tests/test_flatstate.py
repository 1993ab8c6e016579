"""sat_core.training.state: nested training state through safetensors + JSON and back, exactly."""

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from sat_core.training.state import flatten_state, unflatten_state
from sat_core.io import save_tensors_atomic, write_json_atomic
from tests.test_checkpoint import states_equal


def adam_run(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, amsgrad=True)
    return model, optimizer


def adam_steps(model: nn.Module, optimizer: torch.optim.Optimizer, n: int, seed: int) -> None:
    data = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(4, 6, generator=data)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()


def through_disk(obj, tmp_path: Path):
    """flatten -> safetensors + JSON on disk -> read back -> unflatten."""
    from safetensors.torch import load_file

    tensors, skeleton = flatten_state(obj)
    save_tensors_atomic(tmp_path / "state.safetensors", tensors, {"kind": "test"})
    write_json_atomic(tmp_path / "state.json", skeleton)
    return unflatten_state(load_file(tmp_path / "state.safetensors"), json.loads((tmp_path / "state.json").read_text()))


def test_adam_resume_is_bit_identical(tmp_path: Path) -> None:
    model, optimizer = adam_run()
    adam_steps(model, optimizer, 3, seed=1)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 3}
    restored = through_disk(state, tmp_path)
    assert set(restored["optimizer"]["state"]) == {0, 1, 2, 3}  # int keys stay ints
    assert restored["optimizer"]["state"][0]["step"].dtype == optimizer.state_dict()["state"][0]["step"].dtype

    fresh_model, fresh_optimizer = adam_run(seed=99)  # different initial weights, overwritten below
    fresh_model.load_state_dict(restored["model"])
    fresh_optimizer.load_state_dict(restored["optimizer"])
    adam_steps(model, optimizer, 4, seed=2)
    adam_steps(fresh_model, fresh_optimizer, 4, seed=2)
    assert states_equal(model.state_dict(), fresh_model.state_dict())
    exp_avg = lambda opt: opt.state_dict()["state"][2]["exp_avg"]  # noqa: E731
    assert torch.equal(exp_avg(optimizer), exp_avg(fresh_optimizer))


def test_rng_states_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    generator = np.random.default_rng(5)
    state = {
        "torch": torch.get_rng_state(),
        "numpy_legacy": np.random.get_state(),  # tuple with a uint32 array
        "numpy_generator": generator.bit_generator.state,  # dict with 128-bit ints
        "python": random.getstate(),  # nested tuples of ints and None
    }
    restored = through_disk(state, tmp_path)
    expected = (torch.rand(3), np.random.rand(3), generator.random(3), random.random())
    torch.set_rng_state(restored["torch"])
    np.random.set_state(restored["numpy_legacy"])
    generator.bit_generator.state = restored["numpy_generator"]
    random.setstate(restored["python"])
    again = (torch.rand(3), np.random.rand(3), generator.random(3), random.random())
    assert torch.equal(expected[0], again[0])
    assert np.array_equal(expected[1], again[1]) and np.array_equal(expected[2], again[2])
    assert expected[3] == again[3]


def test_flatten_preserves_types_exactly() -> None:
    obj = {
        1: torch.arange(4, dtype=torch.int16),
        "1": torch.tensor(True),
        (2, "x"): [1.5, float("inf"), float("nan"), None, True, "s"],
        "arr": np.arange(6, dtype=np.float16).reshape(2, 3),
        "scalar": np.int64(7),
        "nested": {"t": (torch.zeros(2, 0), torch.tensor(3.0, dtype=torch.bfloat16))},
    }
    tensors, skeleton = flatten_state(obj)
    skeleton = json.loads(json.dumps(skeleton, allow_nan=False))  # strict JSON
    back = unflatten_state(tensors, skeleton)
    assert list(back) == [1, "1", (2, "x"), "arr", "scalar", "nested"]
    assert torch.equal(back[1], obj[1]) and back[1].dtype == torch.int16
    assert back["1"].dtype == torch.bool
    floats = back[(2, "x")]
    assert floats[:2] == [1.5, float("inf")] and np.isnan(floats[2]) and floats[3:] == [None, True, "s"]
    assert back["arr"].dtype == np.float16 and np.array_equal(back["arr"], obj["arr"])
    assert type(back["scalar"]) is np.int64 and back["scalar"] == 7
    assert isinstance(back["nested"]["t"], tuple) and back["nested"]["t"][1].dtype == torch.bfloat16
    with pytest.raises(TypeError, match="cannot store a object"):
        flatten_state({"x": object()})
