"""Benchmarks (not tests): training throughput and decoding speed, with peak memory.

    python -m sat_core.bench train  [--device auto|cpu|cuda] [--quick] [--json OUT]
    python -m sat_core.bench decode [--device auto|cpu|cuda] [--quick] [--json OUT]

Both run the decoder on precomputed random annotations (B, L, D), so the encoder is left out and the
figures depend only on the dimensions (untrained weights decode as fast as trained ones).

``train``: one optimizer step (teacher-forced forward through ``Captioner.forward(None, captions,
feats=…)``, the project's loss, backward, Adam) on 32 captions of 16 words, soft and hard attention,
at the paper's dimensions (L = 196 = 14×14, D = 512, vocabulary 10,000; we choose embedding m = 512,
LSTM n = 1024, attention MLP 512) and at ResNet dimensions (D = 2048, the rest the same).

``decode``: ``beam_search`` images/s for greedy and beam 3 and 5 at batch sizes 1, 16 and 64, at the
shipped model's size (checkpoints/soft when present, decoding annotations of generated world scenes;
else a default ModelConfig) and at COCO/ResNet size (14×14×2048, LSTM 512, embedding 512, attention
512, vocabulary 10,000; <end> is made unreachable so every decode runs the full 16 steps). It also
decodes the batch-64 images one at a time (the speed-up of batching) and compares the time of one
decode step with the time of that step's matrix products alone at the same N = B·K rows.

Peak memory is the CUDA allocator's peak above the level before the run, or on CPU the growth of
the process's peak resident set (VmHWM, reset through /proc/self/clear_refs) over the RSS before it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sat_core.config import DecodeConfig, ModelConfig
from sat_core.decoding import beam_search, pick_device
from sat_core.errors import SatError
from sat_core.models.captioner import Captioner
from sat_core.vocab import SPECIALS, Vocab

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints" / "soft"


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


def _autocast(device: torch.device, bf16: bool):
    return torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def _cases(devices: list[torch.device]) -> list[tuple[torch.device, bool]]:
    """(device, bf16) pairs: fp32 everywhere, plus bf16 autocast on CUDA."""
    return [(d, False) for d in devices] + [(d, True) for d in devices if d.type == "cuda"]


# ---- train --------------------------------------------------------------------------------------------

def train_case(dims: Dims, attention: str, device: torch.device, *, bf16: bool = False, batch: int = 32,
               length: int = 16, min_time: float = 1.0) -> dict[str, Any]:
    """Captions/s and peak memory of training steps on random annotations and captions."""
    from sat_core.losses import MovingBaseline, caption_loss

    torch.manual_seed(0)
    config = model_config(dims, attention)
    model = Captioner(config).to(device).train()
    optimizer = torch.optim.Adam(model.decoder.parameters(), lr=1e-4)
    feats = torch.randn(batch, dims.L, dims.D, device=device)  # (B, L, D)
    captions = torch.randint(len(SPECIALS), dims.V, (batch, length + 2), device=device)  # (B, T+1)
    captions[:, 0], captions[:, -1] = Vocab.start_id, Vocab.end_id
    hard, baseline = config.attention == "hard", MovingBaseline(config.hard.baseline_decay)

    def step() -> None:
        with _autocast(device, bf16):
            out = model(None, captions, feats=feats)
            loss = caption_loss(out, captions[:, 1:], dsa_lambda=0.0 if hard else 1.0,
                                hard=config.hard if hard else None, baseline=baseline).total
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.decoder.parameters(), 5.0)
        optimizer.step()

    seconds, mem = timed(step, device, min_time=min_time)
    return {"device": device.type, "dtype": "bf16" if bf16 else "fp32", "dims": dims.name,
            "attention": attention, "batch": batch, "steps": length + 1,
            "captions_per_s": batch / seconds, "ms_per_step": 1000 * seconds, "peak_mb": mem.mb}


def _progress(row: dict[str, Any]) -> dict[str, Any]:
    """Show each figure as it comes (a full run takes minutes); stderr keeps stdout to the tables."""
    print("  " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
          file=sys.stderr, flush=True)
    return row


def run_train(devices: list[torch.device], *, quick: bool = False) -> list[dict[str, Any]]:
    sizes = [QUICK] if quick else [PAPER, RESNET]
    kwargs = {"batch": 4, "length": 4, "min_time": 0.0} if quick else {}
    return [_progress(train_case(dims, attention, device, bf16=bf16, **kwargs))
            for device, bf16 in _cases(devices) for dims in sizes for attention in ("soft", "hard")]


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
    """checkpoints/soft on the annotations of generated world scenes, else a default-sized random model."""
    if not (SHIPPED / "config.json").is_file():
        config = ModelConfig(vocab_size=64)
        dims = dims_of(config, 196, "default ModelConfig V64")
        return random_model(dims, images)
    import numpy as np
    from PIL import Image

    from sat_core import world
    from sat_core.checkpoint import load_checkpoint
    from sat_core.images import preprocess

    loaded = load_checkpoint(SHIPPED)
    rng = np.random.default_rng(0)
    scenes = [Image.fromarray(world.render(world.generate_scene(rng))) for _ in range(images)]
    batch = torch.stack([preprocess(img, loaded.preprocess)[0] for img in scenes])  # (B, 3, S, S)
    with torch.no_grad():
        feats = loaded.model.encode(batch).feats  # (B, L, D)
    dims = dims_of(loaded.model_config, feats.shape[1], "shipped checkpoints/soft")
    return DecodeModel(dims.name, loaded.model, loaded.vocab, feats, dims)


def step_matmuls(dims: Dims, B: int, K: int, device: torch.device, dtype: torch.dtype) -> Callable[[], None]:
    """One decode step's matrix products alone (raw matmul/bmm/addmm) on same-shaped random tensors."""
    L, D, V, m, n, A, N = dims.L, dims.D, dims.V, dims.m, dims.n, dims.A, B * K
    r = lambda *shape: torch.randn(*shape, device=device, dtype=dtype)  # noqa: E731
    h, x, ctx, emb = r(N, n), r(N, m + D), r(N, D), r(N, m)
    W_h, proj, w = r(n, A), r(B, 1, L, A), r(A, 1)
    alpha, feats = r(B, K, L), r(B, L, D)
    W_ih, W_hh, b_g = r(m + D, 4 * n), r(n, 4 * n), r(4 * n)
    L_h, L_z, L_o, b_o, f_beta = r(n, m), r(D, m), r(m, V), r(V), r(n, 1)

    def run() -> None:
        wh = torch.matmul(h, W_h).view(B, K, 1, A)  # W_h h_{t−1}: (B, K, 1, A)
        torch.matmul(torch.tanh(proj + wh).view(N * L, A), w)  # e = w^T tanh(…): (N·L, 1)
        torch.bmm(alpha, feats)  # ẑ = α·a: (B, K, D)
        torch.matmul(h, f_beta)  # β gate: (N, 1)
        torch.addmm(torch.addmm(b_g, x, W_ih), h, W_hh)  # LSTM gates: (N, 4n)
        torch.matmul(h, L_h) + torch.matmul(ctx, L_z)  # L_h h, L_z ẑ: (N, m)
        torch.addmm(b_o, emb, L_o)  # L_o: (N, V)

    return run


def _steps_taken(results) -> int:
    """Decode steps the batch ran: the longest returned hypothesis."""
    return max(len(h.tokens) for hyps in results for h in hyps)


def decode_case(dm: DecodeModel, device: torch.device, bf16: bool, K: int, B: int, max_len: int,
                min_time: float) -> dict[str, Any]:
    """images/s, steps, ms/step, the step's matrix products alone, and peak memory of one batch."""
    feats, cfg = dm.feats[:B].to(device), DecodeConfig(beam_size=K, max_len=max_len)
    results: list = []

    def run() -> None:
        results[:] = beam_search(dm.model, feats, dm.vocab, cfg, amp=bf16)

    seconds, mem = timed(run, device, min_time=min_time)
    steps = _steps_taken(results)
    dtype = torch.bfloat16 if bf16 else torch.float32
    matmul_s, _ = timed(step_matmuls(dm.dims, B, K, device, dtype), device, warmup=2, min_time=min_time / 4,
                        max_runs=20)
    step_ms = 1000 * seconds / steps
    return {"device": device.type, "dtype": "bf16" if bf16 else "fp32", "model": dm.name, "beam": K,
            "batch": B, "images_per_s": B / seconds, "steps": steps, "ms_per_step": step_ms,
            "matmul_ms_per_step": 1000 * matmul_s, "step_over_matmul": step_ms / (1000 * matmul_s),
            "peak_mb": mem.mb}


def one_by_one_case(dm: DecodeModel, device: torch.device, bf16: bool, K: int, B: int, max_len: int,
                    batched_images_per_s: float) -> dict[str, Any]:
    """The same B images decoded one at a time: images/s and the speed-up of batching."""
    feats, cfg = dm.feats[:B].to(device), DecodeConfig(beam_size=K, max_len=max_len)
    run = lambda: [beam_search(dm.model, feats[i : i + 1], dm.vocab, cfg, amp=bf16) for i in range(B)]  # noqa: E731
    seconds, _ = timed(run, device, warmup=0, max_runs=1)
    return {"device": device.type, "dtype": "bf16" if bf16 else "fp32", "model": dm.name, "beam": K,
            "batch": B, "batched_images_per_s": batched_images_per_s, "one_by_one_images_per_s": B / seconds,
            "speedup": batched_images_per_s * seconds / B}


def run_decode(devices: list[torch.device], *, quick: bool = False) -> dict[str, list[dict[str, Any]]]:
    beams, batches = ((1, 2), (1, 4)) if quick else ((1, 3, 5), (1, 16, 64))
    max_len, min_time = (4, 0.0) if quick else (16, 1.0)
    models = [random_model(QUICK, max(batches))] if quick else [shipped_model(64), random_model(COCO, 64)]
    rows, serial = [], []
    for device, bf16 in _cases(devices):
        for dm in models:
            dm.model.to(device)
            for K in beams:
                for B in batches:
                    rows.append(_progress(decode_case(dm, device, bf16, K, B, max_len, min_time)))
                serial.append(_progress(one_by_one_case(dm, device, bf16, K, B, max_len,
                                                        rows[-1]["images_per_s"])))
            dm.model.to("cpu")
    return {"decode": rows, "one_by_one": serial}


# ---- command line -------------------------------------------------------------------------------

def table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """Rows as a fixed-width text table; columns are (key, header, format)."""
    cells = [[header for _, header, _ in columns]]
    cells += [[format(row[key], fmt) for key, _, fmt in columns] for row in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells)


TRAIN_COLUMNS = [("device", "device", ""), ("dtype", "dtype", ""), ("dims", "dimensions", ""),
                 ("attention", "attention", ""), ("batch", "batch", "d"), ("steps", "steps", "d"), ("captions_per_s", "captions/s", ".1f"),
                 ("ms_per_step", "ms/step", ".1f"), ("peak_mb", "peak MB", ".0f")]
DECODE_COLUMNS = [("device", "device", ""), ("dtype", "dtype", ""), ("model", "model", ""),
                  ("beam", "beam", "d"), ("batch", "batch", "d"), ("images_per_s", "images/s", ".1f"),
                  ("steps", "steps", "d"), ("ms_per_step", "ms/step", ".2f"),
                  ("matmul_ms_per_step", "matmul ms", ".2f"), ("step_over_matmul", "step/matmul", ".2f"),
                  ("peak_mb", "peak MB", ".1f")]
SERIAL_COLUMNS = [("device", "device", ""), ("dtype", "dtype", ""), ("model", "model", ""),
                  ("beam", "beam", "d"), ("batch", "images", "d"),
                  ("batched_images_per_s", "batched img/s", ".1f"),
                  ("one_by_one_images_per_s", "one-by-one img/s", ".1f"), ("speedup", "speed-up", ".1f")]


def _devices(name: str) -> list[torch.device]:
    if name == "auto":
        return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    return [pick_device(name)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sat_core.bench", description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("train", "decode"))
    p.add_argument("--device", default="auto", help="auto (CPU, and CUDA when present) | cpu | cuda")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a benchmark")
    p.add_argument("--json", dest="json_out", help="also write the figures to this JSON file")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0: torch's default)")
    return p


def run(what: str, devices: list[torch.device], *, quick: bool = False) -> dict[str, Any]:
    """Run one benchmark, print its tables, return the figures."""
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads"
          + "".join(f", {torch.cuda.get_device_name(d)}" for d in devices if d.type == "cuda"))
    if what == "train":
        figures: dict[str, Any] = {"train": run_train(devices, quick=quick)}
        print(table(figures["train"], TRAIN_COLUMNS))
        return figures
    figures = run_decode(devices, quick=quick)
    print(table(figures["decode"], DECODE_COLUMNS))
    print("\nbatched vs one image at a time (the same images)")
    print(table(figures["one_by_one"], SERIAL_COLUMNS))
    return figures


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
        figures = run(args.what, devices, quick=args.quick)
    finally:
        torch.set_num_threads(threads)  # main() may run inside another program (tests)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(figures, indent=1) + "\n")
        print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
