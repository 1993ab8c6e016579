"""One switch for numeric precision: ``auto`` | ``fp32`` | ``bf16``, behind one context manager.

``auto`` is bf16 where the hardware multiplies bf16 natively (every CUDA GPU we run on, and CPUs
whose flags list AMX or AVX512-BF16, read from /proc/cpuinfo, never guessed) and fp32 elsewhere.
Inside ``autocast`` the matrix products run in bf16; the recurrent state (h, c), softmaxes, the loss
and the optimizer's master weights stay fp32 (the decoder and losses cast back explicitly).

The trainer, ``beam_search``, decode sessions, caption scoring and the benchmarks all enter it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

from sat_core.errors import SatError

PRECISIONS = ("auto", "fp32", "bf16")
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_bf16() -> bool:
    """True when this CPU has native bf16 matrix instructions (AMX or AVX512-BF16)."""
    return any(flag in cpu_flags() for flag in BF16_CPU_FLAGS)


def resolve(device: torch.device | str, precision: str = "auto") -> str:
    """``"bf16"`` or ``"fp32"``: what ``precision`` means on ``device``."""
    if precision not in PRECISIONS:
        raise SatError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}.")
    if precision != "auto":
        return precision
    kind = torch.device(device).type
    if kind == "cuda":
        return "bf16"
    return "bf16" if kind == "cpu" and cpu_has_bf16() else "fp32"


@contextlib.contextmanager
def autocast(device: torch.device | str, precision: str = "auto") -> Iterator[str]:
    """Run the block in the resolved precision; yields ``"bf16"`` or ``"fp32"``.

    Enter it once around a whole decode or training step, not per decoder step: autocast keeps the
    bf16 copies of the weights it casts until the outermost block exits.
    """
    device = torch.device(device)
    resolved = resolve(device, precision)
    if resolved == "bf16":
        with torch.autocast(device.type, dtype=torch.bfloat16):
            yield resolved
    else:
        with torch.autocast(device.type, enabled=False):
            yield resolved


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype matrix products of ``t``'s device run in right now (bf16 inside ``autocast``)."""
    kind = t.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else t.dtype
