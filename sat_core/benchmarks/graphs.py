"""``python -m sat_core.bench compile`` and ``graph``: the attention block under ``torch.compile`` against the
project's eager and fused code; the decode step as a CUDA graph and compiled (CUDA only)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from sat_core import native
from sat_core.benchmarks.decoding import DecodeModel, random_model, steps_taken
from sat_core.benchmarks.measure import (
    COCO, QUICK, cases, progress, sync, timed,
)
from sat_core.config import DecodeConfig
from sat_core.data.vocab import SPECIALS
from sat_core.decoding import beam_search
from sat_core.errors import SatError
from sat_core.precision import autocast


def run_compile(device: torch.device, quick: bool = False) -> dict[str, Any]:
    """Best ms of 20 calls of the decode step's attention scores, chunked eager vs ``torch.compile`` (fp32)."""
    from sat_core.models.attention_fast import _scores

    B, k, L, A = (8, 5, 196, 512) if quick else (64, 5, 196, 512)
    gen = torch.Generator().manual_seed(0)
    proj = torch.randn(B, L, A, generator=gen).to(device)  # 2(W_a a + b)
    wh = torch.randn(B, k, 1, A, generator=gen).to(device)  # 2 W_h h per row
    w = torch.randn(A, generator=gen).to(device)

    def plain(proj: torch.Tensor, wh: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(proj.unsqueeze(1) + wh) @ w  # (B, k, L); materialised whole when eager

    def eager(proj: torch.Tensor, wh: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return _scores(proj, wh, w, False, 4)

    with torch.no_grad():
        started = time.perf_counter()
        compiled = torch.compile(plain, dynamic=False)
        out = compiled(proj, wh, w)
        sync(device)
        compile_s = time.perf_counter() - started
        diff = float((out - eager(proj, wh, w)).abs().max())
        runs = 3 if quick else 20
        ways = [("eager", eager), ("compiled", compiled), ("plain", plain)]
        fused = device.type == "cpu" and native.available()
        if fused:
            ways.append(("fused", native.attention_scores))
            fused_diff = float((native.attention_scores(proj, wh, w) - eager(proj, wh, w)).abs().max())
        times = {name: 1000 * timed(lambda f=f: f(proj, wh, w), device, min_time=60.0, max_runs=runs)[0]
                 for name, f in ways}
    return {"device": device.type, "batch": B, "beam": k, "eager_chunked_ms": times["eager"],
            "eager_whole_ms": times["plain"], "compiled_ms": times["compiled"], "compile_s": compile_s,
            "max_abs_diff": diff, "fused_ms": times["fused"] if fused else None,
            "fused_max_abs_diff": fused_diff if fused else None}


def _repeat(fn: Callable[[], Any], n: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(n):
            fn()
    return run


def graph_case(dm: DecodeModel, device: torch.device, precision: str, B: int, K: int,
               reps: int) -> dict[str, Any]:
    """ms per ``Decoder.step`` at N = B·K rows: eager, CUDA graph replay, compiled (reduce-overhead)."""
    dec = dm.model.decoder
    feats = dm.feats[:B].to(device)
    with torch.no_grad(), autocast(device, precision):
        prep, h, c = dec.prepare(feats)
    h, c = h.repeat_interleave(K, 0), c.repeat_interleave(K, 0)  # (N, n)
    tokens = torch.full((B * K,), len(SPECIALS), dtype=torch.long, device=device)  # (N,)

    def step() -> torch.Tensor:
        with autocast(device, precision, cache=False):
            return dec.step(tokens, h, c, prep).logits  # (N, V)

    short = {"warmup": 1, "min_time": 0.5, "max_runs": 5}
    with torch.no_grad():
        reference = step().float()
        eager_ms = 1000 * timed(_repeat(step, reps), device, **short)[0] / reps

        started = time.perf_counter()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm up off the capture stream, as torch.cuda.graph asks
            for _ in range(3):
                step()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        graph.replay()
        sync(device)
        graph_build_s = time.perf_counter() - started
        graph_diff = float((captured.float() - reference).abs().max())
        graph_ms = 1000 * timed(_repeat(graph.replay, reps), device, **short)[0] / reps

        started = time.perf_counter()
        compiled = torch.compile(step, mode="reduce-overhead", dynamic=False)
        for _ in range(3):  # reduce-overhead records its graph on the third call
            out = compiled()
        sync(device)
        compile_s = time.perf_counter() - started
        compiled_diff = float((out.float() - reference).abs().max())
        compiled_ms = 1000 * timed(_repeat(compiled, reps), device, **short)[0] / reps

    cfg = DecodeConfig(beam_size=K, max_len=20, precision=precision)
    results: list = []

    def search() -> None:
        results[:] = beam_search(dm.model, feats, dm.vocab, cfg)

    beam_ms = 1000 * timed(search, device, **short)[0] / steps_taken(results)  # warm-up filled results
    return {"device": device.type, "precision": precision, "model": dm.name, "beam": K, "batch": B,
            "beam_step_ms": beam_ms, "eager_ms": eager_ms, "graph_ms": graph_ms, "compiled_ms": compiled_ms,
            "graph_speedup": eager_ms / graph_ms, "compiled_speedup": eager_ms / compiled_ms,
            "graph_build_s": graph_build_s, "compile_s": compile_s,
            "graph_max_diff": graph_diff, "compiled_max_diff": compiled_diff}


def run_graph(device: torch.device, quick: bool = False, precision: str = "all") -> list[dict[str, Any]]:
    if device.type != "cuda":
        raise SatError("bench graph times CUDA graphs and needs a CUDA GPU (--device cuda); "
                       "on a CPU, `bench decode` and `bench compile` time the decode step.")
    batches, reps = ((1, 4), 3) if quick else ((1, 16, 64), 50)
    dm = random_model(QUICK if quick else COCO, max(batches))
    dm.model.to(device)
    rows = []
    for _, p in cases([device], precision):
        for B in batches:
            torch._dynamo.reset()  # each case compiles afresh: its compile_s is a first compile
            rows.append(progress(graph_case(dm, device, p, B, 2 if quick else 5, reps)))
    return rows
