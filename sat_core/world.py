"""Generate an embedded synthetic world as a Karpathy-format dataset (``sat_core.worlds``).

    python -m sat_core.world --out data/world --train 8000 --val 500 --test 500 --seed 0
    python -m sat_core.world --kind scenes --out data/scenes ...   (everyday objects in places)
"""

from __future__ import annotations

import argparse
import sys
import time

from sat_core import cli
from sat_core.errors import SatError
from sat_core.worlds import NAMES
from sat_core.worlds.writer import CAPTION_ORDERS, SHIPPED_CAPTION_ORDER, generate


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=cli.prog("sat_core.world"), description=__doc__.split("\n")[0])
    p.add_argument("--kind", choices=NAMES, default="shapes",
                   help="shapes: 112 px coloured shapes (fast); scenes: 224 px everyday objects in places")
    p.add_argument("--out", required=True, help="output folder (created if missing)")
    p.add_argument("--train", type=_count, default=8000)
    p.add_argument("--val", type=_count, default=500)
    p.add_argument("--test", type=_count, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=_positive, default=2)
    p.add_argument("--caption-order", choices=CAPTION_ORDERS, default=SHIPPED_CAPTION_ORDER,
                   help="scenes: name the largest group of identical objects first and equal ones left to right "
                        "(the shipped world: 'two trucks and an umbrella'; 'left of' is the one horizontal "
                        "relation), every group left to right, or in random order")
    held_out = p.add_mutually_exclusive_group()
    held_out.add_argument("--shifted", action="store_true",
                          help="scenes: draw surface styles and horizons the other splits never draw (a "
                               "generalisation set; use --train 0 --val 0 --test N and its own --out)")
    held_out.add_argument("--shifted-validation", action="store_true",
                          help="scenes: a shifted set over the other held-out styles, to make choices on without "
                               "reading the shifted split (use --train 0 --val N --test 0 and its own --out)")
    p.add_argument("--no-augment", action="store_true",
                   help="scenes: keep every training picture as rendered (by default some are degraded: JPEG, "
                        "grayscale, blur, exposure)")
    return p


def main(argv: list[str] | None = None) -> None:
    """Generate the dataset and print its size and speed."""
    args = build_parser().parse_args(argv)
    start = time.perf_counter()
    try:
        path = generate(args.out, args.train, args.val, args.test, args.seed, args.workers, args.kind,
                        args.caption_order, shifted=args.shifted or args.shifted_validation,
                        augment=not args.no_augment, held_out="validation" if args.shifted_validation else "test")
    except SatError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    n = args.train + args.val + args.test
    elapsed = time.perf_counter() - start
    print(f"wrote {n} images and {path} in {elapsed:.1f} s ({n / max(elapsed, 1e-9):.0f} images/s, "
          f"{args.workers} workers)")


if __name__ == "__main__":
    main()
