"""sat_core.io: atomic JSON and safetensors writes."""

import json
from pathlib import Path

import pytest

from sat_core.io import write_json_atomic


def test_write_json_atomic(tmp_path: Path) -> None:
    path = write_json_atomic(tmp_path / "a" / "state.json", {"step": 3})
    assert json.loads(path.read_text()) == {"step": 3}
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"step": 3}
    assert [p.name for p in path.parent.iterdir()] == ["state.json"]
