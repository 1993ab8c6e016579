"""What every benchmark shares: model dimensions, timing and peak memory, the weight GEMMs of a step and
their floor, tables. See ``python -m sat_core.bench --help`` and the command's docstring for what is measured.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sat_core.config import ModelConfig
from sat_core.paths import shipped_checkpoints
from sat_core.precision import autocast, cpu_has_bf16, resolve

SHIPPED = shipped_checkpoints() / "shapes_soft"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Dims:
    """Decoder dimensions: L regions, D features, V words, m embedding, n LSTM, A attention MLP."""

    name: str
    L: int
    D: int
    V: int
    m: int
    n: int
    A: int


PAPER = Dims("paper L196 D512", 196, 512, 10_000, 512, 1024, 512)
RESNET = Dims("resnet L196 D2048", 196, 2048, 10_000, 512, 1024, 512)
COCO = Dims("coco L196 D2048 n512", 196, 2048, 10_000, 512, 512, 512)
QUICK = Dims("quick", 16, 24, 40, 16, 32, 16)


def model_config(dims: Dims, attention: str = "soft") -> ModelConfig:
    # The small encoder's last width sets D; it is never run here (annotations are precomputed).
    return ModelConfig(encoder="small", small_channels=(4, 4, dims.D), feature_dim=dims.D, vocab_size=dims.V,
                       embed_dim=dims.m, hidden_dim=dims.n, attn_dim=dims.A, attention=attention)


def dims_of(config: ModelConfig, L: int, name: str) -> Dims:
    return Dims(name, L, config.feature_dim, config.vocab_size, config.embed_dim, config.hidden_dim,
                config.attn_dim)


# ---- measuring ------------------------------------------------------------------------------------

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _proc_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class PeakMemory:
    """``with PeakMemory(device) as mem: …`` then ``mem.mb``: peak memory above the level at entry."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.mb = device, 0.0

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap back so the RSS baseline is honest
        with contextlib.suppress(OSError):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
        self._base = _proc_kib("VmRSS") * 1024
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            sync(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = _proc_kib("VmHWM") * 1024
        self.mb = max(0, peak - self._base) / 2**20


def timed(fn: Callable[[], Any], device: torch.device, *, warmup: int = 1, min_time: float = 1.0,
          max_runs: int = 3) -> tuple[float, PeakMemory]:
    """Best wall time of ``fn()`` over 1..max_runs runs after warm-up (stop once min_time is spent)."""
    for _ in range(warmup):
        fn()
    best, spent, runs = float("inf"), 0.0, 0
    with PeakMemory(device) as mem:
        while runs < max_runs and (runs == 0 or spent < min_time):
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            elapsed = time.perf_counter() - start
            best, spent, runs = min(best, elapsed), spent + elapsed, runs + 1
    return best, mem


def cases(devices: list[torch.device], choice: str) -> list[tuple[torch.device, str]]:
    """(device, precision) pairs: ``all`` is fp32 and, where the hardware has bf16 instructions, bf16
    (also where they are slower than fp32 and ``auto`` runs fp32: the table shows it)."""
    if choice != "all":
        return [(d, resolve(d, choice)) for d in devices]
    has_bf16 = {d: d.type == "cuda" or cpu_has_bf16() for d in devices}
    return [(d, p) for d in devices for p in ("fp32", "bf16") if p == "fp32" or has_bf16[d]]


def progress(row: dict[str, Any]) -> dict[str, Any]:
    """Show each figure as it comes (a full run takes minutes); stderr keeps stdout to the tables."""
    print("  " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
          file=sys.stderr, flush=True)
    return row


def timed_in(precision: str, fn: Callable[[], Any], device: torch.device, **kwargs: Any) -> float:
    """Best time of ``fn`` with autocast entered once around all runs (as beam_search does)."""
    with autocast(device, precision):
        return timed(fn, device, **kwargs)[0]


# ---- the weight products of a step, timed alone ------------------------------------------------------

Gemm = tuple[int, int, int]  # (rows M, inputs K, outputs N): x (M, K) @ W (K, N)


def decode_gemms(d: Dims, N: int) -> list[Gemm]:
    """One decode step's weight products at N rows: W_h, LSTM (input and recurrent), f_β, L_h, L_z, L_o."""
    return [(N, d.n, d.A), (N, d.m + d.D, 4 * d.n), (N, d.n, 4 * d.n), (N, d.n, 1), (N, d.n, d.m),
            (N, d.D, d.m), (N, d.m, d.V)]


def train_gemms(d: Dims, B: int, T: int) -> list[Gemm]:
    """The lean teacher-forced pass's weight products: once per caption batch, then per step."""
    R = B * T  # rows of the products that run once over all steps
    once = [(B * d.L, d.D, d.A), (B, d.D, d.n), (B, d.D, d.n), (R, d.m, 4 * d.n), (R, d.n, d.m),
            (R, d.D, d.m), (R, d.m, d.V)]
    per_step = [(B, d.n, d.A), (B, d.D, 4 * d.n), (B, d.n, 4 * d.n), (B, d.n, 1)]
    return once + per_step * T


def gemm_runner(shapes: list[Gemm], device: torch.device, dtype: torch.dtype,
                backward: bool = False) -> Callable[[], None]:
    """The products alone on random tensors; ``backward`` adds both gradient products of each."""
    made: dict[Gemm, tuple[torch.Tensor, ...]] = {}
    for M, K, N in shapes:
        if (M, K, N) not in made:
            r = lambda *shape: torch.randn(*shape, device=device, dtype=dtype)  # noqa: E731
            made[(M, K, N)] = (r(M, K), r(K, N), r(M, N))
    mats = [made[s] for s in shapes]

    def run() -> None:
        for x, w, g in mats:
            torch.mm(x, w)  # (M, N)
            if backward:
                torch.mm(g, w.t())  # ∂/∂x: (M, K)
                torch.mm(x.t(), g)  # ∂/∂W: (K, N)

    return run


def gemm_floor(shapes: list[Gemm], device: torch.device, precision: str, row_seconds: float,
               backward: bool = False, **short: Any) -> tuple[float, str]:
    """(seconds, precision) of the weight GEMMs in the fastest precision the hardware has.

    ``row_seconds`` is the row's own precision's time, reused rather than timed twice; the other
    precision is timed where the hardware has bf16 instructions (every CUDA GPU, CPUs with AVX512-BF16
    or AMX), even where ``auto`` does not pick it.
    """
    times = {precision: row_seconds}
    if device.type == "cuda" or cpu_has_bf16():
        other = "bf16" if precision == "fp32" else "fp32"
        times[other] = timed(gemm_runner(shapes, device, DTYPES[other], backward=backward), device, **short)[0]
    best = min(times, key=times.get)
    return times[best], best


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """Rows as a fixed-width text table; columns are (key, header, format)."""
    cells = [[header for _, header, _ in columns]]
    cells += [[format(row[key], fmt) for key, _, fmt in columns] for row in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells)
