"""The scenes world's object images: vendored Fluent Emoji (3D) sprites, and the script that vendors them.

Rebuild the vendored subset from the npm tarball (needs npm once; generating the world never does):

    cd /tmp && npm pack @lobehub/fluent-emoji-3d@1.1.0
    python -m sat_core.worlds.scenes.sprites --tarball /tmp/lobehub-fluent-emoji-3d-1.1.0.tgz

Each sprite is cut to its alpha bounding box, downscaled so its longest side is at most
``SPRITE_SIZE`` px and stored as lossless WebP (alpha kept exactly: it is the object mask).
Licence and attribution: ``sat_core/worlds/scenes/assets/fluent_emoji/LICENSE`` and ``README.md``.
"""

from __future__ import annotations

import argparse
import functools
import io
import sys
import tarfile
from pathlib import Path

import numpy as np

from sat_core.errors import DatasetError
from sat_core.worlds.scenes.catalog import HUES, all_codes

ASSET_DIR = Path(__file__).resolve().parent / "assets" / "fluent_emoji"
SPRITE_SIZE = 160  # px, longest side: the largest object drawn at 224 px is about this big
PACKAGE = "@lobehub/fluent-emoji-3d"
VERSION = "1.1.0"


def vendor(tarball: str | Path, out_dir: Path = ASSET_DIR) -> list[Path]:
    """Extract, trim and downscale every code point in the catalogue from the npm tarball."""
    from PIL import Image

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with tarfile.open(tarball, "r:gz") as tar:
        for code in all_codes():
            member = tar.getmember(f"package/assets/{code}.webp")  # KeyError names a missing code
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            image = Image.open(io.BytesIO(data)).convert("RGBA")
            image = image.crop(image.getchannel("A").getbbox())
            image.thumbnail((SPRITE_SIZE, SPRITE_SIZE), Image.Resampling.LANCZOS)
            path = out_dir / f"{code}.webp"
            image.save(path, format="WEBP", lossless=True, quality=100, method=6, exact=True)
            written.append(path)
    return written


@functools.lru_cache(maxsize=None)
def sprite(code: str, colour: str | None = None) -> np.ndarray:
    """The vendored sprite as (h, w, 4) uint8 RGBA; ``colour``: hue-shift its saturated pixels."""
    from PIL import Image

    path = ASSET_DIR / f"{code}.webp"
    if not path.is_file():
        raise DatasetError(f"The scenes world's image {path} is missing; rebuild the vendored assets "
                           "with python -m sat_core.worlds.scenes.sprites --tarball <npm tarball>.")
    with Image.open(path) as image:
        rgba = np.asarray(image.convert("RGBA")).copy()
    if colour is not None:
        rgba = _recolour(rgba, HUES[colour])
    rgba.setflags(write=False)
    return rgba


def _recolour(rgba: np.ndarray, hue: int) -> np.ndarray:
    """Move the hue of saturated pixels to ``hue``; greys, whites and shading stay as they are."""
    from PIL import Image

    hsv = np.asarray(Image.fromarray(rgba[..., :3]).convert("HSV")).copy()  # (h, w, 3)
    saturated = hsv[..., 1] > 60
    hsv[..., 0] = np.where(saturated, hue, hsv[..., 0])
    rgb = np.asarray(Image.fromarray(hsv, "HSV").convert("RGB"))
    return np.concatenate([rgb, rgba[..., 3:]], axis=-1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sat_core.worlds.scenes.sprites", description=__doc__.split("\n")[0])
    p.add_argument("--tarball", required=True, help=f"the tarball of `npm pack {PACKAGE}@{VERSION}`")
    p.add_argument("--out", default=str(ASSET_DIR))
    args = p.parse_args(argv)
    written = vendor(args.tarball, Path(args.out))
    total = sum(path.stat().st_size for path in written)
    print(f"wrote {len(written)} sprites ({total / 1e6:.2f} MB) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
