"""Preprocessing once: ``python -m sat_core.prepro --data DATASET.json --images DIR --cache CACHE [train flags]``.

Writes into CACHE what ``python -m sat_core.train`` with the same flags and ``--cache CACHE`` reads: the images of
the train and validation splits, resized to the encoder's side (uint8), and, for a frozen encoder, its annotations
(fp16), each one memory-mapped file (``sat_core.data.cache``). Every later run, resume and DDP rank with those
settings maps them instead of decoding and encoding again; a changed image, image size, normalisation, encoder or
encoder weights gives other files, never a stale read. ``--workers N`` sets the decoding threads. A cache that
does not fit on its disk is refused before any work, saying how much it needs.

It runs the trainer's own set-up (the same data, preprocessing and encoder, so the same keys) and stops before
the first step; the set-up's run folder is a temporary one, removed afterwards.

``python -m sat_core.prepro --cache CACHE --prune`` deletes what no run can read any more: the stores of images
changed since they were written (a regenerated world), with their annotations, and what killed writers left.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from sat_core import cli
from sat_core.allocator import keep_freed_memory
from sat_core.config import TrainConfig
from sat_core.data.cache import gib
from sat_core.errors import SatError
from sat_core.training.checks import check_config


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=cli.prog("sat_core.prepro"), description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="JSON file setting TrainConfig fields (a preset); flags given here override it")
    p.add_argument("--prune", action="store_true", help="only delete what in --cache no run can read any more: stores "
                   "of images changed since (a regenerated world) and what killed writers left")
    cli.add_flags(p, TrainConfig())
    return p


def parse_config(args: argparse.Namespace) -> TrainConfig:
    values = {}
    if args.config:
        try:
            values = json.loads(Path(args.config).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SatError(f"--config: {args.config} is not a readable JSON file ({exc}).") from None
    saved = TrainConfig.from_dict(values)
    cfg = TrainConfig.from_dict(cli.apply(saved.to_dict(), cli.given(args, TrainConfig())))
    if not cfg.data.dataset or not cfg.data.images or not cfg.data.cache:
        raise SatError("Give --data DATASET.json, --images DIR and --cache CACHE_DIR (the folder the cache is "
                       "written to; python -m sat_core.train --cache CACHE_DIR then reads it).")
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        raise SatError("Run python -m sat_core.prepro as one process, not under torchrun: the ranks of a training run "
                       "then all map what it wrote.")
    check_config(cfg)
    return cfg


def prepare(cfg: TrainConfig) -> dict[str, object]:
    """Write (or find) the cache of ``cfg``; returns what it holds."""
    from sat_core.data.cache import annotation_path, encoder_identity
    from sat_core.training.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="sat-prepro-") as tmp:
        trainer = Trainer(dataclasses.replace(cfg, out=str(Path(tmp) / "run")))
    store = trainer.store
    report: dict[str, object] = {"images": len(store), "images_file": str(store.folder / "images.npy"),
                                 "images_gib": round(store.nbytes / 2**30, 3), "skipped": len(store.skipped)}
    if trainer.features is not None:
        path, _parts = annotation_path(store, encoder_identity(trainer.model_config, trainer.model.encoder))
        report["annotations_file"] = str(path)
        report["annotations_gib"] = round(trainer.features.numel() * 2 / 2**30, 3)
    elif trainer.model.encoder.trainable:
        report["annotations"] = "none: the encoder trains (--finetune-encoder, or the small encoder without weights)"
    else:
        report["annotations"] = "none: --cache-features off"
    return report


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse printed --help (0) or what is wrong with a flag (2)
        return int(exc.code or 0)
    if args.prune:
        return prune(getattr(args, "data.cache") or "")
    try:
        cfg = parse_config(args)
    except SatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    keep_freed_memory()
    started = time.perf_counter()
    try:
        report = prepare(cfg)
    except SatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"prepro: the cache in {cfg.data.cache} is ready ({time.perf_counter() - started:.0f} s); "
          f"python -m sat_core.train with these flags and --cache {cfg.data.cache} maps it")
    print(json.dumps(report))
    return 0


def prune(folder: str) -> int:
    from sat_core.data.cache import prune as remove_stale

    if not folder or not Path(folder).is_dir():
        print(f"error: --prune needs --cache DIR, an existing cache folder (given: {folder or 'none'}).",
              file=sys.stderr)
        return 2
    freed = remove_stale(folder)
    print(f"prepro: {gib(freed)} freed in {folder}" if freed else f"prepro: nothing in {folder} is stale")
    return 0


if __name__ == "__main__":
    sys.exit(main())
