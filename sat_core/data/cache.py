"""The on-disk preprocessing cache (``--cache DIR``): images resized once (uint8) and a frozen encoder's annotations
(fp16), each a plain ``.npy`` file that every run, resume and DDP rank asking for the same content memory-maps.

    DIR/images-<key>/images.npy               uint8 (N, 3, S, S): one row for each path of index.json
    DIR/images-<key>/index.json               the key's parts, the paths, the images that could not be read
    DIR/images-<key>/annotations-<key>.npy    fp16 (N, L, D); (N, C, gh, gw) for --tune-blocks' frozen blocks
    DIR/images-<key>/annotations-<key>.json   the key's parts, the grid

A key hashes everything that decides a file's bytes: the image files (relative path, size, modification time),
the preprocessing (side, crop, mean, std) and, for annotations, the encoder (name, the options that pick its
output, a hash of its frozen weights) and the stage cached. A changed setting gives another key, so a stale file
is never read. A file is written under a temporary name, its space reserved first (a cache that cannot fit is
refused before any work, never skipped), and renamed once complete: a killed write leaves nothing that looks
complete. Of a node's DDP ranks, local rank 0 writes and the others wait; two nodes sharing the folder each
write, and the first rename wins. Readers map the files (``np.load(mmap_mode="c")``): the pages are the kernel's
page cache, shared by every process, read on demand. The format, numpy memmap, was chosen over HDF5 and LMDB by
measurement (``python -m sat_core.bench formats``; docs/BENCHMARKS.md).

Images changed after their store was written (a regenerated world) leave it unreadable by any run: ``prune``
deletes such stores, and what killed writers left (``python -m sat_core.prepro --cache DIR --prune``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sat_core.config import ModelConfig, PreprocessConfig
from sat_core.data.imagestore import ImageRows, decode_rows, wanted_images
from sat_core.data.karpathy import KarpathyData
from sat_core.errors import SatError
from sat_core.io import write_json_atomic

FORMAT = 1  # bump when the layout changes: every key changes with it
INDEX = "index.json"
HEADROOM = 256 * 2**20  # bytes left free on the disk after a cache is written
Say = Callable[[str], None]


def digest(parts: Any) -> str:
    """16 hex digits of the SHA-256 of ``parts`` as canonical JSON."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _as_json(parts: dict[str, Any]) -> dict[str, Any]:
    """``parts`` as a JSON file gives them back (tuples as lists): what a stored key is compared with."""
    return json.loads(json.dumps(parts))


def files_digest(paths: Sequence[Path], root: Path) -> str:
    """The identity of the image files: each one's path under ``root``, size and modification time."""
    h = hashlib.sha256()
    for path in paths:
        try:
            st = path.stat()
            h.update(f"{_relative(path, root)}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{_relative(path, root)}\tmissing\n".encode())
    return h.hexdigest()


def weights_digest(module: torch.nn.Module) -> str:
    """A hash of a module's frozen tensors (buffers, and parameters that do not train): what decides its output
    on a cached pass. Trained parameters (``--tune-blocks``' tail) are left out: they run after the cache."""
    h = hashlib.sha256()
    trained = {id(p) for p in module.parameters() if p.requires_grad}
    for name, tensor in sorted(module.state_dict(keep_vars=True).items()):
        if id(tensor) in trained:
            continue
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}\t{t.dtype}\t{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


# ----------------------------------------------------------------------------- space, writing, publishing


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_space(folder: Path, need: int, what: str, instead: str) -> None:
    """SatError unless ``need`` bytes (and HEADROOM) are free on the disk holding ``folder``."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if need + HEADROOM > free:
        raise SatError(no_fit_message(folder, need, free, what, instead))


def no_fit_message(folder: Path, need: int, free: int, what: str, instead: str) -> str:
    return (f"The preprocessing cache does not fit: {what} take {gib(need)} in {folder}, but only {gib(free)} "
            f"are free on that disk (and {gib(HEADROOM)} is kept free). Free space there, or give --cache a folder "
            f"on a disk with {gib(need + HEADROOM)} free; {instead}.")


class NpyWriter:
    """A .npy file written row by row from any thread (``os.pwrite``: no mapping, so the writer's resident memory
    stays flat), its whole size reserved on disk when it is created."""

    def __init__(self, path: Path, dtype: np.dtype | type, shape: tuple[int, ...], what: str, instead: str) -> None:
        self.path, self.dtype, self.shape = path, np.dtype(dtype), shape
        self.row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self.what, self.instead = what, instead
        check_space(path.parent, shape[0] * self.row_bytes, what, instead)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            with os.fdopen(os.dup(self.fd), "wb") as f:
                header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": shape}
                np.lib.format.write_array_header_1_0(f, header)
                self.offset = f.tell()
            self._reserve(self.offset + shape[0] * self.row_bytes)
        except BaseException:
            os.close(self.fd)
            raise

    def _reserve(self, size: int) -> None:
        try:
            os.posix_fallocate(self.fd, 0, size)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise self._full() from None
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            os.ftruncate(self.fd, size)  # a file system without fallocate: space is claimed as rows arrive

    def _full(self) -> SatError:
        free = shutil.disk_usage(self.path.parent).free
        return SatError(no_fit_message(self.path.parent, self.shape[0] * self.row_bytes, free, self.what,
                                       self.instead))

    def write(self, start: int, rows: np.ndarray) -> None:
        """Rows start…start+len(rows)−1 (any thread; rows of different calls must not overlap)."""
        data = memoryview(np.ascontiguousarray(rows, dtype=self.dtype)).cast("B")
        pos = self.offset + start * self.row_bytes
        try:
            while data:
                written = os.pwrite(self.fd, data, pos)
                data, pos = data[written:], pos + written
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise self._full() from None
            raise

    def close(self) -> None:
        os.fsync(self.fd)  # on disk before the rename that makes it visible
        os.close(self.fd)

    def abort(self) -> None:
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


def _staging(final: Path) -> Path:
    return final.with_name(f"{final.name}.tmp-{socket.gethostname()}-{os.getpid()}")


def _publish(staged: Path, final: Path) -> None:
    """Make ``staged`` visible as ``final`` unless another writer got there first (then drop ours)."""
    try:
        if staged.is_dir():
            os.rename(staged, final)  # fails when final is a non-empty folder
        else:
            os.link(staged, final)  # fails when final exists; a rename would replace a file others have mapped
            staged.unlink()
    except OSError:
        if not final.exists():
            raise
        shutil.rmtree(staged) if staged.is_dir() else staged.unlink(missing_ok=True)


def writes_here() -> bool:
    """Whether this process writes a missing cache: every single-process run, and local rank 0 under DDP."""
    return int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", 0))) == 0


def _wait_for(path: Path, what: str, say: Say) -> None:
    """Another rank of this node writes ``path``; the launcher ends this one if that rank fails."""
    say(f"cache: waiting for local rank 0 to write {what} ({path})…")
    while not path.exists():
        time.sleep(0.5)


def _map(path: Path) -> np.ndarray:
    """The array of a .npy file, memory-mapped: copy-on-write, so torch may view it and the file never changes."""
    return np.load(path, mmap_mode="c", allow_pickle=False)


# ----------------------------------------------------------------------------- images


def image_key_parts(paths: Sequence[Path], root: Path, cfg: PreprocessConfig) -> dict[str, Any]:
    """What decides an image store's bytes: the files, in row order, and the preprocessing."""
    return {"format": FORMAT, "kind": "images", "files": files_digest(paths, root), "count": len(paths),
            "image_size": cfg.image_size, "crop": cfg.crop, "mean": list(cfg.mean), "std": list(cfg.std)}


class DiskImageStore(ImageRows):
    """The images of the chosen splits memory-mapped from ``folder``'s images.npy; the ``ImageStore`` interface.

    ``images`` is a (N, 3, S, S) uint8 tensor over the mapping (rows of unreadable images stay zero and have no
    entry in ``row_of``). ``rows`` reads a range with plain reads instead, so that a pass over every image (the
    encoder's) does not leave the whole file counted in this process's resident memory.
    """

    def __init__(self, folder: Path, wanted: list[int], cfg: PreprocessConfig) -> None:
        self.cfg, self.folder, self.key = cfg, folder, folder.name.removeprefix("images-")
        self.index = json.loads((folder / INDEX).read_text())
        array = _map(folder / "images.npy")
        self.offset, self.row_bytes = array.offset, int(np.prod(array.shape[1:]))
        self.images = torch.from_numpy(array)  # (N, 3, S, S) uint8, mapped
        failed = {row for row, _path, _reason in self.index["skipped"]}
        self.skipped = [(Path(path), reason) for _row, path, reason in self.index["skipped"]]
        self.row_of = {index: row for row, index in enumerate(wanted) if row not in failed}

    def rows(self, start: int, stop: int) -> torch.Tensor:
        count = (stop - start) * self.row_bytes
        flat = np.fromfile(self.folder / "images.npy", dtype=np.uint8, count=count,
                           offset=self.offset + start * self.row_bytes)
        return torch.from_numpy(flat).view(stop - start, *self.images.shape[1:])  # (stop − start, 3, S, S)

    @property
    def nbytes(self) -> int:
        return self.images.numel()


def image_store(cache: str | Path, data: KarpathyData, cfg: PreprocessConfig, *, splits: Sequence[str] | None,
                workers: int = 0, progress: bool = True, say: Say = print) -> DiskImageStore:
    """The images of ``splits`` from the cache folder, decoded and written there first if no run did yet."""
    wanted = wanted_images(data, splits)
    paths = [data.images[i].path for i in wanted]
    parts = _as_json(image_key_parts(paths, data.images_dir, cfg))
    folder = Path(cache).expanduser() / f"images-{digest(parts)}"
    if not (folder / INDEX).exists():
        if writes_here():
            _write_images(folder, parts, paths, data.images_dir, cfg, workers, progress, say)
        else:
            _wait_for(folder / INDEX, f"{len(paths):,} images", say)
    store = DiskImageStore(folder, wanted, cfg)
    if store.index["key"] != parts:  # a folder name's 64 bits collided, or someone edited the folder
        raise SatError(f"The cache folder {folder} holds images made from other files or settings. Delete it; the "
                       "next run writes it again.")
    return store


def _write_images(folder: Path, parts: dict[str, Any], paths: list[Path], root: Path, cfg: PreprocessConfig,
                  workers: int, progress: bool, say: Say) -> None:
    size, staged = cfg.image_size, _staging(folder)
    staged.mkdir(parents=True, exist_ok=True)
    say(f"cache: decoding {len(paths):,} images at {size} px into {folder} (once: later runs, resumes and ranks "
        "map it)…")
    what = f"{len(paths):,} images at {size} px"
    try:
        out = NpyWriter(staged / "images.npy", np.uint8, (len(paths), 3, size, size), what,
                        "or drop --cache to decode the images into RAM at every start instead")
        try:
            failed = decode_rows(paths, cfg, workers, lambda row, pixels: out.write(row, pixels[None]),
                                 progress=progress)
        except BaseException:
            out.abort()
            raise
        out.close()
        skipped = [[row, str(path), reason] for row, path, reason in failed]
        write_json_atomic(staged / INDEX, {"key": parts, "paths": [_relative(p, root) for p in paths],
                                           "root": str(root.resolve()),  # what stale_entries checks the files in
                                           "skipped": skipped, "written": time.strftime("%Y-%m-%d %H:%M:%S")})
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    _publish(staged, folder)


# ----------------------------------------------------------------------------- annotations


class Annotations:
    """A frozen encoder's output for every row of a store: ``tensor`` (N, …) fp16 and the α ``grid``."""

    def __init__(self, tensor: torch.Tensor, grid: tuple[int, int], path: Path | None = None) -> None:
        self.tensor, self.grid, self.path = tensor, grid, path


Encode = Callable[[torch.Tensor], tuple[torch.Tensor, tuple[int, int]]]  # uint8 rows -> (fp16 rows, grid)


def encode_rows(store: ImageRows, encode: Encode, allocate: Callable[[tuple[int, ...]], Any], *, chunk: int,
                progress: Callable[[Iterable[int]], Iterable[int]] = iter) -> tuple[Any, tuple[int, int]]:
    """``encode`` over every row of ``store`` in chunks, each written into what ``allocate(row shape)`` gave
    (sized from the first chunk): one preallocated array, never a list of chunks joined at the end."""
    n, out, grid = len(store.images), None, (0, 0)
    for start in progress(range(0, n, chunk)):
        feats, grid = encode(store.rows(start, min(n, start + chunk)))  # (b, …) fp16
        if out is None:
            out = allocate(tuple(feats.shape[1:]))
        if isinstance(out, NpyWriter):
            out.write(start, feats.numpy())
        else:
            out[start : start + len(feats)] = feats
    return out, grid


def annotation_path(store: DiskImageStore, identity: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Where the annotations of the encoder ``identity`` over ``store``'s images lie, and their key's parts."""
    parts = _as_json({"format": FORMAT, "kind": "annotations", "images": store.key, **identity})
    return store.folder / f"annotations-{digest(parts)}.npy", parts


def annotation_cache(store: DiskImageStore, identity: dict[str, Any], encode: Encode, *, chunk: int,
                     progress: Callable[[Iterable[int]], Iterable[int]] = iter, say: Say = print) -> Annotations:
    """The encoder's output for every image of ``store``, memory-mapped from its folder; computed and written
    there first if no run with this encoder (``identity``: name, options, weights) did yet."""
    final, parts = annotation_path(store, identity)
    meta = final.with_suffix(".json")
    if not meta.exists():
        if writes_here():
            _write_annotations(store, final, parts, encode, chunk, progress, say)
        else:
            _wait_for(meta, "the encoder's annotations", say)
    written = json.loads(meta.read_text())
    if written["key"] != parts:
        raise SatError(f"The cache file {final} holds another encoder's annotations. Delete it and its .json; the "
                       "next run writes them again.")
    tensor = torch.from_numpy(_map(final))  # (N, L, D) fp16, mapped
    return Annotations(tensor, tuple(written["grid"]), final)


def _write_annotations(store: DiskImageStore, final: Path, parts: dict[str, Any], encode: Encode, chunk: int,
                       progress: Callable[[Iterable[int]], Iterable[int]], say: Say) -> None:
    staged, n = _staging(final), len(store.images)
    holder: list[NpyWriter] = []

    def allocate(shape: tuple[int, ...]) -> NpyWriter:
        what = f"the encoder's annotations of {n:,} images ({' × '.join(map(str, shape))} fp16 each)"
        holder.append(NpyWriter(staged, np.float16, (n, *shape), what,
                                "or train with --cache-features off to encode every image at every step instead"))
        say(f"cache: writing {what}, {gib(holder[0].row_bytes * n)}, to {final}")
        return holder[0]

    started = time.perf_counter()
    try:
        out, grid = encode_rows(store, encode, allocate, chunk=chunk, progress=progress)
        out.close()
    except BaseException:
        if holder:
            holder[0].abort()
        raise
    _publish(staged, final)
    write_json_atomic(final.with_suffix(".json"), {"key": parts, "grid": list(grid), "shape": list(out.shape)})
    say(f"cache: the encoder ran over {n:,} images in {time.perf_counter() - started:.0f} s")


def encoder_identity(model: ModelConfig, encoder: torch.nn.Module) -> dict[str, Any]:
    """What decides a frozen encoder's cached output besides the images: its name, the options that pick its tap,
    the stage cached (annotations, or --tune-blocks' frozen blocks) and its frozen weights."""
    names = ("encoder", "small_channels", "feature_dim", "multiscale", "coarse", "shallow", "tune_blocks", "pool_grid")
    return {**{name: getattr(model, name) for name in names},
            "stage": "frozen blocks" if model.tune_blocks else "annotations", "weights": weights_digest(encoder)}


# ----------------------------------------------------------------------------- stale entries


def stale_entries(cache: str | Path) -> list[tuple[Path, str]]:
    """What in the cache folder no run can read any more, each with why: image stores whose image files changed
    after they were written (a regenerated world: every run now asks for another key), with the annotations inside
    them, and the staging files of writers on this machine that were killed. A store whose folder of images is gone
    is left alone (the folder may have moved: a copy with the same files maps the same store), and so is one written
    before that folder was kept in its index."""
    found = []
    for folder in sorted(Path(cache).expanduser().glob("images-*")):
        if _killed_writer(folder.name):
            found.append((folder, "left by a writer that was killed"))
            continue
        try:
            index = json.loads((folder / INDEX).read_text())
            root = Path(index["root"])
            changed = root.is_dir() and files_digest([root / p for p in index["paths"]], root) != index["key"]["files"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a complete store of this format: left alone
        if changed:
            found.append((folder, f"its images in {root} changed after it was written"))
            continue
        found += [(p, "left by a writer that was killed") for p in sorted(folder.iterdir()) if _killed_writer(p.name)]
    return found


def _killed_writer(name: str) -> bool:
    """Whether ``name`` is a staging name (``_staging``) of a process on this machine that no longer runs."""
    _, tmp, writer = name.rpartition(".tmp-")
    host, _, pid = writer.rpartition("-")
    if not tmp or host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass  # it runs, as another user
    return False


def prune(cache: str | Path, say: Say = print) -> int:
    """Delete ``stale_entries(cache)``, saying what and why; returns the bytes freed."""
    freed = 0
    for path, why in stale_entries(cache):
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        shutil.rmtree(path) if path.is_dir() else path.unlink()
        freed += size
        say(f"cache: removed {path} ({gib(size)}): {why}")
    return freed
