"""The on-disk preprocessing cache (``sat_core.data.cache``, ``python -m sat_core.prepro``, ``train --cache DIR``):
what it stores reads back bit for bit, another setting never reads a stale file, the ranks of a DDP run map the
files one writer wrote, and a cache that does not fit is refused with what to do."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch

from sat_core import prepro
from sat_core.config import ModelConfig, PreprocessConfig
from sat_core.data import cache
from sat_core.data.images import load_image, preprocess
from sat_core.data.imagestore import ImageStore
from sat_core.data.karpathy import load_karpathy
from sat_core.errors import SatError
from sat_core.io import save_tensors_atomic
from tests.fixtures_world import REPO_ROOT, make_dataset, python_module, subprocess_env, train_args

CFG = PreprocessConfig(image_size=32)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    data_json, images = make_dataset(root)
    return data_json, images, load_karpathy(data_json, images)


def _fake_encode(images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """A stand-in encoder: fp16 values that use the whole range, so a lost bit shows."""
    x = images.float()  # (b, 3, S, S)
    feats = torch.stack([x.mean(1), x.std(1) / 3 - 7.25], -1).flatten(1, 2) / 17  # (b, S·S, 2)
    return feats.half(), (images.shape[2], images.shape[3])


def _files(folder: Path) -> dict[str, tuple[int, int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_store_round_trips_images_and_annotations_bit_exactly(tiny, tmp_path):
    _, _, data = tiny
    disk = cache.image_store(tmp_path, data, CFG, splits=None, progress=False, say=lambda _: None)
    ram = ImageStore(data, CFG, progress=False)
    assert disk.images.dtype == torch.uint8 and disk.images.shape == (len(data.images), 3, 32, 32)
    assert torch.equal(disk.images, ram.images) and disk.row_of == ram.row_of
    assert torch.equal(disk.rows(1, 4), ram.images[1:4])  # the plain-read path of a sequential pass
    for index in disk.row_of:  # the pixels preprocess normalises, unrounded
        reference, _ = preprocess(load_image(data.images[index].path), CFG)  # (3, S, S)
        pixels = reference * torch.tensor(CFG.std).view(3, 1, 1) + torch.tensor(CFG.mean).view(3, 1, 1)
        assert torch.equal(disk.get(index), (pixels * 255).round().to(torch.uint8))

    written = cache.annotation_cache(disk, {"encoder": "fake"}, _fake_encode, chunk=3, say=lambda _: None)
    expected, grid = _fake_encode(ram.images)
    assert written.grid == grid and torch.equal(written.tensor, expected)
    again = cache.annotation_cache(disk, {"encoder": "fake"}, _no_encoding, chunk=3, say=lambda _: None)
    assert torch.equal(again.tensor, expected) and again.path == written.path
    raw = np.load(written.path, allow_pickle=False)  # a plain .npy file any numpy reads
    assert raw.dtype == np.float16 and np.array_equal(raw, expected.numpy())


def _no_encoding(images: torch.Tensor):
    raise AssertionError("the encoder ran again although its annotations were on disk")


def test_another_setting_gives_another_key_never_a_stale_read(tiny, tmp_path):
    data_json, images, data = tiny
    quiet = {"splits": None, "progress": False, "say": lambda _: None}
    first = cache.image_store(tmp_path, data, CFG, **quiet)
    assert cache.image_store(tmp_path, data, CFG, **quiet).folder == first.folder  # the same settings: reused
    bigger = cache.image_store(tmp_path, data, PreprocessConfig(image_size=48), **quiet)
    assert bigger.folder != first.folder and bigger.images.shape[-1] == 48
    other_norm = cache.image_store(tmp_path, data, PreprocessConfig(image_size=32, mean=(0.5, 0.5, 0.5)), **quiet)
    assert other_norm.folder not in (first.folder, bigger.folder)

    a = cache.annotation_path(first, {"encoder": "small", "weights": "aaa"})[0]
    assert a == cache.annotation_path(first, {"encoder": "small", "weights": "aaa"})[0]
    assert a != cache.annotation_path(first, {"encoder": "small", "weights": "aab"})[0]
    assert a != cache.annotation_path(first, {"encoder": "efficientnet_lite0", "weights": "aaa"})[0]
    assert a != cache.annotation_path(bigger, {"encoder": "small", "weights": "aaa"})[0]

    from sat_core.models.encoder import Encoder  # the identity of a real encoder: options and frozen weights

    config = ModelConfig(small_channels=(8, 16, 16), feature_dim=16, pretrained=True)
    torch.manual_seed(0)
    one, same = Encoder(config), Encoder(config)
    same.load_state_dict(one.state_dict())
    torch.manual_seed(1)
    other = Encoder(config)
    assert cache.encoder_identity(config, one) == cache.encoder_identity(config, same)
    assert cache.encoder_identity(config, one) != cache.encoder_identity(config, other)
    with torch.no_grad():
        same.body.stages[0][1].running_mean.add_(1e-3)  # a batch-norm statistic is part of the weights
    assert cache.encoder_identity(config, one) != cache.encoder_identity(config, same)

    # An image rewritten in place (same name, new pixels) gives another key: the old rows are not read for it.
    copy = tmp_path / "copy"
    shutil.copytree(images, copy / "world", copy_function=shutil.copy2)  # mtimes kept: the same files
    moved = load_karpathy(data_json, copy / "world")
    assert cache.image_store(tmp_path, moved, CFG, **quiet).folder == first.folder
    victim = moved.images[0].path
    load_image(moved.images[1].path).save(victim)
    changed = cache.image_store(tmp_path, moved, CFG, **quiet)
    assert changed.folder != first.folder
    assert torch.equal(changed.get(0), changed.get(1)) and not torch.equal(first.get(0), first.get(1))


DiskUsage = namedtuple("DiskUsage", "total used free")


def test_a_cache_that_does_not_fit_is_refused_with_what_to_do(tiny, tmp_path, monkeypatch):
    _, _, data = tiny
    monkeypatch.setattr(shutil, "disk_usage", lambda path: DiskUsage(2**40, 2**40 - 5 * 2**20, 5 * 2**20))
    with pytest.raises(SatError) as err:
        cache.image_store(tmp_path / "cache", data, CFG, splits=None, progress=False, say=lambda _: None)
    message = str(err.value)
    for words in ("does not fit", f"{len(data.images)} images at 32 px", "0.00 GiB are free", str(tmp_path / "cache"),
                  "--cache a folder on a disk with", "drop --cache"):
        assert words in message, message
    assert not list((tmp_path / "cache").rglob("*.npy")), "a refused cache left a file behind"
    assert not [p for p in (tmp_path / "cache").iterdir() if ".tmp-" in p.name], "a staging folder was left behind"


def test_a_two_process_gloo_run_maps_the_cache_prepro_wrote_and_rewrites_nothing(tiny, tmp_path):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available in this torch build")
    data_json, images, _ = tiny
    from sat_core.models.encoder import Encoder

    torch.manual_seed(123)  # a pretrained small encoder: frozen, so its annotations are cached too
    weights = tmp_path / "encoder.safetensors"
    save_tensors_atomic(weights, Encoder(ModelConfig(small_channels=(8, 16, 16), feature_dim=16)).state_dict())
    store = tmp_path / "cache"
    flags = ("--epochs", "1", "--encoder-weights", str(weights), "--cache", str(store))
    assert prepro.main(train_args(data_json, images, tmp_path / "unused", *flags)) == 0
    written = _files(store)
    assert sorted(Path(name).suffix for name in written) == [".json", ".json", ".npy", ".npy"], written

    cmd = python_module("torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2", "--master_addr",
                        "127.0.0.1", "--master_port", str(_free_port()), "-m", "sat_core.train",
                        *train_args(data_json, images, tmp_path / "run", *flags))
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # A rank whose key differed would find no file, write one (local rank 0) or wait for ever (rank 1).
    assert _files(store) == written, "a rank rewrote or added cache files"
    assert f"images: 8 at 32 px memory-mapped from {store}" in proc.stdout
    assert "annotations of 8 images" in proc.stdout and "cache: decoding" not in proc.stdout
    assert "cache: writing" not in proc.stdout and "waiting" not in proc.stdout


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_writer_reserves_the_whole_file_before_writing_a_row(tmp_path):
    out = cache.NpyWriter(tmp_path / "x.npy", np.uint8, (5, 3, 4, 4), "five rows", "or not")
    assert os.stat(tmp_path / "x.npy").st_size == out.offset + 5 * 48
    out.write(2, np.full((1, 3, 4, 4), 7, np.uint8))
    out.close()
    back = np.load(tmp_path / "x.npy", allow_pickle=False)
    assert back.shape == (5, 3, 4, 4) and (back[2] == 7).all() and not back[[0, 1, 3, 4]].any()


def test_prune_deletes_stores_of_changed_images_and_killed_writes_and_nothing_a_run_can_read(tiny, tmp_path, capsys):
    data_json, images, _ = tiny
    shutil.copytree(images, tmp_path / "world", copy_function=shutil.copy2)
    data = load_karpathy(data_json, tmp_path / "world")
    folder, quiet = tmp_path / "cache", {"splits": None, "progress": False, "say": lambda _: None}
    old = cache.image_store(folder, data, CFG, **quiet)
    cache.annotation_cache(old, {"encoder": "fake"}, _fake_encode, chunk=3, say=lambda _: None)
    bigger = cache.image_store(folder, data, PreprocessConfig(image_size=48), **quiet)
    assert cache.stale_entries(folder) == []  # both read by a run with their settings

    load_image(data.images[1].path).save(data.images[0].path)  # the world written anew: its files changed
    current = cache.image_store(folder, data, CFG, **quiet)
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()
    killed = folder / f"images-0123.tmp-{host}-{dead.pid}"
    killed.mkdir()
    (killed / "images.npy").write_bytes(b"x" * 1000)
    half_written = current.folder / f"annotations-4567.npy.tmp-{host}-{dead.pid}"
    half_written.write_bytes(b"x" * 500)
    writing = folder / f"images-89ab.tmp-{host}-{os.getpid()}"  # a writer that runs: never touched
    writing.mkdir()
    unknown = folder / "images-cdef"  # a store whose index does not name its images' folder: left alone
    unknown.mkdir()
    (unknown / cache.INDEX).write_text(json.dumps({"key": {"files": "0"}, "paths": []}))
    shutil.copytree(tmp_path / "world", tmp_path / "moved", copy_function=shutil.copy2)
    moved = cache.image_store(folder, load_karpathy(data_json, tmp_path / "moved"), PreprocessConfig(image_size=40),
                              **quiet)
    shutil.rmtree(tmp_path / "moved")  # its images' folder gone (moved again, perhaps): the store is left alone

    stale = dict(cache.stale_entries(folder))
    assert set(stale) == {old.folder, bigger.folder, killed, half_written}
    assert stale[old.folder] == f"its images in {(tmp_path / 'world').resolve()} changed after it was written"
    assert stale[killed] == stale[half_written] == "left by a writer that was killed"
    sizes = sum(p.stat().st_size for f in (old.folder, bigger.folder) for p in f.rglob("*") if p.is_file())

    assert prepro.main(["--cache", str(folder), "--prune"]) == 0
    said = capsys.readouterr().out
    assert f"cache: removed {old.folder} (" in said and f"cache: removed {half_written} (" in said
    assert f"prepro: {cache.gib(sizes + 1500)} freed in {folder}" in said
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [current.folder.name, writing.name, unknown.name, moved.folder.name])
    assert sorted(p.name for p in current.folder.iterdir()) == sorted([cache.INDEX, "images.npy"])
    assert cache.image_store(folder, data, CFG, splits=None, progress=False,
                             say=_no_writing).folder == current.folder  # mapped again, not rewritten

    assert prepro.main(["--cache", str(folder), "--prune"]) == 0
    assert f"prepro: nothing in {folder} is stale" in capsys.readouterr().out
    assert prepro.main(["--prune"]) == 2
    assert "--prune needs --cache DIR, an existing cache folder (given: none)" in capsys.readouterr().err


def _no_writing(message: str) -> None:
    raise AssertionError(f"the cache was written again: {message}")
