"""Write the transformation suite over a scenes split (``sat_core.worlds.scenes.transforms``).

    python -m sat_core.transforms --data data/scenes/dataset.json --out data/scenes_suite [--split test]
    python -m sat_core.transforms --data data/scenes/dataset.json --out data/val_q50 --split val --only jpeg --jpeg-quality 50

One Karpathy-format dataset per transform (hflip, zoom_out, brightness, jpeg, crop, grayscale): the same
scenes, shifted in ways the world never draws, with their masks and references moved along.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sat_core import cli
from sat_core.errors import SatError
from sat_core.worlds.scenes.transforms import JPEG_QUALITY, NAMES, write_suite


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=cli.prog("sat_core.transforms"), description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="a scenes world's dataset.json")
    p.add_argument("--images", help="the folder holding its images (default: the dataset.json's folder)")
    p.add_argument("--out", required=True, help="where to write one folder per transform")
    p.add_argument("--split", default="test")
    p.add_argument("--only", nargs="+", choices=NAMES, default=list(NAMES), help="write only these transforms")
    p.add_argument("--jpeg-quality", type=int, default=JPEG_QUALITY,
                   help=f"the jpeg transform's quality, 1–95 (default {JPEG_QUALITY}, the suite's)")
    args = p.parse_args(argv)
    start = time.perf_counter()
    try:
        paths = write_suite(args.data, args.images or Path(args.data).parent, args.out, args.split,
                            names=tuple(args.only), jpeg_quality=args.jpeg_quality)
    except SatError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, path in paths.items():
        doc = json.loads(path.read_text())
        print(f"{name}: {len(doc['images'])} images" + (f" ({len(doc['dropped'])} left out: every object cropped "
                                                         "away)" if doc["dropped"] else "") + f" -> {path}")
    print(f"wrote {len(paths)} sets in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
