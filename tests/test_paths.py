"""sat_core.paths: typed checkpoint paths stay inside the allowed folders; listing checkpoints."""

from pathlib import Path

import pytest

from sat_core.checkpoint import load_checkpoint
from sat_core.errors import CheckpointError
from sat_core.paths import CONFIG_FILE, WEIGHTS_FILE, list_checkpoints, resolve_checkpoint_path
from tests.test_checkpoint import StandIn, save, stand_in  # noqa: F401  (stand_in is a fixture)


def test_resolve_inside_and_outside_roots(tmp_path: Path, stand_in: StandIn, monkeypatch) -> None:
    root, outside = tmp_path / "checkpoints", tmp_path / "elsewhere"
    good = save(root / "run1", stand_in)
    secret = save(outside / "secret", stand_in)
    monkeypatch.chdir(tmp_path)
    assert resolve_checkpoint_path(str(good), [root]) == good.resolve()
    assert resolve_checkpoint_path("run1", [root]) == good.resolve()  # relative to a root
    assert resolve_checkpoint_path("checkpoints/run1/", [root]) == good.resolve()  # relative to cwd
    (root / "link_out").symlink_to(secret)
    escapes = [str(secret), "../elsewhere/secret", str(root / ".." / "elsewhere" / "secret"), "link_out",
               str(root / "link_out" / WEIGHTS_FILE)]
    for attempt in escapes:
        with pytest.raises(CheckpointError, match="outside the folders") as caught:
            resolve_checkpoint_path(attempt, [root])
        assert str(root.resolve()) in str(caught.value)
        with pytest.raises(CheckpointError, match="outside the folders"):
            load_checkpoint(attempt, allowed_roots=[root])
    assert isinstance(load_checkpoint("run1", allowed_roots=[root]).model, StandIn)
    (root / "linked_files").mkdir()
    (root / "linked_files" / CONFIG_FILE).write_bytes((good / CONFIG_FILE).read_bytes())
    (root / "linked_files" / WEIGHTS_FILE).symlink_to(secret / WEIGHTS_FILE)
    for attempt in ("linked_files", str(root / "linked_files" / CONFIG_FILE)):
        with pytest.raises(CheckpointError, match="holds model.safetensors, a link to"):
            load_checkpoint(attempt, allowed_roots=[root])
    with pytest.raises(CheckpointError, match="No checkpoint path given"):
        resolve_checkpoint_path("  ", [root])
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint("run2", allowed_roots=[root])


def test_list_checkpoints(tmp_path: Path, stand_in: StandIn) -> None:
    a = save(tmp_path / "runs" / "a" / "best", stand_in)
    b = save(tmp_path / "runs" / "b", stand_in)
    save(tmp_path / "runs" / "x" / "y" / "z" / "too_deep", stand_in)
    (tmp_path / "runs" / "half").mkdir()
    (tmp_path / "runs" / "half" / CONFIG_FILE).write_text("{}")
    (tmp_path / "runs" / ".b.1234.tmp").mkdir()  # a staging folder from a crashed save
    (tmp_path / "runs" / ".b.1234.tmp" / CONFIG_FILE).write_text("{}")
    (tmp_path / "runs" / ".b.1234.tmp" / WEIGHTS_FILE).write_bytes(b"")
    assert list_checkpoints([tmp_path / "runs", tmp_path / "missing"]) == [a.resolve(), b.resolve()]
    assert list_checkpoints(tmp_path / "runs", max_depth=1) == [b.resolve()]
