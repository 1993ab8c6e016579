"""Benchmarks (not tests): training throughput, decoding speed and bf16-vs-fp32 agreement.

    python -m sat_core.bench train  [--device auto|cpu|cuda] [--precision all|auto|fp32|bf16] [--quick] [--json OUT]
    python -m sat_core.bench decode [--device …] [--precision …] [--model all|coco|shipped] [--quick] [--json OUT]
    python -m sat_core.bench agreement --checkpoint checkpoints/shapes_soft --data data/world/dataset.json --images data/world
    python -m sat_core.bench compile [--device …] [--quick]
    python -m sat_core.bench graph --device cuda [--quick] [--json OUT]

Every table says which precision ran (``sat_core.precision``); ``--precision all`` (the default) runs
fp32 and, where the hardware has native bf16, bf16: one table per precision.

``train`` and ``decode`` run the decoder on precomputed random annotations (B, L, D), so the encoder
is left out and the figures depend only on the dimensions (untrained weights run as fast as trained).

``train``: one optimizer step (teacher-forced ``Captioner.forward(None, captions, feats=…)``, the
project's loss, backward, Adam) on 32 captions of 20 words + <end> (21 steps), soft and hard
attention, at COCO dimensions (L = 196 = 14×14, D = 2048, LSTM 512, embedding 512, attention MLP 512,
vocabulary 10,000) and at the paper's (D = 512, LSTM 1024).

``decode``: ``beam_search`` images/s for greedy and beam 3 and 5 at batch sizes 1, 16 and 64, 20
steps, at the shipped model's size (checkpoints/shapes_soft when present, decoding annotations of generated
world scenes) and at COCO size (<end> made unreachable so every decode runs all 20 steps), and the
batch-64 images decoded one at a time (the speed-up of batching).

Each row splits a step into parts timed alone at the same N = B·K rows (decode) or B captions × T
steps (train, forward + backward): the weight GEMMs alone (random tensors of the step's shapes, in
the row's precision), the attention block alone (the model's own ``AttentionMLP`` + context product),
the decoder step alone, and the whole step; and the whole step as a multiple of the GEMM floor:
the weight GEMMs alone in the fastest precision this hardware has (fp32 or bf16, whichever ran
them faster; the column says which), what a step cannot go below here. The floor gives each row a
ceiling (images/s or captions/s with nothing but the floor's products in a step) and the serial
table the ceiling of batching's speed-up (the ceiling against one image at a time): a target above
the ceiling cannot be met on this hardware by anything outside its matrix products.

``compile``: the no-grad attention block of a decode step (add, σ, the product with w) at COCO size,
batch 64 × beam 5, fp32: the project's chunked eager block against ``torch.compile`` of the plain
expression (which Inductor fuses into one loop), with the seconds the compile took and the largest
difference between the two.

``graph`` (CUDA only): ``Decoder.step`` at COCO size, beam 5, batches 1, 16 and 64, soft attention,
fp32 and bf16, three ways: eager, replayed from a CUDA graph captured once (``torch.cuda.graph``), and
``torch.compile(mode="reduce-overhead")`` (Inductor's kernels inside its own CUDA graphs), with the
seconds each took to build and the largest logit difference from eager; beside them the whole beam
step of ``beam_search`` at the same size, eager, for scale. A GPU step of this model is a few hundred
small kernels, so launching them, not running them, is what a graph can save.

``agreement``: decodes a checkpoint's split in fp32 and in bf16 and reports the share of images whose
best caption is the same, and both BLEU-4s.

Peak memory is the CUDA allocator's peak above the level before the run, or on CPU the growth of
the process's peak resident set (VmHWM, reset through /proc/self/clear_refs) over the RSS before it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sat_core import native
from sat_core.allocator import keep_freed_memory
from sat_core.config import DecodeConfig, ModelConfig
from sat_core.decoding import beam_search, pick_device
from sat_core.errors import SatError
from sat_core.models.attention import attend
from sat_core.models.captioner import Captioner
from sat_core.precision import PRECISIONS, autocast, cpu_has_bf16, describe_cpu, resolve
from sat_core.data.vocab import SPECIALS, Vocab

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints" / "shapes_soft"


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

def _sync(device: torch.device) -> None:
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
            _sync(self.device)
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
            _sync(self.device)
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
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            elapsed = time.perf_counter() - start
            best, spent, runs = min(best, elapsed), spent + elapsed, runs + 1
    return best, mem


def _cases(devices: list[torch.device], choice: str) -> list[tuple[torch.device, str]]:
    """(device, precision) pairs: ``all`` is fp32 and, where the hardware has bf16 instructions, bf16
    (also where they are slower than fp32 and ``auto`` runs fp32: the table shows it)."""
    if choice != "all":
        return [(d, resolve(d, choice)) for d in devices]
    has_bf16 = {d: d.type == "cuda" or cpu_has_bf16() for d in devices}
    return [(d, p) for d in devices for p in ("fp32", "bf16") if p == "fp32" or has_bf16[d]]


def _progress(row: dict[str, Any]) -> dict[str, Any]:
    """Show each figure as it comes (a full run takes minutes); stderr keeps stdout to the tables."""
    print("  " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
          file=sys.stderr, flush=True)
    return row


# ---- the parts of a step, timed alone ----------------------------------------------------------------

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
        times[other] = timed(gemm_runner(shapes, device, _DTYPES[other], backward=backward), device, **short)[0]
    best = min(times, key=times.get)
    return times[best], best


def _timed_in(precision: str, fn: Callable[[], Any], device: torch.device, **kwargs: Any) -> float:
    """Best time of ``fn`` with autocast entered once around all runs (as beam_search does)."""
    with autocast(device, precision):
        return timed(fn, device, **kwargs)[0]


def attention_decode_runner(model: Captioner, dims: Dims, B: int, K: int, device: torch.device,
                            precision: str) -> Callable[[], None]:
    """The model's attention block alone at N = B·K rows: α from h (f_att) and the context product."""
    dec = model.decoder
    with torch.no_grad(), autocast(device, precision):
        prep, _, _ = dec.prepare(torch.randn(B, dims.L, dims.D, device=device))  # (B, L, A)
    h = torch.randn(B * K, dims.n, device=device)  # (N, n)

    @torch.no_grad()
    def run() -> None:
        attend(prep.feats, dec.attention(prep.proj, h))  # (N, L) -> (N, D)

    return run


def step_decode_runner(model: Captioner, dims: Dims, B: int, K: int, device: torch.device,
                       precision: str) -> Callable[[], None]:
    """``Decoder.step`` alone at N = B·K rows (no beam bookkeeping)."""
    dec = model.decoder
    with torch.no_grad(), autocast(device, precision):
        prep, h, c = dec.prepare(torch.randn(B, dims.L, dims.D, device=device))
    h, c = h.repeat_interleave(K, 0), c.repeat_interleave(K, 0)  # (N, n)
    tokens = torch.full((B * K,), len(SPECIALS), dtype=torch.long, device=device)

    @torch.no_grad()
    def run() -> None:
        dec.step(tokens, h, c, prep)

    return run


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


# ---- train --------------------------------------------------------------------------------------------

def train_case(dims: Dims, attention: str, device: torch.device, precision: str = "fp32", *, batch: int = 32,
               length: int = 20, min_time: float = 1.0, floor: bool = True) -> dict[str, Any]:
    """Captions/s, the parts of a step timed alone, and peak memory of training steps on random data."""
    from sat_core.training.losses import MovingBaseline, caption_loss
    from sat_core.training.trainer import build_optimizer

    torch.manual_seed(0)
    config = model_config(dims, attention)
    model = Captioner(config).to(device).train()
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

    seconds, mem = timed(step, device, min_time=min_time)
    T, short = length + 1, {"warmup": 1, "min_time": min_time / 4, "max_runs": 5}
    shapes = train_gemms(dims, batch, T)
    gemm_s = timed(gemm_runner(shapes, device, _DTYPES[precision], backward=True), device, **short)[0]
    floor_s, floor_p = (gemm_floor(shapes, device, precision, gemm_s, backward=True, **short) if floor
                        else (float("nan"), ""))
    attn_s = timed(attention_train_runner(model, dims, batch, T, device, precision), device, **short)[0]
    return {"device": device.type, "precision": precision, "dims": dims.name, "attention": attention,
            "batch": batch, "steps": T, "captions_per_s": batch / seconds, "ms_per_step": 1000 * seconds,
            "gemm_ms": 1000 * gemm_s, "attention_ms": 1000 * attn_s, "floor_ms": 1000 * floor_s,
            "floor_precision": floor_p, "ceiling_captions_per_s": batch / floor_s,
            "step_over_floor": seconds / floor_s, "peak_mb": mem.mb}


def run_train(devices: list[torch.device], *, quick: bool = False, precision: str = "all") -> list[dict[str, Any]]:
    sizes = [QUICK] if quick else [COCO, PAPER]
    kwargs = {"batch": 4, "length": 4, "min_time": 0.0} if quick else {}
    return [_progress(train_case(dims, attention, device, p, **kwargs))
            for device, p in _cases(devices, precision) for dims in sizes for attention in ("soft", "hard")]


# ---- decode -------------------------------------------------------------------------------------------

@dataclass
class DecodeModel:
    """A model to decode with and annotations of ``batch`` images for it."""

    name: str
    model: Captioner
    vocab: Vocab
    feats: torch.Tensor  # (B, L, D)
    dims: Dims


def random_model(dims: Dims, images: int, *, name: str | None = None) -> DecodeModel:
    """Untrained weights with <end> unreachable, and random annotations."""
    torch.manual_seed(0)
    model = Captioner(model_config(dims)).eval()
    with torch.no_grad():
        model.decoder.L_o.bias[Vocab.end_id] = -1e4
    vocab = Vocab([*SPECIALS, *(f"w{i}" for i in range(dims.V - len(SPECIALS)))])
    feats = torch.randn(images, dims.L, dims.D)  # (B, L, D)
    return DecodeModel(name or dims.name, model, vocab, feats, dims)


def shipped_model(images: int) -> DecodeModel:
    """checkpoints/shapes_soft on the annotations of generated world scenes, else a default-sized random model."""
    if not (SHIPPED / "config.json").is_file():
        config = ModelConfig(vocab_size=64)
        dims = dims_of(config, 196, "default ModelConfig V64")
        return random_model(dims, images)
    import numpy as np
    from PIL import Image

    from sat_core.checkpoint import load_checkpoint
    from sat_core.data.images import preprocess
    from sat_core.worlds.shapes import scene as world

    loaded = load_checkpoint(SHIPPED)
    rng = np.random.default_rng(0)
    scenes = [Image.fromarray(world.render(world.generate_scene(rng))) for _ in range(images)]
    batch = torch.stack([preprocess(img, loaded.preprocess)[0] for img in scenes])  # (B, 3, S, S)
    with torch.no_grad():
        feats = loaded.model.encode(batch).feats  # (B, L, D)
    dims = dims_of(loaded.model_config, feats.shape[1], "shipped checkpoints/shapes_soft")
    return DecodeModel(dims.name, loaded.model, loaded.vocab, feats, dims)


def _steps_taken(results) -> int:
    """Decode steps the batch ran: the longest returned hypothesis."""
    return max(len(h.tokens) for hyps in results for h in hyps)


def decode_case(dm: DecodeModel, device: torch.device, precision: str, K: int, B: int, max_len: int,
                min_time: float, floor: bool = True) -> dict[str, Any]:
    """images/s and the parts of one step timed alone, at N = B·K rows, and peak memory of one batch."""
    feats, cfg = dm.feats[:B].to(device), DecodeConfig(beam_size=K, max_len=max_len, precision=precision)
    results: list = []

    def run() -> None:
        results[:] = beam_search(dm.model, feats, dm.vocab, cfg)

    seconds, mem = timed(run, device, min_time=min_time)
    steps = _steps_taken(results)
    step_ms = 1000 * seconds / steps
    short = {"warmup": 2, "min_time": min_time / 4, "max_runs": 20}
    shapes = decode_gemms(dm.dims, B * K)
    gemm_s = timed(gemm_runner(shapes, device, _DTYPES[precision]), device, **short)[0]
    floor_s, floor_p = gemm_floor(shapes, device, precision, gemm_s, **short) if floor else (float("nan"), "")
    gemm_ms, floor_ms = 1000 * gemm_s, 1000 * floor_s
    attn_ms = 1000 * _timed_in(precision, attention_decode_runner(dm.model, dm.dims, B, K, device, precision),
                               device, **short)
    dec_ms = 1000 * _timed_in(precision, step_decode_runner(dm.model, dm.dims, B, K, device, precision),
                              device, **short)
    return {"device": device.type, "precision": precision, "model": dm.name, "beam": K, "batch": B,
            "images_per_s": B / seconds, "steps": steps, "ms_per_step": step_ms, "decoder_step_ms": dec_ms,
            "gemm_ms": gemm_ms, "attention_ms": attn_ms, "floor_ms": floor_ms, "floor_precision": floor_p,
            "ceiling_images_per_s": 1000 * B / (steps * floor_ms),
            "step_over_gemm": step_ms / gemm_ms, "step_over_floor": step_ms / floor_ms, "peak_mb": mem.mb,
            "fused_loops": device.type == "cpu" and native.available()}


def one_by_one_case(dm: DecodeModel, device: torch.device, precision: str, K: int, B: int, max_len: int,
                    batched: dict[str, Any]) -> dict[str, Any]:
    """The same B images decoded one at a time: images/s, the speed-up of batching (``batched`` is
    ``decode_case``'s row for these images), and the most it could be: the batched row's ceiling
    (nothing but its GEMM floor in a step) against one at a time."""
    feats = dm.feats[:B].to(device)
    cfg = DecodeConfig(beam_size=K, max_len=max_len, precision=precision)
    run = lambda: [beam_search(dm.model, feats[i : i + 1], dm.vocab, cfg) for i in range(B)]  # noqa: E731
    seconds, _ = timed(run, device, warmup=0, max_runs=1)
    return {"device": device.type, "precision": precision, "model": dm.name, "beam": K,
            "batch": B, "batched_images_per_s": batched["images_per_s"], "one_by_one_images_per_s": B / seconds,
            "speedup": batched["images_per_s"] * seconds / B,
            "ceiling_speedup": batched["ceiling_images_per_s"] * seconds / B}


def run_decode(devices: list[torch.device], *, quick: bool = False, precision: str = "all",
               which: str = "all") -> dict[str, list[dict[str, Any]]]:
    beams, batches = ((1, 2), (1, 4)) if quick else ((1, 3, 5), (1, 16, 64))
    max_len, min_time = (4, 0.0) if quick else (20, 1.0)
    if quick:
        models = [random_model(QUICK, max(batches))]
    else:
        models = ([shipped_model(64)] if which in ("all", "shipped") else []) + \
                 ([random_model(COCO, 64)] if which in ("all", "coco") else [])
    rows, serial = [], []
    for device, p in _cases(devices, precision):
        for dm in models:
            dm.model.to(device)
            for K in beams:
                for B in batches:
                    rows.append(_progress(decode_case(dm, device, p, K, B, max_len, min_time)))
                serial.append(_progress(one_by_one_case(dm, device, p, K, B, max_len, rows[-1])))
            dm.model.to("cpu")
    return {"decode": rows, "one_by_one": serial}


# ---- agreement: bf16 vs fp32 on a checkpoint's split ----------------------------------------------------

def run_agreement(checkpoint: str, data_path: str, images: str, split: str, beam: int, max_len: int,
                  device: torch.device, limit: int = 0, length_norm: float = 0.0) -> dict[str, Any]:
    """Best captions in fp32 and bf16 for every image of ``split``: the share that agree, both BLEU-4s."""
    from sat_core.checkpoint import load_checkpoint
    from sat_core.data.karpathy import EvalImages, ImageStore, load_karpathy, normalise
    from sat_core.evaluation.metrics import caption_metrics

    loaded = load_checkpoint(checkpoint)
    model = loaded.model.to(device).eval()
    data = load_karpathy(data_path, images)
    store = ImageStore(data, loaded.preprocess, splits=(split,), progress=False)
    evals = EvalImages(data, split, store, batch_size=64)
    if limit:
        evals.image_ids = evals.image_ids[:limit]
    captions: dict[str, dict[int, str]] = {"fp32": {}, "bf16": {}}
    refs: dict[int, list[str]] = {}
    seconds = {"fp32": 0.0, "bf16": 0.0}
    for ids, batch in evals:
        batch = normalise(batch.to(device), loaded.preprocess)
        for p in captions:
            started = time.perf_counter()
            cfg = dataclasses.replace(loaded.decode_defaults(), beam_size=beam, max_len=max_len,
                                      length_norm=length_norm, precision=p)
            hyps = beam_search(model, batch, loaded.vocab, cfg)
            seconds[p] += time.perf_counter() - started
            for i, h in zip(ids, hyps):
                captions[p][i] = h[0].caption
        for i in ids:
            refs[i] = [" ".join(s) for s in evals.references(i)]
    bleu = {p: caption_metrics(refs, c, meteor=False).corpus["BLEU-4"] for p, c in captions.items()}
    same = sum(captions["fp32"][i] == captions["bf16"][i] for i in refs)
    return {"checkpoint": checkpoint, "split": split, "images": len(refs), "beam": beam,
            "length_norm": length_norm, "device": device.type,
            "same_best_caption": same / max(len(refs), 1), "bleu4_fp32": bleu["fp32"], "bleu4_bf16": bleu["bf16"],
            "bleu4_delta": bleu["bf16"] - bleu["fp32"], "seconds_fp32": seconds["fp32"],
            "seconds_bf16": seconds["bf16"],
            "differing": [{"image": i, "fp32": captions["fp32"][i], "bf16": captions["bf16"][i]}
                          for i in refs if captions["fp32"][i] != captions["bf16"][i]]}


# ---- compile: the attention block eager vs torch.compile ---------------------------------------------

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
        _sync(device)
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


# ---- graph: the decode step eager, as a CUDA graph, and compiled with mode="reduce-overhead" ----------

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
        _sync(device)
        graph_build_s = time.perf_counter() - started
        graph_diff = float((captured.float() - reference).abs().max())
        graph_ms = 1000 * timed(_repeat(graph.replay, reps), device, **short)[0] / reps

        started = time.perf_counter()
        compiled = torch.compile(step, mode="reduce-overhead", dynamic=False)
        for _ in range(3):  # reduce-overhead records its graph on the third call
            out = compiled()
        _sync(device)
        compile_s = time.perf_counter() - started
        compiled_diff = float((out.float() - reference).abs().max())
        compiled_ms = 1000 * timed(_repeat(compiled, reps), device, **short)[0] / reps

    cfg = DecodeConfig(beam_size=K, max_len=20, precision=precision)
    results: list = []

    def search() -> None:
        results[:] = beam_search(dm.model, feats, dm.vocab, cfg)

    beam_ms = 1000 * timed(search, device, **short)[0] / _steps_taken(results)  # warm-up filled results
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
    for _, p in _cases([device], precision):
        for B in batches:
            torch._dynamo.reset()  # each case compiles afresh: its compile_s is a first compile
            rows.append(_progress(graph_case(dm, device, p, B, 2 if quick else 5, reps)))
    return rows


GRAPH_COLUMNS = [("device", "device", ""), ("beam", "beam", "d"), ("batch", "batch", "d"),
                 ("beam_step_ms", "beam step ms (eager)", ".2f"), ("eager_ms", "decoder step ms eager", ".3f"),
                 ("graph_ms", "CUDA graph", ".3f"), ("compiled_ms", "reduce-overhead", ".3f"),
                 ("graph_speedup", "graph ×", ".1f"), ("compiled_speedup", "compiled ×", ".1f"),
                 ("graph_build_s", "capture s", ".2f"), ("compile_s", "compile s", ".1f"),
                 ("graph_max_diff", "graph Δ", ".1e"), ("compiled_max_diff", "compiled Δ", ".1e")]


# ---- command line -------------------------------------------------------------------------------

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """Rows as a fixed-width text table; columns are (key, header, format)."""
    cells = [[header for _, header, _ in columns]]
    cells += [[format(row[key], fmt) for key, _, fmt in columns] for row in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells)


TRAIN_COLUMNS = [("device", "device", ""), ("dims", "dimensions", ""), ("attention", "attention", ""),
                 ("batch", "batch", "d"), ("steps", "steps", "d"), ("captions_per_s", "captions/s", ".1f"),
                 ("ms_per_step", "ms/step", ".1f"), ("gemm_ms", "GEMMs ms", ".1f"),
                 ("attention_ms", "attention ms", ".1f"), ("floor_ms", "floor ms", ".1f"),
                 ("floor_precision", "floor in", ""), ("step_over_floor", "step/floor", ".2f"),
                 ("ceiling_captions_per_s", "ceiling c/s", ".1f"), ("peak_mb", "peak MB", ".0f")]
DECODE_COLUMNS = [("device", "device", ""), ("model", "model", ""), ("beam", "beam", "d"),
                  ("batch", "batch", "d"), ("images_per_s", "images/s", ".1f"), ("steps", "steps", "d"),
                  ("ms_per_step", "ms/step", ".2f"), ("decoder_step_ms", "decoder step ms", ".2f"),
                  ("gemm_ms", "GEMMs ms", ".2f"), ("attention_ms", "attention ms", ".2f"),
                  ("floor_ms", "floor ms", ".2f"), ("floor_precision", "floor in", ""),
                  ("step_over_floor", "step/floor", ".2f"), ("ceiling_images_per_s", "ceiling img/s", ".1f"),
                  ("peak_mb", "peak MB", ".1f")]
SERIAL_COLUMNS = [("device", "device", ""), ("model", "model", ""),
                  ("beam", "beam", "d"), ("batch", "images", "d"),
                  ("batched_images_per_s", "batched img/s", ".1f"),
                  ("one_by_one_images_per_s", "one-by-one img/s", ".1f"), ("speedup", "speed-up", ".1f"),
                  ("ceiling_speedup", "ceiling speed-up", ".1f")]


def _by_precision(rows: list[dict[str, Any]], columns, title: str) -> str:
    """One table per precision, each titled with it."""
    out = []
    for p in dict.fromkeys(r["precision"] for r in rows):
        out.append(f"{title} — precision {p}\n" + table([r for r in rows if r["precision"] == p], columns))
    return "\n\n".join(out)


def _devices(name: str) -> list[torch.device]:
    if name == "auto":
        return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    return [pick_device(name)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sat_core.bench", description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("train", "decode", "agreement", "compile", "graph"))
    p.add_argument("--device", default="auto", help="auto (CPU, and CUDA when present) | cpu | cuda")
    p.add_argument("--precision", default="all", choices=("all", *PRECISIONS),
                   help="all: fp32 and, where the hardware has native bf16, bf16 (train, decode)")
    p.add_argument("--model", default="all", choices=("all", "coco", "shipped"), help="decode: which models")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a benchmark")
    p.add_argument("--json", dest="json_out", help="also write the figures to this JSON file")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0: torch's default)")
    p.add_argument("--fused", default="on", choices=("on", "off"),
                   help="the fused CPU loops of sat_core/native: on where they build (default), or off: "
                        "the PyTorch code alone, as a baseline")
    p.add_argument("--checkpoint", default="checkpoints/shapes_soft", help="agreement: the checkpoint")
    p.add_argument("--data", default="data/world/dataset.json", help="agreement: Karpathy-format dataset JSON")
    p.add_argument("--images", default="data/world", help="agreement: the dataset's image folder")
    p.add_argument("--split", default="test", help="agreement: the split to decode")
    p.add_argument("--beam", type=int, default=3, help="agreement: beam size")
    p.add_argument("--max-len", type=int, default=20, help="agreement: length cap")
    p.add_argument("--length-norm", type=float, default=0.0,
                   help="agreement: beam search's length normalisation (the scenes models are evaluated with 1)")
    p.add_argument("--limit", type=int, default=0, help="agreement: first N images only (0: all)")
    return p


def run(what: str, devices: list[torch.device], *, quick: bool = False, precision: str = "all",
        which: str = "all") -> dict[str, Any]:
    """Run one benchmark, print its tables, return the figures."""
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {describe_cpu()}, "
          f"fused CPU loops (sat_core/native) {'on' if native.available() else 'off'}"
          + "".join(f", {torch.cuda.get_device_name(d)}" for d in devices if d.type == "cuda"))
    if what == "train":
        figures: dict[str, Any] = {"train": run_train(devices, quick=quick, precision=precision)}
        print(_by_precision(figures["train"], TRAIN_COLUMNS, "training"))
        return figures
    figures = run_decode(devices, quick=quick, precision=precision, which=which)
    print(_by_precision(figures["decode"], DECODE_COLUMNS, "decoding"))
    print()
    print(_by_precision(figures["one_by_one"], SERIAL_COLUMNS, "batched vs one image at a time (the same images)"))
    return figures


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    keep_freed_memory()
    try:
        devices = _devices(args.device)
        if args.threads < 0:
            raise SatError(f"--threads must be 0 (default) or more, not {args.threads}.")
    except SatError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads or threads)
    try:
        off = native.disabled() if args.fused == "off" else contextlib.nullcontext()
        with off:
            figures = _run_command(args, devices)
    except SatError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)  # main() may run inside another program (tests)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(figures, indent=1) + "\n")
        print(f"wrote {args.json_out}")
    return 0


def _run_command(args: argparse.Namespace, devices: list[torch.device]) -> dict[str, Any]:
    """The command's figures, its tables printed."""
    if args.what == "agreement":
        figures = run_agreement(args.checkpoint, args.data, args.images, args.split, args.beam, args.max_len,
                                devices[-1], args.limit, args.length_norm)
        print(f"{figures['checkpoint']} {figures['split']} split, {figures['images']} images, beam "
              f"{figures['beam']}, length normalisation {figures['length_norm']}, {figures['device']}: "
              "same best caption in bf16 and fp32 for "
              f"{100 * figures['same_best_caption']:.1f} %; BLEU-4 fp32 {figures['bleu4_fp32']:.4f}, "
              f"bf16 {figures['bleu4_bf16']:.4f} (Δ {figures['bleu4_delta']:+.4f}); decoding "
              f"{figures['seconds_fp32']:.1f} s fp32, {figures['seconds_bf16']:.1f} s bf16")
    elif args.what == "compile":
        figures = run_compile(devices[-1], quick=args.quick)
        print(f"attention block, batch {figures['batch']} × beam {figures['beam']}, {figures['device']}, fp32: "
              f"chunked eager {figures['eager_chunked_ms']:.1f} ms, whole eager {figures['eager_whole_ms']:.1f} ms, "
              f"torch.compile {figures['compiled_ms']:.1f} ms after {figures['compile_s']:.0f} s of compiling "
              f"(largest difference {figures['max_abs_diff']:.1e})"
              + (f"; fused C loop (sat_core/native) {figures['fused_ms']:.1f} ms (largest difference "
                 f"{figures['fused_max_abs_diff']:.1e})" if figures["fused_ms"] is not None else
                 "; fused C loop not available here"))
    elif args.what == "graph":
        figures = {"graph": run_graph(devices[-1], quick=args.quick, precision=args.precision)}
        print(_by_precision(figures["graph"], GRAPH_COLUMNS,
                            "the decode step (Decoder.step, soft attention) eager, as a CUDA graph, compiled"))
    else:
        figures = run(args.what, devices, quick=args.quick, precision=args.precision, which=args.model)
    return figures


if __name__ == "__main__":
    sys.exit(main())
