"""Golden captions of the shipped checkpoints: what each one must keep saying, and the script that records it.

    python -m tests.golden scenes_soft scenes_hard     # after rebuilding those checkpoints (python -m sat_core.ship)

For every checkpoint named, decodes a fixed set of images — six test scenes of its own world generated with seed
123, and scikit-image's photo of a cat — with greedy and beam-3 search (fp32, length cap 20, no length
normalisation), steps through the first image's caption and scores a caption of its world on it, then writes
those tokens and log-probabilities into ``tests/data/golden_captions.json`` under the checkpoint's name
(other entries are kept). ``tests/test_shipped.py`` checks every entry against its checkpoint.

Rewrite an entry only when its checkpoint is rebuilt: between rebuilds the entries show that no change to the
code moved a shipped caption.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ROOT / "checkpoints"
GOLDEN = Path(__file__).parent / "data" / "golden_captions.json"
WORLD = {"seed": 123, "test": 6}  # the scenes generated for every entry, in its checkpoint's world
PHOTO = "skimage_chelsea"
SCORED = {"shapes": "a red square", "scenes": "a dog"}  # a caption of each world, scored on the first image
MAX_LEN = 20


def why_not(name: str) -> str | None:
    """Why ``checkpoints/<name>`` cannot be tested here (not shipped, or saved with options this version no longer
    has: rebuild it with python -m sat_core.ship), or None when it can. Reads config.json only."""
    from sat_core.config import ModelConfig, TrainConfig
    from sat_core.errors import SatError

    path = CHECKPOINTS / name / "config.json"
    if not path.is_file():
        return f"checkpoints/{name} is not shipped"
    config = json.loads(path.read_text())
    try:
        ModelConfig.from_dict(config["model"])
        TrainConfig.from_dict((config.get("training") or {}).get("train_config") or {})
    except SatError as err:
        return f"checkpoints/{name} needs rebuilding (python -m sat_core.ship {name}): {err}"
    return None


def world_of(config: dict[str, Any]) -> str:
    """"scenes" for a checkpoint of the scenes world (EfficientNet-Lite0), else "shapes"."""
    return "scenes" if config["model"]["encoder"] == "efficientnet_lite0" else "shapes"


def golden_images(folder: Path, kind: str) -> dict[str, Any]:
    """The images every entry of ``kind``'s world decodes, by key, in order (PIL images)."""
    from PIL import Image
    from skimage import data as skdata

    from sat_core.data.karpathy import load_karpathy
    from sat_core.worlds.writer import generate

    generate(folder, 0, 0, WORLD["test"], seed=WORLD["seed"], workers=1, kind=kind)
    data = load_karpathy(folder / "dataset.json", folder)
    prefix = "world" if kind == "shapes" else "scenes"  # the shapes entries' keys, as the first build wrote them
    images = {f"{prefix}_seed{WORLD['seed']}_test_{i}": Image.open(r.path).convert("RGB")
              for i, r in enumerate(data.images)}
    images[PHOTO] = Image.fromarray(skdata.chelsea())
    return images


def record(loaded, images: dict[str, Any], scored: str) -> dict[str, Any]:
    """What a checkpoint says of ``images``: the golden entry's decodings (see the module's docstring)."""
    import torch

    from sat_core.config import DecodeConfig
    from sat_core.decoding import DecodeSession, beam_search, score_caption
    from sat_core.data.images import preprocess

    tensors = torch.stack([preprocess(im, loaded.preprocess)[0] for im in images.values()])  # (B, 3, S, S)
    entry: dict[str, Any] = {}
    for beam in (1, 3):
        cfg = DecodeConfig(beam_size=beam, max_len=MAX_LEN, precision="fp32")
        hyps = beam_search(loaded.model, tensors, loaded.vocab, cfg)
        entry[f"beam{beam}"] = {key: {"tokens": h[0].tokens, "logprob": round(h[0].logprob, 4)}
                                for key, h in zip(images, hyps)}
    session = DecodeSession(loaded.model, loaded.vocab, tensors[0], DecodeConfig(beam_size=1, max_len=MAX_LEN,
                                                                                  precision="fp32"))
    session.run()
    entry["session_first"] = [s.token for s in session.steps]
    entry["score_caption"] = scored
    entry["score_first"] = [round(float(x), 4) for x in
                            score_caption(loaded.model, loaded.vocab, tensors[0], scored, precision="fp32").logprobs]
    return entry


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from sat_core.checkpoint import load_checkpoint
    from sat_core.errors import SatError

    p = argparse.ArgumentParser(prog="python -m tests.golden", description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="+", help="checkpoint folders under checkpoints/ to record (scenes_soft …)")
    args = p.parse_args(argv)
    golden = json.loads(GOLDEN.read_text())
    for name in args.names:
        try:
            loaded = load_checkpoint(CHECKPOINTS / name)
        except SatError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        kind = world_of(loaded.config)
        with tempfile.TemporaryDirectory() as tmp:
            entry = record(loaded, golden_images(Path(tmp) / "w", kind), SCORED[kind])
        golden["checkpoints"][name] = entry
        captions = [" ".join(loaded.vocab.decode(v["tokens"])) for v in entry["beam3"].values()]
        print(f"{name}: {len(captions)} images; beam 3: " + " | ".join(captions))
    GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {GOLDEN.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
