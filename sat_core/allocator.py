"""Keep freed memory in the process, so that large tensors do not page-fault on every allocation.

glibc's malloc serves blocks over its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and hands
them back with ``munmap`` when freed, so the next activation of that size faults in every page again.
The encoder's activations at batch 64 are ~100 MB each: measured on this project's 2-core CPU
(EfficientNet-Lite0 to its stride-16 stage, 224 px, chunks of 64, fp32, 2026-11-23), 61.9 ms per image
with 7.7 M page faults per 256 images against 12.2 ms and none once freed memory is kept. Feature caching
before training, evaluation and the benchmarks all encode in such batches.

The setting is process-wide, so importing the library never applies it: the commands that encode in
large batches (``python -m sat_core.train``, ``evaluate``, ``caption``, ``bench``, ``ship``, ``pretrain``)
and the explorer call ``keep_freed_memory()`` first thing.
"""

from __future__ import annotations

import ctypes
import os
import sys

# mallopt parameters, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
_TRIM_NEVER = 2**31 - 1  # trim only when 2 GiB lie free at the heap's top (mallopt takes an int)


_kept: bool | None = None  # None until a caller asks; then whether the settings were applied


def keep_freed_memory() -> bool:
    """Ask glibc malloc never to mmap blocks (use the heap) and not to trim the heap's top (once per process).

    The resident size then stays at its peak instead of shrinking after each batch. Returns whether the
    settings were applied: False off Linux, with a C library other than glibc, or with the environment
    variable SAT_KEEP_FREED_MEMORY=0 (glibc's defaults, for comparison), where nothing changes.
    """
    global _kept
    if _kept is None:
        _kept = _apply()
    return _kept


def asked() -> bool:
    """Whether anything in this process has called ``keep_freed_memory`` (importing sat_core never does)."""
    return _kept is not None


def _apply() -> bool:
    if not sys.platform.startswith("linux") or os.environ.get("SAT_KEEP_FREED_MEMORY", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # musl and others: no glibc mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, _TRIM_NEVER))

