"""Captioner = Encoder + Decoder, with the teacher-forced forward pass used for training."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sat_core.config import ModelConfig
from sat_core.errors import SatError
from sat_core.models.decoder import Decoder
from sat_core.models.encoder import Annotations, Encoder


@dataclass
class TeacherForced:
    logits: torch.Tensor  # (B, T, V) predictions for captions[:, 1:]
    alphas: torch.Tensor  # (B, T, L)
    betas: torch.Tensor  # (B, T)
    log_p_loc: torch.Tensor  # (B, T) log p(s_t | a) of sampled locations (hard), else 0
    sampled: torch.Tensor  # (B,) bool: rows trained with sampled locations (hard attention)


class Captioner(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.vocab_size <= 4:
            raise SatError("ModelConfig.vocab_size must be set from the vocabulary before building.")
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)

    @property
    def hard(self) -> bool:
        return self.decoder.hard

    def encode(self, images: torch.Tensor) -> Annotations:
        """Annotations (B, L, D) of images (B, 3, H, W) with this call's grid (gh, gw).

        In fp32 even inside bf16 autocast, unless the encoder is being fine-tuned: the trainer caches
        a frozen encoder's annotations in fp32, and EfficientNet-Lite0's in bf16 change the best
        caption of 16 % of the test scenes (98 % agree with fp32 annotations and a bf16 decoder).
        """
        if self.training and self.config.finetune_encoder:
            return self.encoder(images)
        with torch.autocast(images.device.type, enabled=False):
            return self.encoder(images.float())

    def forward(
        self,
        images: torch.Tensor | None,
        captions: torch.Tensor,
        *,
        feats: torch.Tensor | None = None,
        image_index: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> TeacherForced:
        """Teacher forcing over captions (B, T+1) = <start> w_1 … <end> [<pad>…].

        ``image_index`` (B,) maps captions to rows of ``images`` so the captions of one image share
        one encoder pass. Hard attention in training mode samples locations for a random half of the
        examples (``mix_soft_prob``) and uses the expectation α for the rest, as in the paper.
        """
        if feats is None:
            feats = self.encode(images).feats  # (U, L, D)
        prep, h, c = self.decoder.prepare(feats)  # per unique image: (U, L, A), (U, n)
        if image_index is not None:
            if _grouped(image_index, feats.shape[0]):
                # k adjacent captions per image (--batching image): the decoder reads each image's
                # projection and annotations in place, as beam search does with its beams, instead
                # of k copies (and its backward pass sums their gradients once per image).
                h, c = h[image_index], c[image_index]  # (B, n)
            else:
                prep, h, c = prep.index(image_index), h[image_index], c[image_index]  # (B, …)
        B, T = captions.shape[0], captions.shape[1] - 1
        sample = None
        if self.hard and self.training:
            p = self.config.hard.mix_soft_prob
            draw = torch.rand(B, generator=generator, device="cpu" if generator is None else generator.device)
            sample = (draw >= p).to(captions.device)  # (B,)
        logits, alphas, betas, log_p = self.decoder.teacher_forced(
            captions[:, :T], h, c, prep, sample=sample, generator=generator
        )  # (B, T, V), (B, T, L), (B, T), (B, T)
        if sample is None:
            sample = torch.zeros(B, dtype=torch.bool, device=captions.device)
        return TeacherForced(logits, alphas, betas, log_p, sample)


def _grouped(image_index: torch.Tensor, n_images: int) -> bool:
    """True when ``image_index`` is 0…0, 1…1, …: the same number k ≥ 1 of adjacent rows for every image."""
    B = image_index.shape[0]
    if n_images == 0 or B % n_images:
        return False
    k = B // n_images
    expected = torch.arange(n_images, device=image_index.device).repeat_interleave(k)
    return bool(torch.equal(image_index, expected))
