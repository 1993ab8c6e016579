"""Fit a trained scenes model's relation judge: where each category lies, to judge the relations captions state.

The count head says how many, not where: the count prior (``--count-prior``) cannot tell "a dog left of a cat"
from "a cat left of a dog". A relation judge (``ModelConfig.relation_judge``, ``RelationJudge`` in
``sat_core.models.decoder``) maps each annotation, through a layer W wide, to one score per category; a softmax
over the cells gives each
category's map and its centre. It is fitted after training on the training scenes with the rest of the model
frozen, to the share of each cell the category's objects cover, and decoding reads it only to rank finished
captions (``--relation-prior``) and to choose among the captions naming the same objects the one whose relations
it believes (``--relation-choice``). The ship fits it when a preset names ``relation_judge``; for a checkpoint of
your own:

    python -m sat_core.relation_judge --checkpoint runs/mine/last --data data/scenes/dataset.json \\
        --images data/scenes --out runs/mine/judged

then evaluate the new checkpoint with the flags the command prints: its figures are not those of the checkpoint
it came from.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np
import torch

from sat_core import checkpoint as ckpt
from sat_core.colour_counter import attach, fit_rows, fitting_parser, run_fitting, training_annotations
from sat_core.data import KarpathyData
from sat_core.errors import SatError
from sat_core.models.decoder import RelationJudge
from sat_core.scenes_catalog import COUNTED


@dataclasses.dataclass(frozen=True)
class FitConfig:
    width: int = 128  # W, the layer on each annotation
    feet: bool = True  # a map of where each category's feet stand, too (ModelConfig.relation_feet)
    train_images: int = 8000  # the first N training scenes (0: all)
    epochs: int = 8
    lr: float = 1e-2  # one-cycle peak
    batch_size: int = 128
    seed: int = 0


def coverage(objects: list[dict], image_size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Per counted category, the share of each of side × side cells its objects' boxes cover, then the share of
    each cell of the row their feet stand on (its box's bottom edge), each map normalised to sum to 1 over the
    cells (2C, side²), and which maps the scene fills (2C,) bool."""
    index = {c: i for i, c in enumerate(COUNTED)}
    C, cell = len(COUNTED), image_size / side
    edges = np.arange(side) * cell
    maps = np.zeros((2 * C, side * side), np.float32)
    for o in objects:
        x, y, w, h = o["full_bbox"]
        across = np.clip((np.minimum(x + w, edges + cell) - np.maximum(x, edges)) / cell, 0, 1)
        down = np.clip((np.minimum(y + h, edges + cell) - np.maximum(y, edges)) / cell, 0, 1)
        maps[index[o["category"]]] += np.outer(down, across).reshape(-1)
        foot = min(max(int((min(y + h, image_size) - 1) // cell), 0), side - 1)
        maps[C + index[o["category"]], foot * side:(foot + 1) * side] += across
    present = maps.sum(1) > 0
    maps[present] /= maps[present].sum(1, keepdims=True)
    return maps, present


def fit(feats: torch.Tensor, maps: torch.Tensor, present: torch.Tensor, cfg: FitConfig) -> tuple[RelationJudge, float]:
    """A RelationJudge fitted by Adam on a one-cycle schedule to −Σ_l target_l log p(l | map) over the maps (N, 2C,
    L) each scene fills (``coverage``): (judge, last epoch's mean loss). Deterministic for a seed."""
    torch.manual_seed(cfg.seed)
    C = maps.shape[1] // 2  # maps: (N, 2C, L), the feet maps after the objects' ones
    if not cfg.feet:
        maps, present = maps[:, :C], present[:, :C]
    judge = RelationJudge(feats.shape[-1], cfg.width, C, cfg.feet)

    def loss(rows: torch.Tensor) -> torch.Tensor:
        logp = judge.maps(feats[rows].float()).transpose(1, 2)  # (b, C, L)
        return -(maps[rows] * logp).sum(-1)[present[rows]].mean()

    return judge.eval(), fit_rows(judge, len(feats), loss, cfg.epochs, cfg.lr, cfg.batch_size, cfg.seed)


def add_relation_judge(loaded: ckpt.LoadedCheckpoint, data: KarpathyData, cfg: FitConfig = FitConfig(),
                       log=print) -> ckpt.LoadedCheckpoint:
    """The checkpoint's model with a fitted relation judge (the rest of the model unchanged)."""
    if loaded.model.decoder.count_head is None:
        raise SatError(f"{loaded.path} has no count head (a model trained with --count-lambda on the scenes world): "
                       "the relation judge judges the categories the count head names.")
    if loaded.model_config.relation_judge:
        raise SatError(f"{loaded.path} already has a relation judge.")
    started = time.perf_counter()
    feats, _ = training_annotations(loaded, data, cfg.train_images)
    side = round(feats.shape[1] ** 0.5)
    images = [r for r in data.images if r.split == "train"][: len(feats)]
    targets = [coverage(r.objects, loaded.preprocess.image_size, side) for r in images]
    maps = torch.from_numpy(np.stack([m for m, _ in targets]))
    present = torch.from_numpy(np.stack([p for _, p in targets]))
    encoded = time.perf_counter()
    judge, loss = fit(feats, maps, present, cfg)
    log(f"relation judge: {len(feats)} training scenes encoded in {encoded - started:.0f} s, {cfg.epochs} epochs "
        f"fitted in {time.perf_counter() - encoded:.0f} s (last loss {loss:.3f} nats per category)")
    config = dataclasses.replace(loaded.model_config, relation_judge=cfg.width, relation_feet=cfg.feet)
    return attach(loaded, config, "relation_judge", judge)


def main(argv: list[str] | None = None) -> int:
    p = fitting_parser("python -m sat_core.relation_judge", __doc__.split("\n")[0], FitConfig(),
                       "W, the layer on each annotation")
    p.add_argument("--no-feet", dest="feet", action="store_false",
                   help="no map of where each category's feet stand: \"in front of\" by the centres' rows")
    args = p.parse_args(argv)
    fit_config = FitConfig(width=args.width, feet=args.feet, train_images=args.train_images, epochs=args.epochs)
    return run_fitting(p, args, lambda loaded, data: add_relation_judge(loaded, data, fit_config),
                       lambda defaults: (f" --count-prior {defaults.count_prior:g}" if defaults.count_prior else "")
                       + " --relation-prior 1 --relation-choice 4")


if __name__ == "__main__":
    sys.exit(main())
