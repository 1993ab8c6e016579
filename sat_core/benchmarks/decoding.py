"""``python -m sat_core.bench decode`` and ``agreement``: beam search's images/s at several beams and batches,
split into its parts timed alone; batched against one image at a time; bf16 against fp32 captions."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sat_core.benchmarks.measure import (
    COCO, DTYPES, QUICK, SHIPPED, Dims, cases, decode_gemms, dims_of, gemm_floor, gemm_runner, model_config, progress, timed, timed_in,
)
from sat_core import native
from sat_core.config import DecodeConfig, ModelConfig
from sat_core.data.vocab import SPECIALS, Vocab
from sat_core.decoding import beam_search
from sat_core.models.attention import attend
from sat_core.models.captioner import Captioner
from sat_core.precision import autocast


LARGE_BATCH = 1024  # on a GPU also, COCO size: a batch that can fill it (batch 64 is launch-bound there)


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


def steps_taken(results) -> int:
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
    steps = steps_taken(results)
    step_ms = 1000 * seconds / steps
    short = {"warmup": 2, "min_time": min_time / 4, "max_runs": 20}
    shapes = decode_gemms(dm.dims, B * K)
    gemm_s = timed(gemm_runner(shapes, device, DTYPES[precision]), device, **short)[0]
    floor_s, floor_p = gemm_floor(shapes, device, precision, gemm_s, **short) if floor else (float("nan"), "")
    gemm_ms, floor_ms = 1000 * gemm_s, 1000 * floor_s
    attn_ms = 1000 * timed_in(precision, attention_decode_runner(dm.model, dm.dims, B, K, device, precision),
                               device, **short)
    dec_ms = 1000 * timed_in(precision, step_decode_runner(dm.model, dm.dims, B, K, device, precision),
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
    large = [] if quick or all(d.type != "cuda" for d in devices) else [LARGE_BATCH]
    if quick:
        models = [random_model(QUICK, max(batches))]
    else:
        models = ([shipped_model(64)] if which in ("all", "shipped") else []) + \
                 ([random_model(COCO, max((*batches, *large)))] if which in ("all", "coco") else [])
    rows, serial = [], []
    for device, p in cases(devices, precision):
        for dm in models:
            dm.model.to(device)
            for K in beams:
                for B in batches:
                    rows.append(progress(decode_case(dm, device, p, K, B, max_len, min_time)))
                serial.append(progress(one_by_one_case(dm, device, p, K, B, max_len, rows[-1])))
                if device.type == "cuda" and len(dm.feats) > max(batches):
                    rows += [progress(decode_case(dm, device, p, K, B, max_len, min_time)) for B in large]
            dm.model.to("cpu")
    return {"decode": rows, "one_by_one": serial}


def run_agreement(checkpoint: str, data_path: str, images: str, split: str, beam: int, max_len: int,
                  device: torch.device, limit: int = 0, length_norm: float = 0.0) -> dict[str, Any]:
    """Best captions in fp32 and bf16 for every image of ``split``: the share that agree, both BLEU-4s."""
    from sat_core.checkpoint import load_checkpoint
    from sat_core.data.imagestore import ImageStore, normalise
    from sat_core.data.karpathy import EvalImages, load_karpathy
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
