"""sat_core.evaluation.alpha: one definition of each α statistic, the same for torch tensors and numpy arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sat_core.evaluation.alpha import alpha_summary, doubly_stochastic, entropy


def test_alpha_summary_and_penalty():
    alpha = np.zeros((2, 3))
    alpha[1, 2], alpha[0, 0] = 0.75, 0.25
    s = alpha_summary(alpha)
    assert s.max == 0.75 and s.argmax == (1, 2) and s.total == pytest.approx(1.0)
    expected_h = -(0.75 * np.log(0.75) + 0.25 * np.log(0.25))
    assert s.entropy == pytest.approx(expected_h) and s.effective_regions == pytest.approx(np.exp(expected_h))
    uniform = np.full((4, 6), 1 / 6)  # 4 steps over 6 regions: every region gets 4/6
    assert doubly_stochastic(uniform) == pytest.approx(6 * (1 - 4 / 6) ** 2)


def test_numpy_and_torch_give_the_same_statistics():
    rng = np.random.default_rng(0)
    alphas = rng.dirichlet(np.ones(9), size=(3, 5))  # (B, T, L)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=float)  # (B, T)
    h_np, h_t = entropy(alphas), entropy(torch.tensor(alphas))
    assert isinstance(h_np, np.ndarray) and h_np.shape == (3, 5)
    np.testing.assert_allclose(h_np, h_t.numpy(), rtol=1e-12)
    expected = -(alphas * np.log(alphas)).sum(-1)
    np.testing.assert_allclose(h_np, expected, rtol=1e-12)
    dsa = doubly_stochastic(alphas, mask)
    np.testing.assert_allclose(dsa, doubly_stochastic(torch.tensor(alphas), torch.tensor(mask)).numpy())
    by_hand = ((1 - (alphas * mask[..., None]).sum(1)) ** 2).sum(-1)
    np.testing.assert_allclose(dsa, by_hand)
    assert entropy(np.full(16, 1 / 16)) == pytest.approx(np.log(16))
