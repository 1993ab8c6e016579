"""Statistics of attention maps α, defined once and used by the losses, evaluation and the explorer.

Each function takes torch tensors (differentiable, for training) or numpy arrays (returns numpy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

Array = TypeVar("Array", torch.Tensor, np.ndarray)


def _torch(x: torch.Tensor | np.ndarray) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x, dtype=np.float64))


def _like(result: torch.Tensor, x: torch.Tensor | np.ndarray):
    return result if isinstance(x, torch.Tensor) else result.numpy()


def entropy(alphas: Array) -> Array:
    """H[α] in nats over the last axis (the L regions): (…, L) -> (…)."""
    a = _torch(alphas)
    return _like(-(a * torch.log(a.clamp_min(1e-12))).sum(-1), alphas)


def doubly_stochastic(alphas: Array, mask: Array | None = None) -> Array:
    """The paper's penalty before λ: Σ_i (1 − Σ_t α_ti)² over real steps; (…, T, L) -> (…).

    ``mask`` (…, T) marks real (non-pad) steps; without it every step counts.
    """
    a = _torch(alphas)
    if mask is not None:
        a = a * _torch(mask).to(a.dtype).unsqueeze(-1)
    coverage = a.sum(-2)  # (…, L)
    return _like(((1.0 - coverage) ** 2).sum(-1), alphas)


@dataclass
class AlphaSummary:
    max: float
    argmax: tuple[int, int]  # (row, col) of the grid
    entropy: float  # nats
    effective_regions: float  # exp(entropy): how many cells the attention is spread over
    total: float  # Σ_i α_i (1 unless an intervention or a bug changed it)


def alpha_summary(alpha_grid: np.ndarray) -> AlphaSummary:
    """Peak, where it is, entropy and exp(entropy) of one α map (gh, gw)."""
    alpha = np.asarray(alpha_grid, dtype=np.float64)
    flat = alpha.reshape(-1)  # (L,)
    h = float(entropy(flat / flat.sum() if flat.sum() > 0 else flat))
    row, col = np.unravel_index(int(flat.argmax()), alpha.shape)
    return AlphaSummary(float(flat.max()), (int(row), int(col)), h, math.exp(h), float(flat.sum()))
