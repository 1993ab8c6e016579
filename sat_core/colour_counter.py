"""Fit a trained scenes model's colour counter: how many objects of each (category, colour) pair a scene holds.

The count head (``--count-lambda``) counts categories, so the count prior (``--count-prior``) cannot tell
"two red cars" from "a red car and a yellow car" when the scene holds one of each. A colour counter
(``ModelConfig.colour_counter``, ``ColourCounter`` in ``sat_core.models.decoder``) is a second counting
layer over the model's own annotations, fitted after training on the training scenes with the rest of the
model frozen; decoding reads it only to rank finished captions. The ship fits it when a preset names
``colour_counter``; for a checkpoint of your own:

    python -m sat_core.colour_counter --checkpoint runs/mine/last --data data/scenes/dataset.json \\
        --images data/scenes --out runs/mine/counted

then evaluate the new checkpoint (``python -m sat_core.evaluate --checkpoint runs/mine/counted … --count-prior 1
--card``): its figures are not those of the checkpoint it came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from sat_core import checkpoint as ckpt
from sat_core.config import DecodeConfig
from sat_core.data import KarpathyData, load_karpathy
from sat_core.decoding import encode_images
from sat_core.errors import SatError
from sat_core.images import load_image, preprocess
from sat_core.models.captioner import Captioner
from sat_core.models.decoder import MAX_COUNT_CLASSES, ColourCounter
from sat_core.scenes_catalog import COLOUR_PAIRS, COUNTED, colour_counts


@dataclasses.dataclass(frozen=True)
class FitConfig:
    width: int = 128  # G', the counting layer's width
    train_images: int = 16000  # the first N training scenes (0: all)
    epochs: int = 30
    lr: float = 1e-2  # one-cycle peak
    batch_size: int = 128
    seed: int = 0


def training_annotations(loaded: ckpt.LoadedCheckpoint, data: KarpathyData, limit: int,
                         batch_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's annotations (N, L, D) in fp16 of the first ``limit`` training scenes (0: all), as decoding
    computes them, and their colour pairs' counts (N, P): the counter's inputs and targets."""
    images = [r for r in data.images if r.split == "train"]
    images = images[:limit] if limit else images
    if not images:
        raise SatError("The dataset has no training images to fit a colour counter on.")
    bad = next((r for r in images if not r.objects or any(o.get("category") not in COUNTED for o in r.objects)), None)
    if bad is not None:
        raise SatError(f"A colour counter learns from the scenes world's objects, and training image "
                       f"{bad.path.name} has none from sat_core.scenes_catalog; fit it on a scenes world.")
    feats = []
    for start in range(0, len(images), batch_size):
        batch = torch.stack([preprocess(load_image(r.path), loaded.preprocess)[0]
                             for r in images[start:start + batch_size]])
        feats.append(encode_images(loaded.model, batch).feats.to(torch.float16).cpu())
    targets = torch.tensor([colour_counts(r.objects) for r in images], dtype=torch.long)
    return torch.cat(feats), targets


def fit(feats: torch.Tensor, targets: torch.Tensor, cfg: FitConfig) -> tuple[ColourCounter, float]:
    """A ColourCounter fitted by Adam on a one-cycle schedule to −log p(each pair's count): (counter, last
    epoch's mean loss per pair). Deterministic for a seed."""
    torch.manual_seed(cfg.seed)
    counter = ColourCounter(feats.shape[-1], cfg.width, targets.shape[1])

    def loss(rows: torch.Tensor) -> torch.Tensor:
        logits = counter(feats[rows].float())
        return F.cross_entropy(logits.reshape(-1, MAX_COUNT_CLASSES), targets[rows].reshape(-1))

    return counter.eval(), fit_rows(counter, len(feats), loss, cfg.epochs, cfg.lr, cfg.batch_size, cfg.seed)


def fit_rows(module: torch.nn.Module, n: int, loss_of, epochs: int, lr: float, batch_size: int, seed: int) -> float:
    """Fit ``module`` by Adam on a one-cycle schedule peaking at ``lr``, over ``epochs`` passes through n rows in
    random batches (``loss_of(rows)`` is a batch's mean loss): the last epoch's mean loss. Deterministic for a
    seed. Shared by the modules fitted after training on a model's frozen annotations (this counter and
    ``sat_core.relation_judge``)."""
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=epochs * -(-n // batch_size))
    generator = torch.Generator().manual_seed(seed)
    loss_sum = 0.0
    for _ in range(epochs):
        loss_sum = 0.0
        for rows in torch.randperm(n, generator=generator).split(batch_size):
            loss = loss_of(rows)
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
            loss_sum += float(loss.detach()) * len(rows)
    return loss_sum / n


def attach(loaded: ckpt.LoadedCheckpoint, config, name: str, module: torch.nn.Module) -> ckpt.LoadedCheckpoint:
    """The checkpoint with its model rebuilt from ``config`` and ``module``'s weights as ``decoder.<name>`` (the
    rest of the model unchanged)."""
    model = Captioner(config)
    state = {**loaded.model.state_dict(), **{f"decoder.{name}.{k}": v for k, v in module.state_dict().items()}}
    model.load_state_dict(state)
    return dataclasses.replace(loaded, model=model.eval(), model_config=config)


def add_colour_counter(loaded: ckpt.LoadedCheckpoint, data: KarpathyData, cfg: FitConfig = FitConfig(),
                       log=print) -> ckpt.LoadedCheckpoint:
    """The checkpoint's model with a fitted colour counter (the rest of the model unchanged)."""
    if loaded.model.decoder.count_head is None:
        raise SatError(f"{loaded.path} has no count head (a model trained with --count-lambda): a colour counter "
                       "only serves the count head's ranking of captions.")
    if loaded.model_config.count_colours:
        raise SatError(f"{loaded.path} already counts colours (--count-colours or a fitted colour counter).")
    started = time.perf_counter()
    feats, targets = training_annotations(loaded, data, cfg.train_images)
    encoded = time.perf_counter()
    counter, loss = fit(feats, targets, cfg)
    log(f"colour counter: {len(feats)} training scenes encoded in {encoded - started:.0f} s, "
        f"{cfg.epochs} epochs fitted in {time.perf_counter() - encoded:.0f} s (last loss {loss:.4f} per pair)")
    config = dataclasses.replace(loaded.model_config, count_colours=len(COLOUR_PAIRS), colour_counter=cfg.width)
    return attach(loaded, config, "colour_counter", counter)


def decoding_flags(cfg: DecodeConfig) -> str:
    """The command-line flags of a DecodeConfig's beam, length normalisation and scenes rules."""
    return " ".join([f"--beam {cfg.beam_size}", f"--length-norm {cfg.length_norm:g}",
                     "--one-mention-per-kind" if cfg.one_mention_per_kind else "--no-one-mention-per-kind",
                     "--distinct-content" if cfg.distinct_content else "--no-distinct-content"])


def fitting_parser(prog: str, description: str, defaults, width_help: str) -> argparse.ArgumentParser:
    """The command line of a module fitted after training (this counter, ``sat_core.relation_judge``), with the
    width, training scenes and epochs of its ``defaults`` (its FitConfig)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--checkpoint", required=True, help="a scenes checkpoint trained with --count-lambda")
    p.add_argument("--data", required=True, help="the scenes world's dataset.json")
    p.add_argument("--images", required=True, help="its image folder")
    p.add_argument("--out", required=True, type=Path, help="the new checkpoint folder (not the one read)")
    p.add_argument("--width", type=int, default=defaults.width, help=width_help)
    p.add_argument("--train-images", type=int, default=defaults.train_images,
                   help="fit on the first N training scenes (0: all)")
    p.add_argument("--epochs", type=int, default=defaults.epochs)
    return p


def run_fitting(p: argparse.ArgumentParser, args: argparse.Namespace,
                fitted: Callable[[ckpt.LoadedCheckpoint, KarpathyData], ckpt.LoadedCheckpoint],
                priors: Callable[[DecodeConfig], str]) -> int:
    """Read the checkpoint and the world ``args`` name, write ``fitted(loaded, data)`` to ``--out`` (never over the
    checkpoint read) and say how to evaluate it: the source's decoding flags, then ``priors(its defaults)``."""
    if args.width < 1 or args.epochs < 1 or args.train_images < 0:
        p.error("--width and --epochs must be at least 1, --train-images at least 0")
    try:
        if args.out.resolve() == Path(args.checkpoint).resolve():
            raise SatError("--out must be a new folder: the checkpoint read keeps its own figures.")
        loaded = ckpt.load_checkpoint(args.checkpoint)
        result = fitted(loaded, load_karpathy(args.data, args.images))
        ckpt.save_checkpoint(args.out, result.model, model_config=result.model_config, vocab=result.vocab,
                             preprocess=result.preprocess, training=result.config.get("training"))
    except SatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    defaults = loaded.decode_defaults()
    print(f"wrote {args.out}: evaluate it with python -m sat_core.evaluate --checkpoint {args.out} --data {args.data} "
          f"--images {args.images} {decoding_flags(defaults)}{priors(defaults)} --card  (the new checkpoint has no "
          f"figures yet, so name the decoding: these are {args.checkpoint}'s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = fitting_parser("python -m sat_core.colour_counter", __doc__.split("\n")[0], FitConfig(),
                       "G', the counting layer's width")
    args = p.parse_args(argv)
    fit_config = FitConfig(width=args.width, train_images=args.train_images, epochs=args.epochs)
    return run_fitting(p, args, lambda loaded, data: add_colour_counter(loaded, data, fit_config),
                       lambda defaults: " --count-prior 1")


if __name__ == "__main__":
    sys.exit(main())
