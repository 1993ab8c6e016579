"""Can the decoder's initial state know how many objects of each category a scene holds?

A probe, not a benchmark: it encodes scenes of the scenes world once with a frozen encoder, then
trains two small classifiers on the annotations to predict, for every category, how many objects of
it the scene holds (0–4):

- ``mean``: what the paper's f_init reads, the mean annotation, then Linear–tanh–Linear;
- ``cells``: what ``ModelConfig.init_cells`` reads, LayerNorm(Σ_i ReLU(W a_i + b)), then the same head;
- ``conv`` (``--pooling conv``): the same sum over a 3×3 convolution of the grid and a 1×1 layer.

``--tune-blocks N`` asks whether training the encoder would help: the scenes are encoded only up to
N blocks before the stride-16 tap, and every probe runs those last N EfficientNet blocks itself
(``ModelConfig.tune_blocks``: starting from the ImageNet weights, batch-norm statistics kept, their
weights trained with the probe at a tenth of its learning rate).

It prints, on the test scenes, how often each gets a present category's count right, how often a
category with two or more objects, and how often every category of a scene at once::

    python -m sat_core.count_probe --data data/scenes/dataset.json --images data/scenes
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

import sat_core  # noqa: F401  (the allocator settings)
from sat_core.config import ModelConfig, PreprocessConfig
from sat_core.data import load_karpathy
from sat_core.errors import SatError
from sat_core.images import load_and_preprocess
from sat_core.models.decoder import CellSum
from sat_core.models.efficientnet import MEAN, STD
from sat_core.models.encoder import Annotations, Encoder

MAX_COUNT = 4


def encode_split(data, split: str, limit: int, encoder: nn.Module, pre: PreprocessConfig,
                 categories: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Annotations (N, L, D) in fp16 and per-category counts (N, C) of a split's first ``limit`` scenes.

    ``encoder`` maps images to ``Annotations`` (or, with ``--tune-blocks``, to an earlier block's map)."""
    images = [im for im in data.images if im.split == split][:limit]
    if not images:
        raise SatError(f"The dataset has no {split!r} images; build the world with python -m sat_core.world --kind scenes.")
    feats, counts = [], torch.zeros(len(images), len(categories), dtype=torch.long)
    batch = max(1, 32 * 224**2 // pre.image_size**2)
    for start in range(0, len(images), batch):
        chunk = images[start : start + batch]
        pixels = torch.stack([load_and_preprocess(im.path, pre)[0] for im in chunk])
        with torch.no_grad():
            feats.append(encoder(pixels).feats.half())
    for row, im in enumerate(images):
        for obj in im.objects or []:
            counts[row, categories.index(obj["category"])] += 1
    return torch.cat(feats), counts.clamp(max=MAX_COUNT)


class ConvSum(nn.Module):
    """LayerNorm(Σ_i ReLU(W₂ ReLU(conv3×3(a)_i))): each cell also sees its 8 neighbours, so a layer
    could fire once per object (at its centre) instead of once per cell it covers."""

    def __init__(self, dim: int, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(dim, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 1), nn.ReLU())
        self.norm = nn.LayerNorm(width)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        B, L, D = feats.shape
        side = int(L ** 0.5)
        grid = feats.transpose(1, 2).reshape(B, D, side, side)
        return self.norm(self.net(grid).flatten(2).sum(-1))


class Cached(nn.Module):
    """Images -> the frozen part of an encoder built with ``tune_blocks`` (``Encoder.cacheable``), as (B, L, C)."""

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, images: torch.Tensor) -> Annotations:
        fmap = self.encoder.cacheable(images)  # (B, C, gh, gw)
        return Annotations(fmap.flatten(2).transpose(1, 2), (fmap.shape[2], fmap.shape[3]))  # (B, L, C)


class Tail(nn.Module):
    """(B, L, C) cached maps -> (B, L, D) annotations through the encoder's trained blocks (``from_cached``).
    The encoder stays in eval mode (batch-norm keeps ImageNet's statistics); only those blocks learn."""

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        B, L, C = feats.shape
        side = int(L ** 0.5)
        return self.encoder.from_cached(feats.transpose(1, 2).reshape(B, C, side, side)).feats  # (B, L, D)


class CountProbe(nn.Module):
    """Per category, logits over 0..MAX_COUNT objects, from the mean annotation, summed cells or a summed convolution."""

    def __init__(self, dim: int, categories: int, pooling: str, width: int = 256, tail: Tail | None = None) -> None:
        super().__init__()
        self.categories = categories
        self.tail = tail
        self.cells = CellSum(dim, width) if pooling == "cells" else None  # the decoder's own module
        self.conv = ConvSum(dim, width) if pooling == "conv" else None
        self.head = nn.Sequential(nn.Linear(dim if pooling == "mean" else width, width), nn.Tanh(),
                                  nn.Linear(width, categories * (MAX_COUNT + 1)))

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        if self.tail is not None:
            feats = self.tail(feats)  # (B, L, D)
        if self.cells is not None:
            summary = self.cells(feats)
        elif self.conv is not None:
            summary = self.conv(feats)
        else:
            summary = feats.mean(1)
        return self.head(summary).view(-1, self.categories, MAX_COUNT + 1)


def fit(probe: CountProbe, x: torch.Tensor, y: torch.Tensor, epochs: int,
        after_epoch: Callable[[int], None] | None = None) -> None:
    """Adam over the probe (and any trained encoder blocks, at a tenth of the rate); ``after_epoch(e)``
    runs after epoch e (1-based), e.g. to report the test figures as training goes."""
    tail = [q for q in probe.tail.parameters() if q.requires_grad] if probe.tail is not None else []
    rest = [q for q in probe.parameters() if q.requires_grad and all(q is not t for t in tail)]
    opt = torch.optim.Adam([{"params": rest}, {"params": tail, "lr": 1e-4}], 1e-3)
    for epoch in range(1, epochs + 1):
        for rows in torch.randperm(len(x)).split(64):
            logits = probe(x[rows].float())
            loss = nn.functional.cross_entropy(logits.reshape(-1, MAX_COUNT + 1), y[rows].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        if after_epoch is not None:
            after_epoch(epoch)


def score(probe: CountProbe, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    with torch.no_grad():
        guess = probe(x.float()).argmax(-1)  # (N, C)
    present, several = y > 0, y >= 2
    return {
        "present": float((guess[present] == y[present]).float().mean()),
        "two_or_more": float((guess[several] == y[several]).float().mean()),
        "whole_scene": float((guess == y).all(1).float().mean()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sat_core.count_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/scenes/dataset.json", help="a scenes-world dataset JSON")
    p.add_argument("--images", default="data/scenes", help="its image folder")
    p.add_argument("--coarse", action="store_true", help="stride-32 annotations at 448 px instead of stride 16 at 224")
    p.add_argument("--shallow", action="store_true",
                   help="the end of the 80-wide stride-16 stage (block 7) instead of block 10, at 224 px")
    p.add_argument("--train", type=int, default=4000, help="training scenes for the probes")
    p.add_argument("--test", type=int, default=500, help="test scenes")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pooling", nargs="+", default=["mean", "cells"], choices=["mean", "cells", "conv"])
    p.add_argument("--report-every", type=int, default=0,
                   help="also print the test figures every N epochs (0: only at the end)")
    p.add_argument("--tune-blocks", type=int, default=0,
                   help="train the last N EfficientNet blocks before the tap with each probe (0: frozen)")
    args = p.parse_args(argv)
    try:
        data = load_karpathy(args.data, args.images)
        categories = sorted({o["category"] for im in data.images for o in im.objects or [] if "category" in o})
        if not categories:
            raise SatError(f"{args.data} has no object records: the probe needs the scenes world "
                           "(python -m sat_core.world --kind scenes).")
        dim, size = (320, 448) if args.coarse else (80 if args.shallow else 112, 224)
        # ModelConfig refuses --coarse with --shallow, or more blocks than the tap has, with one message each.
        config = ModelConfig(encoder="efficientnet_lite0", pretrained=True, feature_dim=dim, coarse=args.coarse,
                             shallow=args.shallow, tune_blocks=args.tune_blocks)

        def encoder() -> Encoder:  # a fresh copy for every probe: each trains its own blocks
            return Encoder(config).eval()

        pre = PreprocessConfig(image_size=size, mean=MEAN, std=STD)
        source = Cached(encoder()) if args.tune_blocks else encoder()
        started = time.perf_counter()
        x_train, y_train = encode_split(data, "train", args.train, source, pre, categories)
        x_test, y_test = encode_split(data, "test", args.test, source, pre, categories)
        print(f"encoded {len(x_train)} + {len(x_test)} scenes, {x_train.shape[2]} × {x_train.shape[1]} annotations, "
              f"{time.perf_counter() - started:.0f} s", flush=True)
        for pooling in args.pooling:
            torch.manual_seed(args.seed)  # the same seed for the probe's initial weights and its batches
            tail = Tail(encoder()) if args.tune_blocks else None
            probe = CountProbe(dim, len(categories), pooling, tail=tail)
            name = f"{pooling:>5}{f' + {args.tune_blocks} trained blocks' if tail else ''}"

            def report(epoch: int, final: bool = False, probe: CountProbe = probe, name: str = name) -> None:
                if final or (args.report_every and epoch % args.report_every == 0 and epoch < args.epochs):
                    s = score(probe, x_test, y_test)
                    print(f"{name}{'' if final else f' (epoch {epoch})'}: right count of a present category "
                          f"{s['present']:.3f}, of one with ≥ 2 objects {s['two_or_more']:.3f}, every category "
                          f"of the scene {s['whole_scene']:.3f}", flush=True)

            fit(probe, x_train, y_train, args.epochs, report)
            report(args.epochs, final=True)
    except SatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
