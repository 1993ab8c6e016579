"""Training objectives: cross-entropy, the doubly stochastic penalty, and hard attention's REINFORCE terms."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sat_core.alpha import doubly_stochastic, entropy
from sat_core.config import HardAttentionConfig


def token_nll(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """−log p(y_t | a, y_<t) per real token, 0 on pads: (B, T)."""
    nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, T)
    return nll * mask


class MovingBaseline:
    """b_k = decay · b_{k−1} + (1 − decay) · mean_batch log p(y | s̃_k, a); starts at the first reward."""

    def __init__(self, decay: float = 0.9, value: float | None = None) -> None:
        self.decay = decay
        self.value = value

    def update(self, rewards: torch.Tensor) -> float:
        r = float(rewards.mean())
        self.value = r if self.value is None else self.decay * self.value + (1 - self.decay) * r
        return self.value


@dataclass
class LossParts:
    total: torch.Tensor
    nll: float  # mean −log p per token
    dsa: float  # mean doubly stochastic penalty per example
    reinforce: float
    entropy: float
    tokens: int


def caption_loss(
    out,
    targets: torch.Tensor,
    *,
    dsa_lambda: float,
    hard: HardAttentionConfig | None = None,
    baseline: MovingBaseline | None = None,
) -> LossParts:
    """The loss to minimise for soft (L_d) or hard (−L_s surrogate) attention.

    Every term is a per-caption sum as in PAPER.md, summed over the batch and divided by the
    batch's number of real tokens (so the learning rate does not depend on caption length):
    soft: −log p(y|a) + λ Σ_i (1 − Σ_t α_ti)²;
    hard: −log p(y|s̃,a) − λ_r (log p(y|s̃,a) − b) log p(s̃|a) − λ_e H[s̃], the last two terms for the
    examples that sampled locations (the others were trained with the expectation α).
    """
    mask = (targets != 0).float()  # (B, T); <pad> = 0
    tokens = mask.sum().clamp_min(1)
    nll_tok = token_nll(out.logits, targets, mask)  # (B, T)
    loss = nll_tok.sum() / tokens
    dsa = doubly_stochastic(out.alphas, mask)  # (B,)
    if dsa_lambda:
        loss = loss + dsa_lambda * dsa.sum() / tokens
    rf_value = ent_value = 0.0
    if hard is not None and bool(out.sampled.any()):
        rows = out.sampled
        reward = -nll_tok.sum(1).detach()  # (B,) log p(y | s̃, a)
        b = reward[rows].mean() if baseline is None or baseline.value is None else baseline.value
        advantage = (reward - b) if hard.baseline else reward  # (B,)
        log_p_s = (out.log_p_loc * mask).sum(1)  # (B,) log p(s̃ | a)
        h = (entropy(out.alphas) * mask).sum(1)  # (B,) H[α_t] summed over real steps
        if hard.reinforce:
            rf = -(hard.reinforce_weight * advantage * log_p_s)[rows].sum() / tokens
            loss = loss + rf
            rf_value = float(rf.detach())
        if hard.entropy_weight:
            ent = h[rows].sum() / tokens
            loss = loss - hard.entropy_weight * ent
            ent_value = float(ent.detach())
        if baseline is not None and hard.baseline:
            baseline.update(reward[rows])
    return LossParts(loss, float(nll_tok.detach().sum() / tokens), float(dsa.detach().mean()), rf_value,
                     ent_value, int(tokens))
