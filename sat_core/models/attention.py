"""f_att and the two ways of turning α into a context vector ẑ_t (PAPER.md: soft and hard attention).

Soft and hard attention share one signature: ``attend(feats, alpha, mode, generator)`` returns the
context, the sampled location (−1 when none was sampled) and log p(s_t | a) for the REINFORCE term.
"""

from __future__ import annotations

import torch
from torch import nn


class AttentionMLP(nn.Module):
    """e_ti = w^T tanh(W_a a_i + W_h h_{t−1} + b);  α_t = softmax(e_t).

    ``activation="relu"`` replaces tanh, as sgrvinod's tutorial does (for converted checkpoints).
    """

    def __init__(self, feature_dim: int, hidden_dim: int, attn_dim: int, activation: str = "tanh") -> None:
        super().__init__()
        self.act = torch.relu if activation == "relu" else torch.tanh
        self.W_a = nn.Linear(feature_dim, attn_dim)  # carries the bias b
        self.W_h = nn.Linear(hidden_dim, attn_dim, bias=False)
        self.w = nn.Linear(attn_dim, 1)

    def project(self, feats: torch.Tensor) -> torch.Tensor:
        """W_a a_i + b: independent of t, so computed once per image."""
        return self.W_a(feats)  # (N, L, A)

    def forward(self, proj: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """α for N = B·k rows of hidden state over B images' projections (B, L, A).

        The k rows of one image (its beams) are adjacent and share the image's projection, so beam
        search never copies the annotations k times.
        """
        B, L, A = proj.shape
        k = h.shape[0] // B
        wh = self.W_h(h).view(B, k, 1, A)  # (B, k, 1, A)
        e = self.w(self.act(proj.unsqueeze(1) + wh)).view(B * k, L)  # (N, L)
        return torch.softmax(e, dim=1)  # (N, L)


def attend(
    feats: torch.Tensor,
    alpha: torch.Tensor,
    *,
    sample: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Context vectors from α (N, L) over B images' annotations feats (B, L, D), N = B·k.

    ``sample`` is a bool mask (N,) of rows that draw a hard location s_t ~ Multinoulli(α); the other
    rows take the expectation Σ_i α_i a_i (soft attention, or hard attention decoded by expectation).
    Returns (context (N, D), location (N,) with −1 where not sampled, log α_{s_t} (N,) with 0 there).
    """
    B, L, D = feats.shape
    n = alpha.shape[0]
    k = n // B  # rows per image: beams share their image's annotations
    context = torch.bmm(alpha.view(B, k, L), feats).view(n, D)  # (N, D)
    location = torch.full((n,), -1, dtype=torch.long, device=alpha.device)
    log_p = alpha.new_zeros(n)
    if sample is not None and bool(sample.any()):
        rows = sample.nonzero().squeeze(1)  # (S,)
        probs = alpha[rows].detach().float().clamp_min(0)
        if generator is not None and generator.device != probs.device:
            probs = probs.to(generator.device)
        loc = torch.multinomial(probs, 1, generator=generator).squeeze(1).to(alpha.device)  # (S,)
        location[rows] = loc
        context = context.clone()
        context[rows] = feats[rows // k, loc]  # ẑ_t = a_{s_t}: one region, not a blend
        log_p = log_p.index_put((rows,), torch.log(alpha[rows, loc].clamp_min(1e-12)))
    return context, location, log_p
