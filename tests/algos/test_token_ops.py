import math

import pytest
import torch
import torch.nn.functional as F

from lmpo.algos import entropy_from_logits, masked_cross_entropy, token_logprobs

V = 11


def _logits(*shape, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(*shape, V, generator=gen)).to(dtype)


def _targets(*shape, seed=0):
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed + 100))


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_token_logprobs_matches_log_softmax(temperature):
    logits, targets = _logits(2, 5), _targets(2, 5)
    expected = torch.log_softmax(logits.double() / temperature, -1).gather(-1, targets[..., None])[..., 0]
    out = token_logprobs(logits, targets, temperature=temperature)
    assert out.shape == (2, 5) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_token_logprobs_bf16_input_is_fp32_and_temperature_matters():
    logits, targets = _logits(3, 4, dtype=torch.bfloat16), _targets(3, 4)
    out = token_logprobs(logits, targets)
    assert out.dtype == torch.float32
    expected = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(out, expected)
    assert not torch.allclose(token_logprobs(logits, targets, temperature=0.5), out)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, targets, temperature=0.0)


def test_token_logprobs_gradient():
    logits = _logits(4).requires_grad_(True)
    targets = _targets(4)
    token_logprobs(logits, targets).sum().backward()
    expected = F.one_hot(targets, V).float() - torch.softmax(logits.detach(), -1)
    torch.testing.assert_close(logits.grad, expected)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_entropy_matches_reference(temperature):
    logits = _logits(2, 3)
    logp = torch.log_softmax(logits.double() / temperature, -1)
    expected = -(logp.exp() * logp).sum(-1)
    out = entropy_from_logits(logits, temperature=temperature)
    assert out.shape == (2, 3) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    assert entropy_from_logits(torch.zeros(V)).item() == pytest.approx(math.log(V))


def test_entropy_with_minus_inf_logits():
    logits = torch.tensor([[1.0, -math.inf, 0.5, -math.inf]], requires_grad=True)
    out = entropy_from_logits(logits)
    kept = torch.log_softmax(torch.tensor([1.0, 0.5], dtype=torch.float64), -1)
    assert out.item() == pytest.approx(-(kept.exp() * kept).sum().item(), rel=1e-6)
    out.sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert (logits.grad[0, [1, 3]] == 0).all()


def _sft_batch(seed=0):
    logits, targets = _logits(3, 6, seed=seed), _targets(3, 6, seed=seed)
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1]])
    return logits, targets, mask


def test_masked_cross_entropy_matches_torch():
    logits, targets, mask = _sft_batch()
    targets = torch.where(mask.bool(), targets, -100)  # masked targets need not be valid ids
    ours_logits = logits.clone().requires_grad_(True)
    ref_logits = logits.clone().requires_grad_(True)
    ours = masked_cross_entropy(ours_logits, targets, mask)
    ref = F.cross_entropy(ref_logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(ours, ref)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(ours_logits.grad, ref_logits.grad)


def test_masked_cross_entropy_all_ones_is_plain_cross_entropy():
    logits, targets, _ = _sft_batch(1)
    ref = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    torch.testing.assert_close(masked_cross_entropy(logits, targets, torch.ones(3, 6)), ref)


def test_masked_cross_entropy_empty_mask_is_zero_with_grad():
    logits = _logits(2, 3).requires_grad_(True)
    out = masked_cross_entropy(logits, torch.full((2, 3), -100), torch.zeros(2, 3))
    assert out.item() == 0.0 and out.requires_grad
    out.backward()
    assert (logits.grad == 0).all()


def test_masked_cross_entropy_micro_batches_with_global_count():
    logits, targets, mask = _sft_batch(2)
    whole = masked_cross_entropy(logits, targets, mask)
    n = float(mask.sum())
    parts = [masked_cross_entropy(logits[r], targets[r], mask[r], num_tokens=n) for r in (slice(0, 1), slice(1, 3))]
    torch.testing.assert_close(sum(parts), whole)
    naive = sum(masked_cross_entropy(logits[r], targets[r], mask[r]) for r in (slice(0, 1), slice(1, 3))) / 2
    assert not torch.isclose(naive, whole)


def test_masked_cross_entropy_shape_check():
    logits, targets, mask = _sft_batch()
    with pytest.raises(ValueError, match="shapes"):
        masked_cross_entropy(logits, targets[:, :4], mask)


@pytest.mark.parametrize("target_shape", [(1, 3), (2, 2), (3,)])
def test_token_logprobs_refuses_targets_not_matching_logits(target_shape):
    # targets [1, T] for logits [2, T, V] used to give a [2, T] result mixing rows (gather broadcasts)
    logits = torch.randn(2, 3, 5)
    with pytest.raises(ValueError, match=r"targets shape \(.*\) must be logits shape \(2, 3, 5\)"):
        token_logprobs(logits, torch.zeros(target_shape, dtype=torch.long))
