"""``python -m sat_core.bench startup``: how long a training run takes to reach its first step, and its peak resident
memory, with the images decoded into RAM at every start and with the on-disk cache (``--cache DIR``): a first run,
a resume of it, and a 2-rank DDP run (gloo, CPU), each a fresh process (ranks: processes of their own).

Each case runs ``Trainer(cfg)`` (or ``Trainer(cfg, resume)``) in a child process, then one training step, and
stops there as SIGINT would (last/ saved, which the resume case continues). Start-up is the wall time from the
child's launch to a constructed trainer, imports included: what precedes the first step. Peak RSS is the
child's VmHWM after that step (file pages it mapped and touched count in it, though they are the page cache's,
one copy however many processes map them). The child's code uses only ``Trainer``, ``stop_signal`` and
``train_one_epoch``, so ``--baseline-tree`` can run the in-RAM cases on a checkout from before the cache.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHILD = r"""
import json, os, time
from sat_core.config import TrainConfig
from sat_core.training.trainer import Interrupted, Trainer

cfg = TrainConfig.from_dict(json.loads(os.environ["SAT_BENCH_CONFIG"]))
trainer = Trainer(cfg, os.environ.get("SAT_BENCH_RESUME") or None)
ready = time.time()
trainer.stop_signal = 2  # stop after the first step, saving last/, as SIGINT does
try:
    trainer.train_one_epoch()
except Interrupted:
    pass
stepped = time.time()
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
kib = {k: int(status[k].split()[0]) for k in ("VmHWM", "VmRSS", "RssAnon", "RssFile")}
print("SAT_BENCH " + json.dumps({"ready": ready, "stepped": stepped, **kib}), flush=True)
if trainer.world > 1:
    import torch.distributed as dist
    dist.destroy_process_group()
"""

CASES = ("first run", "resume", "2-rank run")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(tree: Path, config: dict[str, Any], resume: str, ranks: int, log: Path) -> list[dict[str, Any]]:
    """The case's processes, started together; each one's figures."""
    base = dict(os.environ, PYTHONPATH=str(tree), SAT_BENCH_CONFIG=json.dumps(config), SAT_BENCH_RESUME=resume,
                PYTHONUNBUFFERED="1")
    if ranks > 1:  # as torchrun sets them (one thread a rank unless told otherwise)
        base.update(WORLD_SIZE=str(ranks), LOCAL_WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(_free_port()), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    procs, started = [], time.time()
    with open(log, "a") as out:
        for rank in range(ranks):
            env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank)) if ranks > 1 else base
            procs.append(subprocess.Popen([sys.executable, "-c", CHILD], cwd=tree, env=env, stdout=subprocess.PIPE,
                                          stderr=out, text=True))
        outputs = [p.communicate()[0] for p in procs]
        out.write("".join(outputs))
    figures = []
    for proc, text in zip(procs, outputs):
        lines = [line for line in text.splitlines() if line.startswith("SAT_BENCH ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"a benchmark process ended with exit code {proc.returncode}; see {log}")
        record = json.loads(lines[-1].removeprefix("SAT_BENCH "))
        figures.append({"startup_s": record["ready"] - started, "first_step_s": record["stepped"] - record["ready"],
                        "peak_rss_gib": record["VmHWM"] / 2**20, "rss_file_gib": record["RssFile"] / 2**20})
    return figures


def _row(path: str, case: str, figures: list[dict[str, Any]]) -> dict[str, Any]:
    peaks = [f["peak_rss_gib"] for f in figures]
    return {"path": path, "case": case, "processes": len(figures),
            "startup_s": max(f["startup_s"] for f in figures), "first_step_s": max(f["first_step_s"] for f in figures),
            "peak_rss_gib": max(peaks), "peak_rss_sum_gib": sum(peaks),
            "rss_file_gib": max(f["rss_file_gib"] for f in figures)}


def run_startup(config: dict[str, Any], work: Path, *, tree: Path, baseline: Path | None = None,
                ranks: int = 2, paths: tuple[str, ...] = ("ram", "disk"),
                cases: tuple[str, ...] = CASES) -> list[dict[str, Any]]:
    """The three cases with the images in RAM (no --cache; with ``baseline``'s code when given: the checkout from
    before the cache) and with the on-disk cache (--cache WORK/cache, written by the first run), in that order.
    ``config``: TrainConfig fields."""
    work.mkdir(parents=True, exist_ok=True)
    log = work / "startup.log"
    plans = [(f"in RAM ({baseline.name})" if baseline else "in RAM", baseline or tree, "ram"),
             ("on-disk cache", tree, "disk")]
    plans = [plan for plan in plans if plan[2] in paths]
    rows = []
    for label, code, path in plans:
        name = label.replace(" ", "_").replace("/", "_").strip("()_")[:40]
        runs = work / name
        if "first run" in cases:
            shutil.rmtree(runs, ignore_errors=True)
        else:
            shutil.rmtree(runs / "ddp", ignore_errors=True)
        data = dict(config["data"])  # no cache field on the in-RAM path: a checkout from before it has none
        if path == "disk":
            data["cache"] = str(work / "cache")
            if "first run" in cases:
                shutil.rmtree(work / "cache", ignore_errors=True)  # the first run writes it
        first = dict(config, data=data, out=str(runs / "first"))
        for case in [c for c in CASES if c in cases]:
            cfg = dict(first, out=str(runs / "ddp")) if case == "2-rank run" else first
            resume = first["out"] if case == "resume" else ""
            print(f"startup: {label}, {case}…", file=sys.stderr, flush=True)
            figures = _launch(code, cfg, resume, ranks if case == "2-rank run" else 1, log)
            rows.append(progress_row(_row(label, case, figures)))
    return rows


def progress_row(row: dict[str, Any]) -> dict[str, Any]:
    print(f"  {row['path']:>24}  {row['case']:<10}  start-up {row['startup_s']:7.1f} s  peak RSS "
          f"{row['peak_rss_gib']:.2f} GiB (sum {row['peak_rss_sum_gib']:.2f})", file=sys.stderr, flush=True)
    return row


def bench_config(preset: Path, dataset: str, images: str) -> dict[str, Any]:
    """A preset's TrainConfig fields with the benchmark's data, no progress bars, no time limit, no periodic saves:
    only the fields the preset sets, so that a checkout with fewer fields (``--baseline-tree``) reads them too."""
    from sat_core.config import TrainConfig

    values = json.loads(preset.read_text())
    values["data"] = dict(values.get("data", {}), dataset=str(Path(dataset).resolve()),
                          images=str(Path(images).resolve()))
    values["optim"] = dict(values.get("optim", {}), max_minutes=0, save_every=0)
    values["progress"] = False
    TrainConfig.from_dict(values)  # refused here, with the field named, rather than in every child
    return values


STARTUP_COLUMNS = [("path", "images", ""), ("case", "case", ""), ("processes", "processes", "d"),
                   ("startup_s", "start-up s", ".1f"), ("first_step_s", "first step s", ".1f"),
                   ("peak_rss_gib", "peak RSS GiB (a process)", ".2f"),
                   ("peak_rss_sum_gib", "peak RSS GiB (all)", ".2f"), ("rss_file_gib", "of it file pages GiB", ".2f")]
FORMAT_COLUMNS = [("format", "format", ""), ("rows", "rows", "d"), ("write_s", "write s", ".1f"),
                  ("size_gib", "size GiB", ".2f"), ("open_ms", "open ms", ".2f"),
                  ("warm_batch_ms", "64 random rows warm ms", ".1f"), ("cold_batch_ms", "cold ms", ".1f"),
                  ("exact", "exact", "")]


def run_io(args: Any) -> dict[str, Any]:
    """``startup`` or ``formats`` from bench's flags: the figures, their table printed."""
    from sat_core.benchmarks.formats import run_formats
    from sat_core.benchmarks.measure import table

    work = Path(args.work)
    if args.what == "formats":
        rows = run_formats(work / "formats", n=args.rows)
        done = [r for r in rows if "note" not in r]
        print(f"{args.rows:,} rows of 3 × 224 × 224 uint8 in {work / 'formats'}; median of 9 batches\n"
              + table(done, FORMAT_COLUMNS))
        for r in rows:
            if "note" in r:
                print(f"{r['format']}: {r['note']}")
        return {"formats": rows}
    config = bench_config(Path(args.preset), args.data, args.images)
    tree = Path(__file__).resolve().parents[2]
    rows = run_startup(config, work / "startup", tree=tree,
                       baseline=Path(args.baseline_tree).resolve() if args.baseline_tree else None,
                       paths=tuple(args.paths.split(",")), cases=tuple(args.cases.split(",")))
    print(f"{args.data}, preset {Path(args.preset).name}; start-up until the first training step\n"
          + table(rows, STARTUP_COLUMNS))
    return {"startup": rows}
