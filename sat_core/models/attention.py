"""f_att and the two ways of turning α into a context vector ẑ_t (PAPER.md: soft and hard attention).

    e_ti = f_att(a_i, h_{t−1}) = w^T tanh(W_a a_i + W_h h_{t−1} + b)       (eq. 4)
    α_ti = exp(e_ti) / Σ_k exp(e_tk)                                       (eq. 5)

``AttentionMLP`` computes them as written, in plain PyTorch, with ``backend="plain"``. The default
``backend="fast"`` (``attention_fast``) computes the same α with the σ trick, in cache-sized blocks and
sat_core.native's C loops; tests/test_model.py holds the two equal, values and gradients.

Soft and hard attention share one signature: ``attend(feats, alpha, sample=…, generator=…)`` returns the
context, the sampled location (−1 when none was sampled) and log p(s_t | a) for the REINFORCE term.
"""

from __future__ import annotations

import torch
from torch import nn

from sat_core.models import attention_fast

ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu}
BACKENDS = ("fast", "plain")


class AttentionMLP(nn.Module):
    """f_att: e_ti = w^T act(W_a a_i + W_h h_{t−1} + b), α_t = softmax(e_t).

    ``activation="relu"`` replaces tanh, as sgrvinod's tutorial does (for converted checkpoints).
    ``backend`` picks how the same numbers are computed (see the module's docstring); it may be changed on
    a built model, between decodes: a projection from ``project`` is read by the backend that made it.
    """

    def __init__(self, feature_dim: int, hidden_dim: int, attn_dim: int, activation: str = "tanh",
                 backend: str = "fast") -> None:
        super().__init__()
        if activation not in ACTIVATIONS or backend not in BACKENDS:
            raise ValueError(f"activation must be one of {list(ACTIVATIONS)} and backend one of {BACKENDS}")
        self.activation, self.backend = activation, backend
        self.W_a = nn.Linear(feature_dim, attn_dim)  # carries the bias b
        self.W_h = nn.Linear(hidden_dim, attn_dim, bias=False)
        self.w = nn.Linear(attn_dim, 1)

    def project(self, feats: torch.Tensor) -> torch.Tensor:
        """W_a a_i + b for every region (B, L, A) in fp32: independent of t, so computed once per image."""
        if self.backend == "fast":
            return attention_fast.project(self, feats)
        return self.W_a(feats).float()

    def forward(self, proj: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """α_t (N, L) fp32 for N = B·k rows of h_{t−1} over B images' projections (B, L, A) from ``project``.

        The k rows of one image (its beams) are adjacent and share the image's projection, so beam
        search never copies the annotations k times.
        """
        if self.backend == "fast":
            return attention_fast.alpha(self, proj, h)
        B, L, A = proj.shape
        k = h.shape[0] // B
        x = proj.unsqueeze(1) + self.W_h(h).float().view(B, k, 1, A)  # W_a a_i + b + W_h h_{t−1}: (B, k, L, A)
        e = self.w(ACTIVATIONS[self.activation](x)).squeeze(-1)  # eq. 4: e_ti (B, k, L)
        return torch.softmax(e.view(B * k, L).float(), dim=1)  # eq. 5: α_t (N, L)


def attend(
    feats: torch.Tensor,
    alpha: torch.Tensor,
    *,
    sample: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    backend: str = "fast",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Context vectors from α (N, L) over B images' annotations feats (B, L, D), N = B·k.

    ``sample`` is a bool mask (N,) of rows that draw a hard location s_t ~ Multinoulli(α); the other
    rows take the expectation Σ_i α_i a_i (soft attention, or hard attention decoded by expectation).
    Returns (context (N, D), location (N,) with −1 where not sampled, log α_{s_t} (N,) with 0 there).
    """
    B, L, D = feats.shape
    n = alpha.shape[0]
    k = n // B  # rows per image: beams share their image's annotations
    # feats are already in the compute dtype (cast once per image in ``Decoder.prepare``).
    fused = attention_fast.context(alpha.view(B, k, L), feats) if backend == "fast" else None
    if fused is not None:
        context = fused.view(n, D)  # (N, D) in one read of each image, in the dtype bmm gives under autocast
    else:
        context = torch.bmm(alpha.view(B, k, L).to(feats.dtype), feats).view(n, D)  # Σ_i α_ti a_i: (N, D)
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
        context[rows] = feats[rows // k, loc].to(context.dtype)  # ẑ_t = a_{s_t}: one region, not a blend
        log_p = log_p.index_put((rows,), torch.log(alpha[rows, loc].clamp_min(1e-12)))
    return context, location, log_p
