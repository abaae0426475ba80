"""Advantages -> policy loss (+ beta * KL) -> aggregation -> backward, across every registered method."""

import pytest
import torch

from lmpo.algos import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES

T = 5


def _step(rewards, group_ids, estimator, loss_name, aggregation, beta=0.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = len(rewards)
    old = -torch.rand(n, T, generator=gen) - 0.2
    logprobs = (old + 0.3 * torch.randn(n, T, generator=gen)).requires_grad_(True)
    ref = old + 0.1 * torch.randn(n, T, generator=gen)
    mask = (torch.rand(n, T, generator=gen) > 0.25).float()
    mask[:, 0] = 1.0
    adv = ADVANTAGES.get(estimator)(rewards, group_ids)[:, None].expand(n, T)
    loss, _ = POLICY_LOSSES.get(loss_name)(logprobs, old, adv, mask)
    if beta:
        loss = loss + beta * KL_ESTIMATORS.get("k3")(logprobs, ref)
    total = AGGREGATIONS.get(aggregation)(loss, mask, max_len=T)
    (grad,) = torch.autograd.grad(total, logprobs)
    return grad, mask


EQUAL_REWARDS = torch.tensor([0.7, 0.7, 0.7, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
EQUAL_IDS = torch.tensor([4, 4, 4, 9, 9, 2, 2, 2, 2])


@pytest.mark.parametrize("estimator", ADVANTAGES.names())
@pytest.mark.parametrize("loss_name", POLICY_LOSSES.names())
@pytest.mark.parametrize("aggregation", AGGREGATIONS.names())
def test_equal_rewards_and_zero_beta_give_exactly_zero_gradient(estimator, loss_name, aggregation):
    grad, _ = _step(EQUAL_REWARDS, EQUAL_IDS, estimator, loss_name, aggregation)
    assert (grad == 0).all()


@pytest.mark.parametrize("loss_name", POLICY_LOSSES.names())
def test_contrast_signal_or_kl_gives_nonzero_gradient(loss_name):
    mixed = EQUAL_REWARDS.clone()
    mixed[0] = 0.0
    grad, _ = _step(mixed, EQUAL_IDS, "grpo", loss_name, "token_mean", seed=1)
    assert grad[EQUAL_IDS == 4].abs().sum() > 0
    grad, mask = _step(EQUAL_REWARDS, EQUAL_IDS, "grpo", loss_name, "token_mean", beta=0.04)
    assert (grad[mask == 1] != 0).all() and (grad[mask == 0] == 0).all()
