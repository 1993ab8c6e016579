"""Caption image files from the command line.

    python -m sat_core.caption --checkpoint checkpoints/soft photo.jpg scene.png [--beam 3] [--json]

Every readable image is decoded in one batched ``beam_search`` call. Plain output is one
``IMAGE: caption`` line per image; ``--json`` prints a list with, per image, the best hypothesis's
tokens, words, score, log-probability, α grids (T × gh × gw), β values and every beam hypothesis.
An image that cannot be read gets its message on stderr and the others are still captioned; the
exit code is then 1 (2 for a bad checkpoint or bad flags).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sat_core import cli
from sat_core.checkpoint import LoadedCheckpoint, load_checkpoint
from sat_core.config import DecodeConfig
from sat_core.decoding import Hypothesis, beam_search, pick_device
from sat_core.errors import ImageError, SatError
from sat_core.images import load_image, preprocess


@dataclass
class Captioned:
    """One image's result: its beams, best first."""

    source: str
    hypotheses: list[Hypothesis]

    @property
    def best(self) -> Hypothesis:
        return self.hypotheses[0]


def caption_files(
    loaded: LoadedCheckpoint, sources: Sequence[str], cfg: DecodeConfig
) -> tuple[list[Captioned], list[tuple[str, str]]]:
    """Caption image files in one batch; returns (results in input order, [(source, error message)])."""
    tensors, kept, failed = [], [], []
    for source in sources:
        try:
            tensor, _crop = preprocess(load_image(source), loaded.preprocess)  # (3, S, S)
        except ImageError as err:
            failed.append((source, str(err)))
            continue
        tensors.append(tensor)
        kept.append(source)
    if not tensors:
        return [], failed
    beams = beam_search(loaded.model, torch.stack(tensors), loaded.vocab, cfg)  # (B, 3, S, S) -> B lists
    return [Captioned(s, hyps) for s, hyps in zip(kept, beams)], failed


def _floats(values: np.ndarray, digits: int = 6) -> list[Any]:
    """Nested lists of rounded floats (numpy -> JSON)."""
    return np.round(np.asarray(values, dtype=np.float64), digits).tolist()


def hypothesis_summary(hyp: Hypothesis) -> dict[str, Any]:
    """Caption, tokens and scores of one hypothesis (no attention maps)."""
    return {"caption": hyp.caption, "tokens": [int(t) for t in hyp.tokens], "words": list(hyp.words),
            "score": hyp.score, "logprob": hyp.logprob, "finished": hyp.finished}


def to_json(result: Captioned, *, hard: bool = False) -> dict[str, Any]:
    """The best hypothesis with its α grids (T, gh, gw) and β (T,), plus every beam's summary."""
    best = result.best
    out = {"image": result.source, **hypothesis_summary(best), "grid": list(best.grid),
           "alphas": _floats(best.alpha_grids()), "betas": _floats(best.betas),
           "beams": [hypothesis_summary(h) for h in result.hypotheses]}
    if hard:
        out["locations"] = [int(x) for x in best.locations]
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sat_core.caption", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="checkpoint folder (model.safetensors + config.json)")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files (JPEG, PNG, …)")
    cli.add_decode_flags(p)
    p.add_argument("--json", action="store_true", help="print JSON with tokens, scores, α grids and β")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = cli.decode_config(args)
        loaded = load_checkpoint(args.checkpoint, device=pick_device(args.device))
        results, failed = caption_files(loaded, args.images, cfg)
    except SatError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for source, message in failed:
        print(f"{source}: {message}", file=sys.stderr)
    if args.json:
        print(json.dumps([to_json(r, hard=loaded.model.hard) for r in results]))
    else:
        for r in results:
            print(f"{r.source}: {r.best.caption}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
