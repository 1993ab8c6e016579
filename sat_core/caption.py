"""Caption image files and folders from the command line.

    python -m sat_core.caption --checkpoint checkpoints/shapes_soft photo.jpg scene.png [--beam 3] [--json]
    python -m sat_core.caption --checkpoint CKPT photos/ --jsonl captions.jsonl --save-attention strips/

A folder stands for its image files (PNG, JPEG, WebP, BMP, GIF, TIFF; sorted by name, not recursive).
Images are decoded ``--batch-size`` at a time through the one batched ``beam_search``, with a progress
bar on stderr when it is a terminal. Plain output is one ``IMAGE: caption`` line per image (saying so when the
caption was cut at the length cap); ``--json``
prints a list with, per image, the best hypothesis's tokens, words, score, log-probability, whether the model
is unsure of it (when the checkpoint keeps the mark: ``sat_core.evaluation.confidence``), α grids
(T × gh × gw), β values and every beam hypothesis; ``--jsonl OUT`` writes the same objects one per line
as images are done; ``--save-attention DIR`` writes the α strip of each caption (one PNG per image).
An image that cannot be read gets its message on stderr and the others are still captioned; the
exit code is then 1 (2 for a bad checkpoint or bad flags).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from PIL import Image

from sat_core import cli
from sat_core.allocator import keep_freed_memory
from sat_core.checkpoint import LoadedCheckpoint, load_checkpoint
from sat_core.config import DecodeConfig, PreprocessConfig
from sat_core.decoding import Hypothesis, beam_search, pick_device
from sat_core.errors import ImageError, SatError
from sat_core.evaluation.confidence import ConfidenceReference, kept_reference
from sat_core.data.images import crop_for_display, load_image, preprocess
from sat_core.io import atomic_write

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")


@dataclass
class Captioned:
    """One image's result: its beams, best first (and the decoded image when it was asked for)."""

    source: str
    hypotheses: list[Hypothesis]
    image: Image.Image | None = None

    @property
    def best(self) -> Hypothesis:
        return self.hypotheses[0]


def expand_sources(arguments: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Files as given and folders as their image files (sorted); ([sources], [(folder, message)])."""
    sources, failed = [], []
    for argument in arguments:
        folder = Path(argument)
        if not folder.is_dir():
            sources.append(argument)  # a missing or unreadable file is reported when it is loaded
            continue
        found = sorted(str(p) for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not found:
            failed.append((argument, f"the folder holds no image files ({', '.join(IMAGE_SUFFIXES)})"))
        sources += found
    return sources, failed


def iter_captions(
    loaded: LoadedCheckpoint, sources: Sequence[str], cfg: DecodeConfig, *, batch_size: int = 16,
    keep_images: bool = False,
) -> Iterator[tuple[int, list[Captioned], list[tuple[str, str]]]]:
    """Per batch of ``batch_size`` sources: (sources done, results in input order, [(source, error)])."""
    for first in range(0, len(sources), batch_size):
        chunk = sources[first : first + batch_size]
        tensors, kept, images, failed = [], [], [], []
        for source in chunk:
            try:
                image = load_image(source)
                tensor, _crop = preprocess(image, loaded.preprocess)  # (3, S, S)
            except ImageError as err:
                failed.append((source, str(err)))
                continue
            tensors.append(tensor)
            kept.append(source)
            images.append(image if keep_images else None)
        results = []
        if tensors:
            beams = beam_search(loaded.model, torch.stack(tensors), loaded.vocab, cfg)  # (B, 3, S, S) -> B lists
            results = [Captioned(s, hyps, im) for s, hyps, im in zip(kept, beams, images)]
        yield len(chunk), results, failed


def caption_files(
    loaded: LoadedCheckpoint, sources: Sequence[str], cfg: DecodeConfig, *, batch_size: int = 16
) -> tuple[list[Captioned], list[tuple[str, str]]]:
    """Caption image files in batches; returns (results in input order, [(source, error message)])."""
    results, failed = [], []
    for _, done, bad in iter_captions(loaded, sources, cfg, batch_size=batch_size):
        results += done
        failed += bad
    return results, failed


def attention_strip_png(image: Image.Image, hyp: Hypothesis, preprocess_cfg: PreprocessConfig) -> bytes:
    """The paper's figure for one caption: the crop the model saw, then one α panel per word (PNG)."""
    from sat_core.viz import strip_png, word_strip

    words = hyp.words + (["<end>"] if hyp.finished else [])  # α has a row for the <end> step too
    crop = np.asarray(crop_for_display(image, preprocess_cfg))  # (S, S, 3)
    strip = word_strip(crop, words, hyp.alphas, hyp.grid, method="pyramid", sigma=8.0, panel_size=112,
                       columns=min(len(words) + 1, 8))
    return strip_png(strip)


def strip_path(folder: Path, source: str, used: set[str]) -> Path:
    """``folder/<image stem>.png``, numbered when two images share a stem."""
    stem, n = Path(source).stem or "image", 1
    name = f"{stem}.png"
    while name in used:
        n += 1
        name = f"{stem}-{n}.png"
    used.add(name)
    return folder / name


def _floats(values: np.ndarray, digits: int = 6) -> list[Any]:
    """Nested lists of rounded floats (numpy -> JSON)."""
    return np.round(np.asarray(values, dtype=np.float64), digits).tolist()


def hypothesis_summary(hyp: Hypothesis) -> dict[str, Any]:
    """Caption, tokens and scores of one hypothesis (no attention maps)."""
    return {"caption": hyp.caption, "tokens": [int(t) for t in hyp.tokens], "words": list(hyp.words),
            "score": hyp.score, "logprob": hyp.logprob, "finished": hyp.finished}


def to_json(result: Captioned, *, hard: bool = False, reference: ConfidenceReference | None = None) -> dict[str, Any]:
    """The best hypothesis with its α grids (T, gh, gw) and β (T,), plus every beam's summary; with the checkpoint's
    confidence ``reference``, whether the model is unsure of the caption (``sat_core.evaluation.confidence``)."""
    best = result.best
    unsure = {"unsure": reference.unsure(best.logprob)} if reference is not None else {}
    out = {"image": result.source, **hypothesis_summary(best), **unsure, "grid": list(best.grid),
           "alphas": _floats(best.alpha_grids()), "betas": _floats(best.betas),
           "beams": [hypothesis_summary(h) for h in result.hypotheses]}
    if hard:
        out["locations"] = [int(x) for x in best.locations]
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=cli.prog("sat_core.caption"), description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="checkpoint folder (model.safetensors + config.json)")
    p.add_argument("images", nargs="+", metavar="IMAGE_OR_DIR",
                   help="image files (JPEG, PNG, …) or folders of them")
    cli.add_decode_flags(p)
    cli.decoding_follows_checkpoint(p)
    p.add_argument("--json", action="store_true", help="print JSON with tokens, scores, α grids and β")
    p.add_argument("--jsonl", metavar="OUT", help="write one JSON object per image to OUT ('-': stdout)")
    p.add_argument("--save-attention", metavar="DIR", help="write each caption's α strip to DIR/<image>.png")
    p.add_argument("--batch-size", type=int, default=16, help="images decoded together [default: 16]")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    return p


@dataclass
class _Outputs:
    """Where results go besides stdout: the JSONL stream, the α strip folder (and its names so far)."""

    jsonl: IO[str] | None
    strips: Path | None
    used: set[str]

    @classmethod
    def open(cls, args: argparse.Namespace, stack: ExitStack) -> "_Outputs":
        """The outputs the flags ask for (SatError when they cannot be made)."""
        try:
            jsonl = sys.stdout if args.jsonl == "-" else (
                stack.enter_context(open(args.jsonl, "w", encoding="utf-8")) if args.jsonl else None)
            strips = Path(args.save_attention) if args.save_attention else None
            if strips is not None:
                strips.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SatError(f"Cannot write the output ({exc}); choose a folder you can write to.") from exc
        return cls(jsonl, strips, set())

    def write(self, r: Captioned, record: dict[str, Any], preprocess_cfg: PreprocessConfig) -> str | None:
        """Write one image's α strip and JSON line; the error message when the strip cannot be written."""
        error = None
        if self.strips is not None:
            png = strip_path(self.strips, r.source, self.used)
            try:
                atomic_write(png, lambda tmp: tmp.write_bytes(attention_strip_png(r.image, r.best, preprocess_cfg)))
                record["attention_png"] = str(png)
            except OSError as exc:
                error = f"cannot write {png} ({exc})"
            r.image = None  # keep memory to one batch of images
        if self.jsonl is not None:
            self.jsonl.write(json.dumps(record) + "\n")
        return error


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    args = build_parser().parse_args(argv)
    keep_freed_memory()
    sources, failed = expand_sources(args.images)
    with ExitStack() as stack:
        try:
            if args.batch_size < 1:
                raise SatError(f"--batch-size must be at least 1, not {args.batch_size}.")
            cli.decode_config(args)  # bad values are reported before the checkpoint is read
            loaded = load_checkpoint(args.checkpoint, device=pick_device(args.device))
            cfg = cli.decode_config(args, loaded.decode_defaults())
            reference = kept_reference(loaded.config)
            outputs = _Outputs.open(args, stack)
        except SatError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        for source, message in failed:
            print(f"{source}: {message}", file=sys.stderr)
        everything = []
        bar = stack.enter_context(tqdm(total=len(sources), unit="image", file=sys.stderr,
                                       disable=not sys.stderr.isatty()))
        for n_done, results, bad in iter_captions(loaded, sources, cfg, batch_size=args.batch_size,
                                                  keep_images=outputs.strips is not None):
            for r in results:
                record = to_json(r, hard=loaded.model.hard, reference=reference) if args.json or outputs.jsonl else {}
                error = outputs.write(r, record, loaded.preprocess)
                bad += [(r.source, error)] if error else []
                if args.json:
                    everything.append(record)
                elif outputs.jsonl is not sys.stdout:
                    words = f"{cfg.max_len} word{'s' if cfg.max_len > 1 else ''}"
                    cut = "" if r.best.finished else f" … (cut at the length cap of {words}: --max-len)"
                    print(f"{r.source}: {r.best.caption}{cut}")
            for source, message in bad:
                bar.write(f"{source}: {message}", file=sys.stderr)
            failed += bad
            if outputs.jsonl is not None:
                outputs.jsonl.flush()
            bar.update(n_done)
    if args.json:
        print(json.dumps(everything))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
