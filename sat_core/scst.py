"""Self-critical training after cross-entropy training:
``python -m sat_core.scst --init RUN/best --out RUN_DIR [--samples 5] [training flags]`` (installed: ``sat-scst``).

The run starts from the checkpoint's weights, vocabulary and training configuration (its data, model and
validation decoding), with a learning rate of 5e-5, one epoch and best/ chosen by validation CIDEr; any training
flag given here overrides them (``--lr``, ``--epochs``, ``--batch-size``, ``--train-images``, ``--data`` …). Each
step samples ``--samples`` captions per image and rewards each by its CIDEr-D (document frequencies of the
training references) less that of the image's greedy caption. The starting model is validated first and stays
best/ until a better one. ``--resume RUN_DIR`` continues a run where its last/ stopped. The work is
``sat_core.training.scst.SelfCritical``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sat_core import cli
from sat_core.config import TrainConfig
from sat_core.errors import SatError
from sat_core.training.checks import check_config, check_resume
from sat_core.training.scst import SCSTConfig, SelfCritical, read_scst_config, starting_config
from sat_core.train import read_json, run_trainer


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=cli.prog("sat_core.scst"), description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the self-critical run in RUN_DIR where it stopped")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh in an --out folder that holds an earlier run: its best/ and last/ are deleted "
                        "(refused without it)")
    cli.add_flags(p, SCSTConfig())
    cli.add_flags(p, TrainConfig())
    return p


def parse_config(argv: list[str] | None) -> tuple[TrainConfig, SCSTConfig, str | None, bool]:
    """(the run's config, the self-critical settings, the folder given to --resume, whether --overwrite was given)."""
    args = build_parser().parse_args(argv)
    if args.resume and args.overwrite:
        raise SatError("--resume continues a run and --overwrite starts one afresh: give one of them.")
    flags = cli.given(args, TrainConfig())
    if args.resume:
        saved = TrainConfig.from_dict(read_json(Path(args.resume) / "train_config.json", "--resume"))
        scst = read_scst_config(args.resume)
        cfg = TrainConfig.from_dict(cli.apply(saved.to_dict(), flags))
        check_resume(saved, cfg)
    else:
        scst = SCSTConfig.from_dict(cli.apply(SCSTConfig().to_dict(), cli.given(args, SCSTConfig())))
        if not scst.init:
            raise SatError("Give --init CHECKPOINT: the cross-entropy model to start from (a run's best/).")
        if not flags.get("out"):
            raise SatError("Give --out RUN_DIR: the folder for this run's best/, last/ and log.jsonl.")
        cfg = TrainConfig.from_dict(cli.apply(starting_config(scst.init).to_dict(), flags))
        if not cfg.data.dataset or not cfg.data.images:
            raise SatError(f"{scst.init} does not say which data it was trained on; give --data DATASET.json and "
                           "--images DIR.")
    check_config(cfg)
    return cfg, scst, args.resume, args.overwrite


def main(argv: list[str] | None = None) -> int:
    """Exit codes as ``python -m sat_core.train``'s: 0 done, 2 refused or failed, 130 interrupted."""
    try:
        cfg, scst, resume, overwrite = parse_config(argv)
    except SystemExit as exc:  # argparse printed --help (0) or what is wrong with a flag (2)
        return int(exc.code or 0)
    except SatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return run_trainer(lambda: SelfCritical(cfg, scst, resume, overwrite=overwrite), Path(resume or cfg.out),
                       "sat_core.scst")


if __name__ == "__main__":
    sys.exit(main())
