"""Objectives beyond the paper's, plugged into training as extra loss terms: the paper's path never branches on them.

A term is called with the teacher-forced output and the batch, and returns what it adds to the loss and the
value to log under its ``name``; ``extra_terms`` builds the ones a config asks for (none by default).

Supervised attention (Liu et al., 2017; not in the paper; ``--attention-lambda λ``): for every caption word
linked to objects, the cross-entropy −Σ_i q_ti log α_ti from the linked objects' share of each grid cell q to
α. Only the synthetic worlds link words to object masks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from sat_core.config import PreprocessConfig, TrainConfig
from sat_core.data.images import crop_info
from sat_core.data.karpathy import Batch, CaptionDataset
from sat_core.data.masks import rle_decode
from sat_core.errors import DatasetError, SatError
from sat_core.models.captioner import TeacherForced
from sat_core.regions import cell_cover


class LossTerm(Protocol):
    """One objective added to ``losses.caption_loss``'s total."""

    name: str  # the key of its value in the training log

    def __call__(self, out: TeacherForced, batch: Batch) -> tuple[torch.Tensor, float]:
        """(what to add to the loss, its unweighted value for the log)."""


def extra_terms(cfg: TrainConfig, captions: CaptionDataset, preprocess: PreprocessConfig) -> list[LossTerm]:
    """The terms beyond the paper's objective that ``cfg`` asks for, in the order they are added."""
    terms: list[LossTerm] = []
    if cfg.optim.attention_lambda:
        terms.append(AttentionSupervision(cfg.optim.attention_lambda, captions, preprocess))
    return terms


class AttentionSupervision:
    """λ_a · supervised attention's cross-entropy, on the captions' linked words."""

    name = "attention"

    def __init__(self, weight: float, captions: CaptionDataset, preprocess: PreprocessConfig) -> None:
        self.weight = weight
        self.targets = AttentionTargets(captions, preprocess)

    def __call__(self, out: TeacherForced, batch: Batch) -> tuple[torch.Tensor, float]:
        device = out.alphas.device
        q, linked = self.targets.batch(batch.keys, *out.alphas.shape[1:])  # (B, T, L), (B, T)
        value = attention_supervision(out.alphas, q.to(device), linked.to(device))
        return self.weight * value, float(value.detach())


def attention_supervision(alphas: torch.Tensor, targets: torch.Tensor, linked: torch.Tensor) -> torch.Tensor:
    """Supervised attention (Liu et al., 2017; not in the paper): −Σ_i q_ti log α_ti, the cross-entropy
    from the target cells q (B, T, L) to α (B, T, L), averaged over the linked words (B, T) bool."""
    cross = -(targets * alphas.float().clamp_min(1e-8).log()).sum(-1)  # (B, T)
    return cross[linked].sum() / linked.sum().clamp_min(1)


class AttentionTargets:
    """Supervised attention's targets: for each
    caption word linked to objects, q_t = the linked objects' share of each grid cell, normalised to
    sum to 1 over the cells. Only the synthetic worlds link words to masks.

    An image's covers are computed when it is first batched.
    """

    def __init__(self, captions: CaptionDataset, preprocess: PreprocessConfig) -> None:
        for i in captions.image_ids:
            record = captions.data.images[i]
            lacks = ("no objects" if not record.objects else "no word links" if not record.links
                     else "objects without masks" if not all("mask" in o for o in record.objects) else None)
            if lacks:
                raise DatasetError(
                    f"--attention-lambda needs every caption's words linked to object masks (the shapes or "
                    f"scenes world), and training image {record.path.name} has {lacks}; drop --attention-lambda "
                    "or train on a world made by python -m sat_core.world.")
        self.captions, self.preprocess = captions, preprocess
        self._covers: dict[int, dict[Any, np.ndarray]] = {}  # image -> object id -> (L,) cover

    def batch(self, keys: Sequence[int], steps: int, regions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """q (B, steps, regions) float32 and which words are linked (B, steps) bool, for the captions
        ``keys`` (Batch.keys); step t is the step that produces word t."""
        q = self.objects(keys, steps, regions).sum(2)  # (B, steps, regions): the word's objects together
        total = q.sum(-1, keepdim=True)  # (B, steps, 1); 0 where no link (or the objects lie outside the crop)
        q = torch.where(total > 0, q / total.clamp_min(1e-12), 0.0)
        return q, total[..., 0] > 0

    def objects(self, keys: Sequence[int], steps: int, regions: int) -> torch.Tensor:
        """Each linked object's own share of each cell, (B, steps, K, regions) float32 with K the most objects
        one word names (zeros past a word's objects and for words without links); steps as in ``batch``."""
        side = math.isqrt(regions)
        if side * side != regions:
            raise SatError(f"Supervised attention needs a square grid of regions, not {regions}.")
        per_word = []  # (b, t, [cover, …])
        for b, key in enumerate(keys):
            image, sentence = self.captions.sentence_of[key]
            covers = self._image_covers(image, (side, side))
            per_word += [(b, t, [covers[o] for o in ids])
                         for t, ids in self.captions.data.images[image].links[sentence] or [] if t < steps]
        c = np.zeros((len(keys), steps, max([len(x) for *_, x in per_word], default=1), regions), dtype=np.float32)
        for b, t, covers in per_word:
            c[b, t, : len(covers)] = covers
        return torch.from_numpy(c)

    def _image_covers(self, image: int, grid: tuple[int, int]) -> dict[Any, np.ndarray]:
        if image not in self._covers:
            objects = self.captions.data.images[image].objects
            masks = [rle_decode(o["mask"]) for o in objects]
            crop = crop_info((masks[0].shape[1], masks[0].shape[0]), self.preprocess)
            self._covers[image] = {o["id"]: cell_cover(m, crop, grid).astype(np.float32).ravel()
                                   for o, m in zip(objects, masks)}
        return self._covers[image]
