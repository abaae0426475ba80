import math

import pytest
import torch

from lmpo.algos import mismatch_kl, tis_clipped, truncated_importance_weights


def test_equal_logprobs_give_weights_of_exactly_one_and_zero_kl():
    lp = torch.tensor([[-0.3, -2.0, -7.5], [-1.0, -0.01, -4.0]])
    mask = torch.ones_like(lp)
    weights = truncated_importance_weights(lp, lp.clone(), mask)
    assert torch.equal(weights, torch.ones_like(lp))
    kl = mismatch_kl(lp, lp.clone(), mask)
    assert kl.k3.item() == 0.0 and kl.k1.item() == 0.0


def test_hand_values_and_the_cap():
    trainer = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.3)]])
    sampler = torch.tensor([[math.log(0.25), math.log(0.3), math.log(0.6)]])
    mask = torch.ones_like(trainer)
    # ratios 2.0, 3.0 (capped to 2.0), 0.5
    weights = truncated_importance_weights(trainer, sampler, mask, cap=2.0)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 2.0, 0.5]]))
    torch.testing.assert_close(truncated_importance_weights(trainer, sampler, mask, cap=10.0),
                               torch.tensor([[2.0, 3.0, 0.5]]))
    # only the ratio of 3 exceeds the cap (a ratio of exactly 2 does not)
    clipped = tis_clipped(trainer, sampler, mask, cap=2.0)
    assert clipped.tolist() == [[0.0, 1.0, 0.0]]


def test_mismatch_kl_hand_values():
    trainer = torch.tensor([[math.log(0.5), math.log(0.2)]])
    sampler = torch.tensor([[math.log(0.25), math.log(0.4)]])
    mask = torch.ones_like(trainer)
    # r = [2, 0.5]: k3 = r - 1 - log r, k1 = -log r
    kl = mismatch_kl(trainer, sampler, mask)
    expected_k3 = ((2 - 1 - math.log(2)) + (0.5 - 1 - math.log(0.5))) / 2
    assert kl.k3.item() == pytest.approx(expected_k3, rel=1e-6)
    assert kl.k1.item() == pytest.approx((-math.log(2) - math.log(0.5)) / 2, abs=1e-7)  # = 0


def test_masked_tokens_are_ignored_even_when_garbage():
    trainer = torch.tensor([[math.log(0.5), float("nan"), -math.inf]])
    sampler = torch.tensor([[math.log(0.25), 0.0, float("nan")]])
    mask = torch.tensor([[1.0, 0.0, 0.0]])
    weights = truncated_importance_weights(trainer, sampler, mask, cap=4.0)
    assert weights[0].tolist() == pytest.approx([2.0, 0.0, 0.0])
    kl = mismatch_kl(trainer, sampler, mask)
    assert kl.k3.item() == pytest.approx(2 - 1 - math.log(2), rel=1e-6)
    assert kl.k1.item() == pytest.approx(-math.log(2), rel=1e-6)
    assert tis_clipped(trainer, sampler, mask, cap=1.5).tolist() == [[1.0, 0.0, 0.0]]


def test_empty_mask_and_detached_weights():
    trainer = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    sampler = torch.tensor([[-1.5, -2.0]])
    weights = truncated_importance_weights(trainer, sampler, torch.ones(1, 2))
    assert not weights.requires_grad
    kl = mismatch_kl(trainer, sampler, torch.zeros(1, 2))
    assert kl.k3.item() == 0.0 and kl.k1.item() == 0.0


def test_extreme_ratios_stay_finite():
    trainer = torch.tensor([[0.0, -500.0]])
    sampler = torch.tensor([[-500.0, 0.0]])
    mask = torch.ones_like(trainer)
    weights = truncated_importance_weights(trainer, sampler, mask, cap=2.0)
    assert weights[0, 0].item() == 2.0 and weights[0, 1].item() == 0.0
    kl = mismatch_kl(trainer, sampler, mask)
    assert math.isfinite(kl.k3.item()) and kl.k3.item() >= 0


def test_bad_arguments():
    lp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="cap"):
        truncated_importance_weights(lp, lp, torch.ones(1, 2), cap=0.0)
    with pytest.raises(ValueError, match="shapes"):
        mismatch_kl(lp, torch.zeros(1, 3), torch.ones(1, 2))
