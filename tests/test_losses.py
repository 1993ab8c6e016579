"""sat_core.training.losses: the doubly stochastic penalty, the moving baseline, REINFORCE and entropy terms."""

from __future__ import annotations

import math

import pytest
import torch

from sat_core.evaluation.alpha import doubly_stochastic
from sat_core.config import HardAttentionConfig
from sat_core.training.losses import MovingBaseline, caption_loss, reinforce_advantage


def test_doubly_stochastic_matches_hand_computation_and_ignores_pads():
    alphas = torch.tensor([[[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]]])  # (1, T=3, L=2)
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third step is padding
    # coverage = [1.5, 0.5] -> (1-1.5)^2 + (1-0.5)^2 = 0.5
    assert doubly_stochastic(alphas, mask).item() == pytest.approx(0.5)
    full = torch.ones(1, 3)
    # coverage = [1.5, 1.5] -> 0.25 + 0.25
    assert doubly_stochastic(alphas, full).item() == pytest.approx(0.5)
    mask = torch.tensor([[1.0, 0.0, 0.0]])
    assert doubly_stochastic(alphas, mask).item() == pytest.approx(0.25 + 0.25)


def test_moving_baseline_follows_the_paper():
    b = MovingBaseline(0.9)
    assert b.update(torch.tensor([-2.0, -4.0])) == pytest.approx(-3.0)  # starts at the first reward
    assert b.update(torch.tensor([-1.0])) == pytest.approx(0.9 * -3.0 + 0.1 * -1.0)


class _Out:
    def __init__(self, logits, alphas, log_p_loc, sampled):
        self.logits, self.alphas, self.log_p_loc, self.sampled = logits, alphas, log_p_loc, sampled


def test_reinforce_raises_log_prob_of_locations_that_beat_the_baseline():
    """Toy problem: two examples sample locations; the one with the higher reward gets reinforced."""
    targets = torch.tensor([[4, 2], [4, 2]])
    logits = torch.zeros(2, 2, 6)
    logits[0, :, 4] = logits[0, :, 2] = 5.0  # example 0 predicts its words well: high reward
    theta = torch.zeros(2, requires_grad=True)
    log_p_loc = theta.view(2, 1).expand(2, 2) - 1.0  # log p(s̃|a) as a function of θ
    out = _Out(logits, torch.full((2, 2, 3), 1 / 3), log_p_loc, torch.tensor([True, True]))
    hard = HardAttentionConfig(entropy_weight=0.0)
    parts = caption_loss(out, targets, dsa_lambda=0.0, hard=hard, baseline=MovingBaseline(0.9))
    parts.total.backward()
    # Minimising the loss must raise log p(s̃) where reward > baseline and lower it elsewhere.
    assert theta.grad[0] < 0 < theta.grad[1]


def test_baseline_is_updated_by_the_loss_with_sampled_examples_only():
    targets = torch.tensor([[4, 2], [5, 2]])
    logits = torch.randn(2, 2, 6)
    out = _Out(logits, torch.full((2, 2, 3), 1 / 3), torch.zeros(2, 2), torch.tensor([True, False]))
    base = MovingBaseline(0.9, value=-1.0)
    caption_loss(out, targets, dsa_lambda=0.0, hard=HardAttentionConfig(), baseline=base)
    reward0 = torch.log_softmax(logits[0], -1)[[0, 1], [4, 2]].sum().item()
    assert base.value == pytest.approx(0.9 * -1.0 + 0.1 * reward0 / 2, rel=1e-5)  # per token: 2 tokens


def test_reinforce_advantage_does_not_depend_on_the_bucket_length():
    """Toy problem: every token costs the same NLL (log 6), buckets of 3 and 12 words alternate.

    No location helps or hurts, so the advantage should be zero at every length. A baseline of
    whole-caption rewards settles between the two lengths' rewards and gives short captions a large
    positive and long ones a large negative advantage; the per-token baseline leaves both at zero.
    """
    base, old = MovingBaseline(0.9), MovingBaseline(0.9)
    sampled = torch.ones(4, dtype=torch.bool)
    for k in range(60):
        length = 3 if k % 2 else 12
        targets = torch.full((4, length), 5)
        log_p_loc = torch.full((4, length), -1.0)
        out = _Out(torch.zeros(4, length, 6), torch.full((4, length, 3), 1 / 3), log_p_loc, sampled)
        nll_tok = torch.full((4, length), math.log(6))
        advantage, _ = reinforce_advantage(nll_tok, torch.ones(4, length), sampled, base)
        parts = caption_loss(out, targets, dsa_lambda=0.0, hard=HardAttentionConfig(entropy_weight=0.0),
                             baseline=base)
        reward = -nll_tok.sum(1)
        old_advantage = reward - (reward.mean() if old.value is None else old.value)
        old.update(reward)
        if k >= 40:
            assert torch.allclose(advantage, torch.zeros(4), atol=1e-4), (length, advantage)
            assert parts.reinforce == pytest.approx(0.0, abs=1e-4)
            assert float(old_advantage.abs().min()) > 5  # ≈ (7.5 − |y|) × log 6: all length, no signal


def test_switching_off_reinforce_and_entropy_leaves_plain_likelihood():
    targets = torch.tensor([[4, 2]])
    logits = torch.randn(1, 2, 6)
    out = _Out(logits, torch.full((1, 2, 3), 1 / 3), torch.full((1, 2), -1.0), torch.tensor([True]))
    off = HardAttentionConfig(reinforce=False, entropy_weight=0.0)
    parts = caption_loss(out, targets, dsa_lambda=0.0, hard=off)
    nll = torch.nn.functional.cross_entropy(logits[0], targets[0])
    assert parts.total.item() == pytest.approx(nll.item(), rel=1e-6)


def test_soft_loss_adds_the_penalty_per_token_like_the_likelihood():
    targets = torch.tensor([[4, 2, 0]])  # two real tokens, one pad
    logits = torch.randn(1, 3, 6)
    alphas = torch.softmax(torch.randn(1, 3, 4), -1)
    out = _Out(logits, alphas, torch.zeros(1, 3), torch.tensor([False]))
    parts = caption_loss(out, targets, dsa_lambda=0.5)
    nll = torch.nn.functional.cross_entropy(logits[0, :2], targets[0, :2], reduction="sum")
    dsa = ((1 - alphas[0, :2].sum(0)) ** 2).sum()
    assert parts.total.item() == pytest.approx(((nll + 0.5 * dsa) / 2).item(), rel=1e-5)
    # the logged terms are in the loss's own unit (per word), so they add up to it
    assert parts.dsa == pytest.approx(dsa.item() / 2, rel=1e-5)
    assert parts.total.item() == pytest.approx(parts.nll + 0.5 * parts.dsa, rel=1e-5)


def test_hard_terms_add_up_to_the_loss_per_word():
    targets = torch.tensor([[4, 2, 0], [3, 2, 1]])
    out = _Out(torch.randn(2, 3, 6), torch.softmax(torch.randn(2, 3, 4), -1), -torch.rand(2, 3),
               torch.tensor([True, True]))
    hard = HardAttentionConfig(entropy_weight=0.01)
    parts = caption_loss(out, targets, dsa_lambda=0.0, hard=hard, baseline=MovingBaseline(0.9, value=-1.0))
    assert parts.total.item() == pytest.approx(parts.nll + parts.reinforce - 0.01 * parts.entropy, rel=1e-5)
