"""Training objectives: cross-entropy, the doubly stochastic penalty, and hard attention's REINFORCE terms."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sat_core.evaluation.alpha import doubly_stochastic, entropy
from sat_core.config import HardAttentionConfig


def token_nll(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """−log p(y_t | a, y_<t) per real token, 0 on pads: (B, T)."""
    B, T, V = logits.shape
    # Rows of V contiguous logits: log-softmax over the transposed (B, V, T) layout runs ~2× slower.
    nll = F.cross_entropy(logits.float().reshape(B * T, V), targets.reshape(B * T), reduction="none")  # fp32
    return nll.view(B, T) * mask


class MovingBaseline:
    """b_k = decay · b_{k−1} + (1 − decay) · r_k; starts at the first reward.

    ``caption_loss`` feeds it the batch's log p(y | s̃, a) per token, so one average serves buckets
    of every caption length (as in the authors' code).
    """

    def __init__(self, decay: float = 0.9, value: float | None = None) -> None:
        self.decay = decay
        self.value = value

    def update(self, rewards: torch.Tensor) -> float:
        r = float(rewards.mean())
        self.value = r if self.value is None else self.decay * self.value + (1 - self.decay) * r
        return self.value


def reinforce_advantage(
    nll_tok: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, baseline: MovingBaseline | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per caption log p(y | s̃, a) − |y|·b, with b a per-token baseline: (advantage (B,), per-token reward).

    A caption's reward is a sum over its tokens, so one baseline of whole-caption rewards shared by
    buckets of different lengths would leave an advantage of about (mean length − |y|) × NLL per
    token. Subtracting |y|·b, with b the average log-probability per token, keeps the advantage
    centred at every length; |y|·b does not depend on s̃, so the estimator stays unbiased.
    ``rows`` (B,) bool are the captions that sampled locations (the baseline's own statistic).
    """
    reward = -nll_tok.sum(1).detach()  # (B,) log p(y | s̃, a)
    lengths = mask.sum(1)  # (B,)
    per_token = reward[rows].sum() / lengths[rows].sum().clamp_min(1)  # this batch's log p per token
    b = per_token if baseline is None or baseline.value is None else baseline.value
    return reward - lengths * b, per_token


@dataclass
class LossParts:
    """The loss and its terms, each per caption word as the loss adds them: total = nll + λ·dsa (soft);
    nll + reinforce − λ_e·entropy (hard; reinforce already weighted by λ_r)."""

    total: torch.Tensor
    nll: float  # −log p per word
    dsa: float  # the doubly stochastic penalty Σ_i (1 − Σ_t α_ti)² of the batch per word
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
    hard: −log p(y|s̃,a) − λ_r (log p(y|s̃,a) − |y|·b) log p(s̃|a) − λ_e H[s̃], the last two terms for
    the examples that sampled locations (the others were trained with the expectation α); b is the
    moving average of log p per token (``reinforce_advantage``).
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
        advantage, per_token = reinforce_advantage(nll_tok, mask, rows, baseline)  # (B,)
        if not hard.baseline:
            advantage = -nll_tok.sum(1).detach()  # the bare reward log p(y | s̃, a)
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
            baseline.update(per_token)
    return LossParts(loss, float(nll_tok.detach().sum() / tokens), float(dsa.detach().sum() / tokens), rf_value,
                     ent_value, int(tokens))
