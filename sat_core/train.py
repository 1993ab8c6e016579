"""Training: ``python -m sat_core.train --data DATASET.json --images DIR --out RUN_DIR …``.

A run directory holds ``train_config.json``, ``log.jsonl`` (one line per epoch), ``last/`` (a loadable
checkpoint plus the resumable state: optimizer, RNG, epoch and position, hard-attention baseline) and
``best/`` (the checkpoint with the best validation BLEU-4 from free-running decoding).
``--resume RUN_DIR`` continues exactly where ``last/`` stopped. Under ``torchrun`` it trains with DDP.
The work is ``sat_core.training.trainer.Trainer``; this module reads the flags and runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sat_core import cli
from sat_core.allocator import keep_freed_memory
from sat_core.config import TrainConfig
from sat_core.errors import SatError
from sat_core.training.checks import check_config, check_resume
from sat_core.training.trainer import Interrupted, Trainer


def build_parser() -> argparse.ArgumentParser:
    """One flag per TrainConfig field (``--hard-entropy-weight``, ``--val-beam-size`` for nested ones)."""
    p = argparse.ArgumentParser(prog="python -m sat_core.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="JSON file setting TrainConfig fields; flags given here override it")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR exactly where it stopped")
    cli.add_flags(p, TrainConfig())
    return p


def parse_config(argv: list[str] | None) -> tuple[TrainConfig, str | None]:
    args = build_parser().parse_args(argv)
    values: dict[str, Any] = {}
    if args.resume:
        values = _read_json(Path(args.resume) / "train_config.json", "--resume")
    elif args.config:
        values = _read_json(Path(args.config), "--config")
    saved = TrainConfig.from_dict(values)  # flat (older) files become nested first
    cfg = TrainConfig.from_dict(cli.apply(saved.to_dict(), cli.given(args, TrainConfig())))
    if not args.resume and (not cfg.data.dataset or not cfg.data.images):
        raise SatError("Give --data DATASET.json and --images DIR (or a --config file that sets them).")
    if args.resume:
        check_resume(saved, cfg)
    check_config(cfg)
    return cfg, args.resume


def _read_json(path: Path, flag: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SatError(f"{flag}: {path} does not exist.") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise SatError(f"{flag}: {path} is not a readable JSON file ({exc}).") from None


def main(argv: list[str] | None = None) -> int:
    try:
        cfg, resume = parse_config(argv)
    except SystemExit as exc:  # argparse printed --help (0) or what is wrong with a flag (2)
        return int(exc.code or 0)
    except SatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    keep_freed_memory()
    try:
        trainer = Trainer(cfg, resume)
        result = trainer.run()
    except Interrupted:
        print(f"Interrupted: saved a resumable checkpoint to {trainer.run_dir / 'last'}. "
              f"Continue with: python -m sat_core.train --resume {trainer.run_dir}", file=sys.stderr)
        return 130
    except SatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if trainer.main_process:
        print(json.dumps(result))
    if trainer.world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
