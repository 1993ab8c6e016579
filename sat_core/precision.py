"""One switch for numeric precision: ``auto`` | ``fp32`` | ``bf16``, behind one context manager.

``auto`` is bf16 where the hardware multiplies bf16 faster than fp32 and fp32 elsewhere: every CUDA
GPU we run on; CPUs whose flags (read from /proc/cpuinfo, never guessed) list AMX; and AMD CPUs whose
flags list AVX512-BF16. The AVX512-BF16 flag alone does not mean bf16 is faster: measured on this
project's machines, bf16 products ran 2.4× faster than fp32 on an AMD EPYC (Zen 4), but 0.5–0.75×
(slower) on an Intel Xeon whose hypervisor hides AMX, where oneDNN falls back to AVX512-BF16
instructions that do no more multiply-adds per cycle than fp32 FMAs. A timing probe was tried instead
of the vendor rule and dropped: under load its ratio swung from 0.4 to 1.9 between processes, and
``auto`` must not change the arithmetic between two runs on one machine. ``fp32`` on a GPU is fp32:
TF32 is off inside the block.
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
TRAINING_PRECISIONS = (*PRECISIONS, "fp16")  # fp16 trains behind a gradient scaler, on CUDA only
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


@functools.lru_cache(maxsize=1)
def cpu_vendor() -> str:
    """``vendor_id`` from /proc/cpuinfo (``GenuineIntel``, ``AuthenticAMD``; empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_bf16_pays() -> bool:
    """True when ``auto`` should run bf16 on this CPU: AMX, or AVX512-BF16 on AMD (see the module doc)."""
    flags = cpu_flags()
    return "amx_bf16" in flags or ("avx512_bf16" in flags and cpu_vendor() == "AuthenticAMD")


def describe_cpu() -> str:
    """One line for logs and benchmark headers: the CPU's bf16 units and what ``auto`` runs on it."""
    flags = cpu_flags()
    if "amx_bf16" in flags:
        return "CPU with AMX: auto = bf16"
    if "avx512_bf16" in flags:
        maker = {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}.get(cpu_vendor(), cpu_vendor() or "a")
        return f"{maker} CPU with AVX512-BF16, no AMX: auto = {'bf16' if cpu_bf16_pays() else 'fp32'}"
    return "CPU without native bf16: auto = fp32"


def describe(device: torch.device | str) -> str:
    """``describe_cpu()`` on a CPU; on CUDA, that ``auto`` is bf16 there."""
    if torch.device(device).type != "cuda":
        return describe_cpu()
    return "CUDA GPU: auto = bf16" if cuda_has_bf16() else "CUDA GPU without bf16: auto = fp32 (training: fp16)"


def cuda_has_bf16() -> bool:
    """True when the CUDA GPU computes in bf16 (Ampere and later); older GPUs refuse bf16 autocast."""
    return torch.cuda.is_bf16_supported(including_emulation=False)


def resolve(device: torch.device | str, precision: str = "auto") -> str:
    """``"bf16"`` or ``"fp32"``: what ``precision`` means on ``device`` (decoding; training: ``resolve_training``)."""
    if precision not in PRECISIONS:
        raise SatError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}.")
    if precision != "auto":
        return precision
    kind = torch.device(device).type
    if kind == "cuda":
        return "bf16" if cuda_has_bf16() else "fp32"
    return "bf16" if kind == "cpu" and cpu_bf16_pays() else "fp32"


def resolve_training(device: torch.device | str, precision: str = "auto") -> str:
    """``"bf16"``, ``"fp16"`` or ``"fp32"`` for training steps: as ``resolve``, except that ``auto`` on a CUDA GPU
    without bf16 is fp16 (with ``grad_scaler``), and ``fp16`` is refused off CUDA (CPUs keep bf16 or fp32)."""
    if precision not in TRAINING_PRECISIONS:
        raise SatError(f"precision must be one of {', '.join(TRAINING_PRECISIONS)}, not {precision!r}.")
    cuda = torch.device(device).type == "cuda"
    if precision == "fp16" and not cuda:
        raise SatError("--precision fp16 trains on a CUDA GPU only (with a gradient scaler); on a CPU use bf16, "
                       "fp32 or auto.")
    if precision == "auto" and cuda and not cuda_has_bf16():
        return "fp16"
    return precision if precision == "fp16" else resolve(device, precision)


def grad_scaler(device: torch.device | str, resolved: str) -> torch.amp.GradScaler | None:
    """fp16's loss scaler (its small range would round small gradients to 0); None in every other precision."""
    if resolved != "fp16":
        return None
    return torch.amp.GradScaler(torch.device(device).type)


@contextlib.contextmanager
def autocast(device: torch.device | str, precision: str = "auto", *, cache: bool = True) -> Iterator[str]:
    """Run the block in the resolved precision; yields ``"bf16"`` or ``"fp32"``.

    Enter it once around a whole decode or training step, not per decoder step: autocast keeps the
    bf16 copies of the weights it casts until the outermost block exits. ``cache=False`` casts at
    every call instead, as a CUDA graph capture needs (a cached copy would be freed under the graph).
    """
    device = torch.device(device)
    resolved = resolve_training(device, precision) if precision == "fp16" else resolve(device, precision)
    if resolved == "fp16":
        with torch.autocast(device.type, dtype=torch.float16, cache_enabled=cache):
            yield resolved
    elif resolved == "bf16":
        with torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=cache):
            yield resolved
    elif device.type == "cuda":
        with torch.autocast("cuda", enabled=False), strict_fp32():
            yield resolved
    else:
        with torch.autocast(device.type, enabled=False):
            yield resolved


@contextlib.contextmanager
def strict_fp32() -> Iterator[None]:
    """Turn off TF32 (10-bit mantissa products) in cuDNN's convolutions and cuBLAS for the block.

    PyTorch lets cuDNN use TF32 by default, so an "fp32" encoder pass on a GPU is not fp32: measured on
    an H200, a shipped scenes model's caption log-probabilities then differed from the CPU's by up to
    1.6·10⁻³. The flags are process-wide; they are restored on exit.
    """
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype matrix products of ``t``'s device run in right now (bf16 inside ``autocast``)."""
    kind = t.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else t.dtype
