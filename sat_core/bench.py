"""Benchmarks (not tests): training throughput, decoding speed and bf16-vs-fp32 agreement.

    python -m sat_core.bench train  [--device auto|cpu|cuda] [--precision all|auto|fp32|bf16] [--quick] [--json OUT]
    python -m sat_core.bench decode [--device …] [--precision …] [--model all|coco|shipped] [--quick] [--json OUT]
    python -m sat_core.bench agreement --checkpoint checkpoints/shapes_soft --data data/world/dataset.json --images data/world
    python -m sat_core.bench compile [--device …] [--quick]
    python -m sat_core.bench graph --device cuda [--quick] [--json OUT]
    python -m sat_core.bench startup --data data/bench_world/dataset.json --images data/bench_world [--json OUT]
    python -m sat_core.bench formats [--rows 4000] [--work /tmp/sat-bench]

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

``startup`` (``benchmarks/startup.py``): seconds until the first training step and peak resident memory of a
first run, a resume and a 2-rank DDP run (gloo, CPU), with the images decoded into RAM at every start and with
the on-disk preprocessing cache (``--cache DIR``); ``--baseline-tree`` runs the in-RAM rows on another checkout
(the code from before the cache).
``formats`` (``benchmarks/formats.py``): the cache's rows as numpy .npy, HDF5 and LMDB: write, open, and a
random batch read warm and cold.

``agreement``: decodes a checkpoint's split in fp32 and in bf16 and reports the share of images whose
best caption is the same, and both BLEU-4s.

Peak memory is the CUDA allocator's peak above the level before the run, or on CPU the growth of
the process's peak resident set (VmHWM, reset through /proc/self/clear_refs) over the RSS before it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

from sat_core import cli, native
from sat_core.allocator import keep_freed_memory
from sat_core.benchmarks.decoding import run_agreement, run_decode
from sat_core.benchmarks.graphs import run_compile, run_graph
from sat_core.benchmarks.measure import table
from sat_core.benchmarks.training import run_train
from sat_core.decoding import pick_device
from sat_core.errors import SatError
from sat_core.precision import PRECISIONS, describe_cpu

GRAPH_COLUMNS = [("device", "device", ""), ("beam", "beam", "d"), ("batch", "batch", "d"),
                 ("beam_step_ms", "beam step ms (eager)", ".2f"), ("eager_ms", "decoder step ms eager", ".3f"),
                 ("graph_ms", "CUDA graph", ".3f"), ("compiled_ms", "reduce-overhead", ".3f"),
                 ("graph_speedup", "graph ×", ".1f"), ("compiled_speedup", "compiled ×", ".1f"),
                 ("graph_build_s", "capture s", ".2f"), ("compile_s", "compile s", ".1f"),
                 ("graph_max_diff", "graph Δ", ".1e"), ("compiled_max_diff", "compiled Δ", ".1e")]
TRAIN_COLUMNS = [("device", "device", ""), ("dims", "dimensions", ""), ("attention", "attention", ""),
                 ("batch", "batch", "d"), ("compiled", "compiled", ""), ("steps", "steps", "d"),
                 ("captions_per_s", "captions/s", ".1f"), ("ms_per_step", "ms/step", ".1f"),
                 ("first_step_s", "first step s", ".2f"), ("gemm_ms", "GEMMs ms", ".1f"),
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
    p = argparse.ArgumentParser(prog=cli.prog("sat_core.bench"), description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("train", "decode", "agreement", "compile", "graph", "startup", "formats"))
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
    p.add_argument("--preset", default=str(Path(__file__).parent / "presets" / "scenes_soft.json"),
                   help="startup: the TrainConfig JSON whose model and batching it trains (its data is replaced)")
    p.add_argument("--work", default="/tmp/sat-bench", help="startup, formats: folder for runs, the cache, the files")
    p.add_argument("--baseline-tree", default="",
                   help="startup: run the in-RAM cases with the code of this checkout (from before the cache)")
    p.add_argument("--rows", type=int, default=4000, help="formats: images (rows of 3 × 224 × 224) written")
    p.add_argument("--paths", default="ram,disk", help="startup: ram, disk or both (ram,disk)")
    p.add_argument("--cases", default="first run,resume,2-rank run",
                   help="startup: which of 'first run', 'resume', '2-rank run' (a resume or 2-rank case alone reuses "
                        "the first run's folder and cache in --work)")
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
    elif args.what in ("startup", "formats"):
        from sat_core.benchmarks.startup import run_io

        figures = run_io(args)
    elif args.what == "graph":
        figures = {"graph": run_graph(devices[-1], quick=args.quick, precision=args.precision)}
        print(_by_precision(figures["graph"], GRAPH_COLUMNS,
                            "the decode step (Decoder.step, soft attention) eager, as a CUDA graph, compiled"))
    else:
        figures = run(args.what, devices, quick=args.quick, precision=args.precision, which=args.model)
    return figures


if __name__ == "__main__":
    sys.exit(main())
