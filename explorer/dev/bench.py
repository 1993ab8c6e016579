"""How responsive the explorer is with a checkpoint, measured on this machine's CPU.

    python -m explorer.dev.bench --checkpoint checkpoints/shapes_soft [--runs 20] [--image FILE …]

Times what a user waits for, with the same functions the app calls:
  caption: uploaded bytes -> load_image -> preprocess -> beam_search -> word_strip -> PNG
  step:    one DecodeSession.step() (the encoder ran when the session started), and
           step + drawing that step's α overlay (what one click on Next costs).
Prints mean, p50 and p95 in milliseconds. Targets: caption < 1 s, step < 100 ms.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from explorer.settings import REPO_ROOT


def timings(fn: Callable[[], object], runs: int, warmup: int = 2) -> list[float]:
    """Wall-clock milliseconds of ``runs`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000.0)
    return out


def summary(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return {"mean_ms": statistics.fmean(ms), "p50_ms": statistics.median(ms), "p95_ms": p95, "runs": len(ms)}


def default_images() -> dict[str, bytes]:
    """A synthetic scene (PNG, as in training) and a real photo (JPEG, 512×512)."""
    from PIL import Image
    from skimage import data

    from sat_core.worlds.writer import generate

    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp, 0, 0, 1, seed=0, workers=1)
        scene = next(Path(tmp, "test").glob("*.png")).read_bytes()
    buffer = io.BytesIO()
    Image.fromarray(data.astronaut()).save(buffer, format="JPEG", quality=90)
    return {"scene.png": scene, "photo.jpg": buffer.getvalue()}


def caption_once(loaded, data: bytes, name: str, cfg) -> object:
    """Everything between an upload and the caption with its α strip on screen."""
    from sat_core import viz
    from sat_core.decoding import beam_search
    from sat_core.data.images import crop_for_display, load_image, preprocess

    from explorer.maps import step_words

    image = load_image(data, name=name)
    tensor, _ = preprocess(image, loaded.preprocess)
    best = beam_search(loaded.model, tensor.unsqueeze(0), loaded.vocab, cfg)[0][0]
    crop = np.asarray(crop_for_display(image, loaded.preprocess))
    strip = viz.word_strip(crop, step_words(best.words, len(best.alphas)), best.alphas, best.grid,
                           method="nearest", panel_size=112, columns=8)
    return viz.strip_png(strip)


def step_timings(loaded, data: bytes, cfg, runs: int) -> tuple[list[float], list[float]]:
    """(decoder step alone, step + its α overlay) in ms, cycling back to the start at the caption's end."""
    from sat_core.decoding import DecodeSession
    from sat_core.data.images import crop_for_display, load_image, preprocess

    from explorer.maps import MapSettings, overlays

    image = load_image(data)
    tensor, _ = preprocess(image, loaded.preprocess)
    crop = np.asarray(crop_for_display(image, loaded.preprocess))
    session = DecodeSession(loaded.model, loaded.vocab, tensor, cfg)
    settings = MapSettings()

    def advance(draw: bool) -> None:
        if session.done:
            while session.steps:
                session.back()
        view = session.step()
        if draw:
            overlays(crop, view.alpha.reshape(1, -1), session.grid, settings)

    return timings(lambda: advance(False), runs, warmup=3), timings(lambda: advance(True), runs, warmup=3)


def run(checkpoint: Path, images: dict[str, bytes], runs: int, beam: int, max_len: int, threads: int | None) -> dict:
    import torch

    from sat_core.checkpoint import load_checkpoint
    from sat_core.config import DecodeConfig

    if threads:
        torch.set_num_threads(threads)
    loaded = load_checkpoint(checkpoint, device="cpu")
    cfg = DecodeConfig(beam_size=beam, max_len=max_len)
    report = {
        "checkpoint": str(loaded.path), "attention": loaded.model_config.attention,
        "encoder": loaded.model_config.encoder, "image_size": loaded.preprocess.image_size,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "torch_threads": torch.get_num_threads(), "beam": beam, "max_len": max_len, "images": {},
    }
    for name, data in images.items():
        caption = timings(lambda: caption_once(loaded, data, name, cfg), runs)
        step, step_draw = step_timings(loaded, data, DecodeConfig(beam_size=1, max_len=max_len), runs)
        report["images"][name] = {"bytes": len(data), "caption": summary(caption), "step": summary(step),
                                  "step_and_overlay": summary(step_draw)}
    return report


def print_report(report: dict) -> None:
    print(f"checkpoint {report['checkpoint']} ({report['attention']}, {report['encoder']} encoder, "
          f"{report['image_size']} px, {report['parameters']:,} parameters); CPU, {report['torch_threads']} threads, "
          f"beam {report['beam']}, max length {report['max_len']}")
    print(f"{'image':<14}{'measure':<34}{'mean ms':>9}{'p50 ms':>9}{'p95 ms':>9}")
    labels = {"caption": "upload -> caption + α strip", "step": "one decode step",
              "step_and_overlay": "one step + its α overlay"}
    for name, parts in report["images"].items():
        for key, label in labels.items():
            s = parts[key]
            print(f"{name:<14}{label:<34}{s['mean_ms']:>9.1f}{s['p50_ms']:>9.1f}{s['p95_ms']:>9.1f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m explorer.dev.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=REPO_ROOT / "checkpoints" / "shapes_soft")
    parser.add_argument("--image", type=Path, action="append", help="image file(s); default: a scene and a photo")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--beam", type=int, default=3)
    parser.add_argument("--max-len", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    from sat_core.errors import SatError

    try:
        images = {p.name: p.read_bytes() for p in args.image} if args.image else default_images()
        report = run(args.checkpoint, images, args.runs, args.beam, args.max_len, args.threads)
    except (SatError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
