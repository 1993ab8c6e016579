"""``python -m sat_core.bench train``: one optimizer step of the decoder (teacher forcing, the project's loss,
backward, Adam) on precomputed random annotations, split into its parts timed alone."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from sat_core.benchmarks.measure import (
    COCO, DTYPES, PAPER, QUICK, Dims, cases, gemm_floor, gemm_runner, model_config, progress, sync, timed,
    train_gemms,
)
from sat_core.data.vocab import SPECIALS, Vocab
from sat_core.models.attention import attend
from sat_core.models.captioner import Captioner
from sat_core.precision import autocast


def attention_train_runner(model: Captioner, dims: Dims, B: int, T: int, device: torch.device,
                           precision: str) -> Callable[[], None]:
    """The attention block of T teacher-forced steps alone, forward and backward."""
    dec = model.decoder
    feats = torch.randn(B, dims.L, dims.D, device=device)
    hs = torch.randn(T, B, dims.n, device=device, requires_grad=True)

    def run() -> None:
        with autocast(device, precision):
            prep, _, _ = dec.prepare(feats)
            total = sum(attend(prep.feats, dec.attention(prep.proj, hs[t]))[0].float().sum() for t in range(T))
        total.backward()

    return run


def train_case(dims: Dims, attention: str, device: torch.device, precision: str = "fp32", *, batch: int = 32,
               length: int = 20, min_time: float = 1.0, floor: bool = True, compiled: bool = False) -> dict[str, Any]:
    """Captions/s, the parts of a step timed alone, and peak memory of training steps on random data;
    ``compiled``: the recurrence through torch.compile (``train --compile``), its first step's seconds apart."""
    from sat_core.training.losses import MovingBaseline, caption_loss
    from sat_core.training.trainer import build_optimizer

    torch.manual_seed(0)
    config = model_config(dims, attention)
    model = Captioner(config).to(device).train()
    if compiled:
        torch._dynamo.reset()
        model.decoder.compile_recurrence()
    optimizer = build_optimizer("adam", model.decoder.parameters(), lr=1e-4)  # the trainer's
    feats = torch.randn(batch, dims.L, dims.D, device=device)  # (B, L, D)
    captions = torch.randint(len(SPECIALS), dims.V, (batch, length + 2), device=device)  # (B, T+1)
    captions[:, 0], captions[:, -1] = Vocab.start_id, Vocab.end_id
    hard, baseline = config.attention == "hard", MovingBaseline(config.hard.baseline_decay)

    def step() -> None:
        with autocast(device, precision):  # once per step: weights are cast once per step
            out = model(None, captions, feats=feats)
            loss = caption_loss(out, captions[:, 1:], dsa_lambda=0.0 if hard else 1.0,
                                hard=config.hard if hard else None, baseline=baseline).total
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.decoder.parameters(), 5.0)
        optimizer.step()

    started = time.perf_counter()
    step()  # the compile, when there is one
    sync(device)
    first_s = time.perf_counter() - started
    seconds, mem = timed(step, device, min_time=min_time)
    T, short = length + 1, {"warmup": 1, "min_time": min_time / 4, "max_runs": 5}
    shapes = train_gemms(dims, batch, T)
    gemm_s = timed(gemm_runner(shapes, device, DTYPES[precision], backward=True), device, **short)[0]
    floor_s, floor_p = (gemm_floor(shapes, device, precision, gemm_s, backward=True, **short) if floor
                        else (float("nan"), ""))
    attn_s = timed(attention_train_runner(model, dims, batch, T, device, precision), device, **short)[0]
    return {"device": device.type, "precision": precision, "dims": dims.name, "attention": attention,
            "batch": batch, "compiled": compiled, "first_step_s": first_s, "steps": T,
            "captions_per_s": batch / seconds, "ms_per_step": 1000 * seconds,
            "gemm_ms": 1000 * gemm_s, "attention_ms": 1000 * attn_s, "floor_ms": 1000 * floor_s,
            "floor_precision": floor_p, "ceiling_captions_per_s": batch / floor_s,
            "step_over_floor": seconds / floor_s, "peak_mb": mem.mb}


LARGE_BATCHES = (512, 2048)  # on a GPU also: batches that can fill it (batch 32 is launch-bound there)


def run_train(devices: list[torch.device], *, quick: bool = False, precision: str = "all") -> list[dict[str, Any]]:
    """Every size, attention and precision at batch 32; on a GPU also at the large batches, and the largest
    again with the recurrence compiled (COCO size, soft attention, bf16)."""
    sizes = [QUICK] if quick else [COCO, PAPER]
    kwargs = {"batch": 4, "length": 4, "min_time": 0.0} if quick else {}
    rows = []
    for device, p in cases(devices, precision):
        gpu = device.type == "cuda" and not quick
        batches = [kwargs.get("batch", 32), *(LARGE_BATCHES if gpu else ())]
        for dims in sizes:
            for attention in ("soft", "hard"):
                rows += [progress(train_case(dims, attention, device, p, **{**kwargs, "batch": b})) for b in batches]
                if gpu and dims is COCO and attention == "soft" and p == "bf16":  # one compile: about a minute
                    rows.append(progress(train_case(dims, attention, device, p, batch=LARGE_BATCHES[-1],
                                                    compiled=True)))
    return rows
