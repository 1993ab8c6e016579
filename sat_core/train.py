"""Training: ``python -m sat_core.train --data DATASET.json --images DIR --out RUN_DIR …``.

A run directory holds ``train_config.json``, ``log.jsonl`` (one line per epoch), ``steps.csv`` and ``tb/``
(one row and TensorBoard scalars per step: ``tensorboard --logdir RUN_DIR/tb``), ``last/`` (a loadable
checkpoint plus the resumable state: optimizer, RNG, epoch and position, hard-attention baseline) and
``best/`` (the checkpoint with the best validation BLEU-4 from free-running decoding).
``--resume RUN_DIR`` continues exactly where ``last/`` stopped; a folder that holds a run is never trained
into afresh without ``--overwrite``.

Under ``torchrun --nproc_per_node N -m sat_core.train …`` it trains with DDP: ``--batch-size`` is the global
batch (each process takes 1/N of it), so --lr and --warmup-steps mean what they mean in one process;
resume it with the same torchrun command and --resume. Ctrl-C saves ``last/`` and exits 130 on every process.
The work is ``sat_core.training.trainer.Trainer``; this module reads the flags and runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sat_core import cli
from sat_core.allocator import keep_freed_memory
from sat_core.config import TrainConfig
from sat_core.errors import SatError
from sat_core.training import distributed
from sat_core.training.checks import check_config, check_resume
from sat_core.training.trainer import Interrupted, Trainer


def build_parser() -> argparse.ArgumentParser:
    """One flag per TrainConfig field (``--hard-entropy-weight``, ``--val-beam-size`` for nested ones)."""
    p = argparse.ArgumentParser(prog=cli.prog("sat_core.train"), description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="JSON file setting TrainConfig fields; flags given here override it")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR exactly where it stopped")
    p.add_argument("--overwrite", action="store_true",
                   help="train afresh into an --out folder that holds an earlier run: its best/ and last/ are deleted "
                        "(refused without it)")
    cli.add_flags(p, TrainConfig())
    return p


def parse_config(argv: list[str] | None) -> tuple[TrainConfig, str | None]:
    """(the run's config, the run folder given to --resume)."""
    cfg, resume, _overwrite = parse_run(argv)
    return cfg, resume


def parse_run(argv: list[str] | None) -> tuple[TrainConfig, str | None, bool]:
    """(the run's config, the run folder given to --resume, whether --overwrite was given)."""
    args = build_parser().parse_args(argv)
    if args.resume and args.overwrite:
        raise SatError("--resume continues a run and --overwrite starts one afresh: give one of them.")
    values: dict[str, Any] = {}
    if args.resume:
        values = read_json(Path(args.resume) / "train_config.json", "--resume")
    elif args.config:
        values = read_json(Path(args.config), "--config")
    saved = TrainConfig.from_dict(values)  # flat (older) files become nested first
    cfg = TrainConfig.from_dict(cli.apply(saved.to_dict(), cli.given(args, TrainConfig())))
    if not args.resume and (not cfg.data.dataset or not cfg.data.images):
        raise SatError("Give --data DATASET.json and --images DIR (or a --config file that sets them).")
    if args.resume:
        check_resume(saved, cfg)
    check_config(cfg)
    return cfg, args.resume, args.overwrite


def read_json(path: Path, flag: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SatError(f"{flag}: {path} does not exist.") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise SatError(f"{flag}: {path} is not a readable JSON file ({exc}).") from None


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done, 2 refused or failed (one message, from the first process only under torchrun), 130
    interrupted (SIGINT/SIGTERM) after saving ``last/``."""
    first = distributed.rank() == 0  # every process meets the same refusals: one of them says so
    try:
        cfg, resume, overwrite = parse_run(argv)
    except SystemExit as exc:  # argparse printed --help (0) or what is wrong with a flag (2)
        return int(exc.code or 0)
    except SatError as exc:
        _say(f"error: {exc}", first)
        return 2
    return run_trainer(lambda: Trainer(cfg, resume, overwrite=overwrite), Path(resume or cfg.out))


def run_trainer(start: Callable[[], Trainer], run_dir: Path, module: str = "sat_core.train") -> int:
    """Build the trainer with ``start`` and run it, as ``python -m module`` does: the result as JSON, or one
    message (from the first process) with exit code 2 (refused, failed) or 130 (interrupted)."""
    first = distributed.rank() == 0
    keep_freed_memory()
    try:
        result = start().run()
    except Interrupted:
        _say(f"Interrupted: saved a resumable checkpoint to {run_dir / 'last'}. "
             f"Continue with: {distributed.resume_hint(run_dir, module)}", first)
        return 130
    except KeyboardInterrupt:  # Ctrl-C while reading the data, before the first step: nothing to save
        _say(f"Interrupted while setting up, before the first step: {run_dir} is as it was.", first)
        return 130
    except SatError as exc:
        _say(f"error: {exc}", first)
        return 2
    finally:
        distributed.finish()
    if first:
        print(json.dumps(result))
    return 0


def _say(message: str, first: bool) -> None:
    if first:
        print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
