"""Pretrain the small encoder on the synthetic world, the way the paper's VGG was pretrained on ImageNet.

    python -m sat_core.pretrain --data data/world/dataset.json --images data/world --out runs/world_encoder

The paper's encoder was a CNN pretrained on a classification task and then frozen. The embedded world
has no ImageNet, so the small CNN learns the world's own visual vocabulary instead: a 1×1 head on every
14×14 annotation predicts the shape, colour and size of the object covering that cell (or background),
from the scenes' ground-truth masks. The head is thrown away; the encoder is then frozen for captioning
(``python -m sat_core.train --encoder-weights runs/world_encoder/encoder.safetensors``), so the decoder
must still learn where to look. Uses train-split images only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sat_core import cli
from sat_core.allocator import keep_freed_memory
from sat_core.io import save_tensors_atomic, write_json_atomic
from sat_core.config import ModelConfig, PreprocessConfig
from sat_core.data.imagestore import ImageStore, normalise
from sat_core.data.karpathy import load_karpathy
from sat_core.errors import DatasetError, SatError
from sat_core.models.encoder import Encoder
from sat_core.data.masks import rle_decode
from sat_core.worlds.shapes.scene import COLOURS, SHAPES, SIZES

HEADS = {"shape": ["background", *SHAPES], "colour": ["background", *COLOURS], "size": ["background", *SIZES]}
MIN_COVER = 0.25  # a cell is labelled with an object covering at least this share of it


def cell_labels(objects: list[dict], grid: int, cell: int) -> np.ndarray:
    """(3, grid, grid) class ids (shape, colour, size) of the object covering most of each cell."""
    labels = np.zeros((3, grid, grid), dtype=np.int64)
    best = np.full((grid, grid), MIN_COVER * cell * cell)
    for obj in objects:
        cover = rle_decode(obj["mask"]).reshape(grid, cell, grid, cell).sum(axis=(1, 3))  # (g, g)
        win = cover >= best
        best = np.where(win, cover, best)
        for h, key in enumerate(("shape", "colour", "size")):
            labels[h][win] = HEADS[key].index(obj[key])
    return labels


class CellHead(nn.Module):
    """Per-cell linear classifiers on the annotations (discarded after pretraining)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(dim, len(v)) for v in HEADS.values())

    def forward(self, feats: torch.Tensor) -> list[torch.Tensor]:
        return [head(feats) for head in self.heads]  # each (B, L, C)


def pretrain(data_path: str, images: str, out: Path, *, epochs: int, lr: float, batch_size: int,
             channels: tuple[int, ...], seed: int) -> dict:
    torch.manual_seed(seed)
    data = load_karpathy(data_path, images)
    train = [i for i in data.split("train")]
    if data.images[train[0]].objects is None:
        raise DatasetError(f"{data_path} has no object annotations; pretraining needs the synthetic world.")
    prep = PreprocessConfig(image_size=112)
    store = ImageStore(data, prep, splits=("train",), progress=False)
    ids = [i for i in train if i in store]
    labels = torch.from_numpy(np.stack([cell_labels(data.images[i].objects, 14, 8) for i in ids]))  # (N, 3, 14, 14)
    config = ModelConfig(small_channels=channels, feature_dim=channels[-1], vocab_size=5)
    encoder, head = Encoder(config), CellHead(channels[-1])
    opt = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=lr)
    rng = np.random.default_rng(seed)
    log = []
    for epoch in range(epochs):
        started, order, accs = time.perf_counter(), rng.permutation(len(ids)), []
        encoder.train()
        for start in range(0, len(ids), batch_size):
            rows = order[start : start + batch_size]
            images = normalise(store.batch([ids[r] for r in rows]), prep)  # (B, 3, 112, 112)
            feats, _ = encoder(images)  # (B, L, D)
            target = labels[rows].flatten(2)  # (B, 3, L)
            logits = head(feats)
            loss = sum(F.cross_entropy(lg.transpose(1, 2), target[:, h]) for h, lg in enumerate(logits))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            accs.append([(lg.argmax(-1) == target[:, h]).float().mean().item() for h, lg in enumerate(logits)])
        acc = np.mean(accs[-20:], axis=0)
        log.append({"epoch": epoch + 1, "loss": float(loss.detach()), "seconds": time.perf_counter() - started,
                    **{f"cell_acc_{k}": float(a) for k, a in zip(HEADS, acc)}})
        print(json.dumps(log[-1]), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    save_tensors_atomic(out / "encoder.safetensors", encoder.state_dict())
    meta = {"small_channels": list(channels), "epochs": epochs, "images": len(ids), "log": log,
            "data": str(data_path)}
    write_json_atomic(out / "encoder.json", meta)
    return meta


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=cli.prog("sat_core.pretrain"), description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--images", required=True)
    p.add_argument("--out", type=Path, default=Path("runs/world_encoder"))
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--small-channels", type=int, nargs="+", default=[24, 48, 96])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    keep_freed_memory()
    try:
        pretrain(args.data, args.images, args.out, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                 channels=tuple(args.small_channels), seed=args.seed)
    except SatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
