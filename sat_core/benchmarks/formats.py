"""``python -m sat_core.bench formats``: the on-disk cache's format chosen by measurement. The same uint8 rows
(N images, 3 × S × S) written and read back as a numpy .npy file (memory-mapped), an HDF5 dataset (h5py, one
chunk a row) and an LMDB database (one key a row): seconds to write, file size, seconds to open, and a training
batch of 64 random rows read warm (in the page cache) and cold (the file's pages dropped from it first, with
``posix_fadvise``, which touches no other file), each the median of several batches. h5py and lmdb are not
dependencies of this project: a format whose package is missing is reported as such.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BATCH = 64


def _drop_from_page_cache(path: Path) -> None:
    for file in ([path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _rows(n: int, side: int, seed: int = 0) -> Callable[[int, int], np.ndarray]:
    """Rows start…stop−1 of a deterministic image-like array (smooth, so compressors would find something)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (3, side, side), dtype=np.uint8)
    return lambda start, stop: np.stack([np.roll(base, k, axis=2) for k in range(start, stop)])  # (b, 3, S, S)


def _npy(path: Path, n: int, side: int, rows) -> tuple[Callable[[], Any], Callable[[Any, list[int]], np.ndarray]]:
    from sat_core.data.cache import NpyWriter

    out = NpyWriter(path, np.uint8, (n, 3, side, side), "rows", "")
    for start in range(0, n, 256):
        out.write(start, rows(start, min(n, start + 256)))
    out.close()
    return (lambda: np.load(path, mmap_mode="r", allow_pickle=False)), (lambda a, idx: a[sorted(idx)])


def _hdf5(path: Path, n: int, side: int, rows):
    import h5py

    with h5py.File(path, "w") as f:
        d = f.create_dataset("images", (n, 3, side, side), dtype="uint8", chunks=(1, 3, side, side))
        for start in range(0, n, 256):
            d[start : min(n, start + 256)] = rows(start, min(n, start + 256))
    return (lambda: h5py.File(path, "r")["images"]), (lambda d, idx: d[sorted(idx)])


def _lmdb(path: Path, n: int, side: int, rows):
    import lmdb

    row_bytes = 3 * side * side
    env = lmdb.open(str(path), map_size=int(n * row_bytes * 1.5) + 2**24, subdir=True, lock=False)
    for start in range(0, n, 256):
        with env.begin(write=True) as txn:
            block = rows(start, min(n, start + 256))
            for k, row in enumerate(block):
                txn.put(f"{start + k:08d}".encode(), row.tobytes())
    env.sync()
    env.close()

    def read(e, idx: list[int]) -> np.ndarray:
        with e.begin(buffers=True) as txn:
            return np.stack([np.frombuffer(txn.get(f"{i:08d}".encode()), np.uint8) for i in idx]).reshape(
                len(idx), 3, side, side)

    return (lambda: lmdb.open(str(path), readonly=True, lock=False, subdir=True)), read


FORMATS = {"numpy memmap (.npy)": ("npy", _npy), "HDF5 (h5py)": ("h5", _hdf5), "LMDB": ("lmdb", _lmdb)}


def format_case(name: str, work: Path, n: int, side: int, repeats: int = 9) -> dict[str, Any]:
    suffix, make = FORMATS[name]
    path = work / f"rows.{suffix}"
    _remove(path)
    row = {"format": name, "rows": n, "side": side}
    try:
        started = time.perf_counter()
        opener, read = make(path, n, side, _rows(n, side))
        row["write_s"] = time.perf_counter() - started
    except ImportError as exc:
        return {**row, "note": f"not installed ({exc.name})"}
    row["size_gib"] = _size(path) / 2**30
    rng = np.random.default_rng(1)
    started = time.perf_counter()
    handle = opener()
    row["open_ms"] = 1000 * (time.perf_counter() - started)
    warm, cold = [], []
    for _ in range(repeats):
        _drop_from_page_cache(path)  # pages still mapped by a handle stay: read cold through a new one
        if hasattr(handle, "close"):
            handle.close()  # LMDB opens an environment once a process
        handle = opener()
        idx = rng.choice(n, BATCH, replace=False).tolist()
        started = time.perf_counter()
        read(handle, idx)
        cold.append(time.perf_counter() - started)
        started = time.perf_counter()
        read(handle, idx)  # the same rows again: in the page cache now
        warm.append(time.perf_counter() - started)
    row["warm_batch_ms"], row["cold_batch_ms"] = 1000 * statistics.median(warm), 1000 * statistics.median(cold)
    expected = _rows(n, side)(idx[0], idx[0] + 1)[0]
    row["exact"] = bool(np.array_equal(np.asarray(read(handle, [idx[0]]))[0], expected))
    _remove(path)
    return row


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def run_formats(work: Path, *, n: int = 4000, side: int = 224) -> list[dict[str, Any]]:
    work.mkdir(parents=True, exist_ok=True)
    return [format_case(name, work, n, side) for name in FORMATS]
