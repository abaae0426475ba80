import math

import pytest
import torch

from lmpo.algos import AGGREGATIONS, masked_mean, seq_mean_token_mean, seq_mean_token_sum_norm, token_mean

MODES = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
MAX_LEN = 7


def reference(loss, mask, mode, max_len=MAX_LEN):
    """Plain-Python float64 reference; fully masked rows are not counted as sequences."""
    rows = [[l for l, m in zip(lr, mr) if m] for lr, mr in zip(loss.tolist(), mask.tolist())]
    rows = [r for r in rows if r]
    if mode == "token_mean":
        return sum(map(sum, rows)) / sum(map(len, rows))
    if mode == "seq_mean_token_mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    return sum(map(sum, rows)) / (len(rows) * max_len)


def _batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    loss = torch.randn(6, MAX_LEN, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([7, 3, 0, 5, 1, 6])
    starts = torch.tensor([0, 2, 0, 1, 4, 0])
    pos = torch.arange(MAX_LEN)
    mask = ((pos >= starts[:, None]) & (pos < (starts + lengths)[:, None])).double()
    return loss, mask


@pytest.mark.parametrize("mode", MODES)
def test_against_reference(mode):
    loss, mask = _batch()
    loss[mask == 0] = math.nan  # masked garbage must not leak in
    out = AGGREGATIONS.get(mode)(loss, mask, max_len=MAX_LEN)
    assert out.dim() == 0
    assert out.item() == pytest.approx(reference(loss, mask, mode), rel=1e-12)


def test_hand_values():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert token_mean(loss, mask).item() == pytest.approx(10 / 4)
    assert seq_mean_token_mean(loss, mask).item() == pytest.approx((2 + 4) / 2)
    assert seq_mean_token_sum_norm(loss, mask, max_len=5).item() == pytest.approx(10 / (2 * 5))
    # the fully masked row counts when the caller says there are 3 sequences
    assert seq_mean_token_mean(loss, mask, num_sequences=3).item() == pytest.approx(6 / 3)
    assert token_mean(loss, mask, num_tokens=8).item() == pytest.approx(10 / 8)


@pytest.mark.parametrize("mode", MODES)
def test_fully_masked_batch_gives_zero_with_grad(mode):
    loss = torch.full((2, 3), math.inf, requires_grad=True)
    out = AGGREGATIONS.get(mode)(loss, torch.zeros(2, 3), max_len=3)
    assert out.item() == 0.0
    out.backward()
    assert (loss.grad == 0).all()


def test_sum_norm_requires_max_len():
    loss, mask = _batch()
    with pytest.raises(ValueError, match="max_len"):
        seq_mean_token_sum_norm(loss, mask)
    with pytest.raises(ValueError):
        seq_mean_token_sum_norm(loss, mask, max_len=0)
    with pytest.raises(ValueError, match="shape"):
        token_mean(loss, mask[:, :3])


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_with_global_counts_match_whole_batch(mode):
    loss, mask = _batch(1)
    weights = torch.randn_like(loss).requires_grad_(True)
    fn = AGGREGATIONS.get(mode)

    (whole_grad,) = torch.autograd.grad(fn(loss * weights, mask, max_len=MAX_LEN), weights)
    whole = fn(loss * weights, mask, max_len=MAX_LEN).detach()

    counts = {"num_sequences": int(mask.any(-1).sum()), "num_tokens": float(mask.sum()), "max_len": MAX_LEN}
    total, naive = 0.0, 0.0
    for rows in (slice(0, 2), slice(2, 5), slice(5, 6)):
        part = fn(loss[rows] * weights[rows], mask[rows], **counts)
        part.backward()
        total = total + part.detach()
        naive = naive + fn(loss[rows], mask[rows], max_len=MAX_LEN).detach() / 3
    torch.testing.assert_close(total, whole)
    torch.testing.assert_close(weights.grad, whole_grad)
    # without the global counts, the split changes the result (so the check above is not vacuous)
    assert not torch.isclose(naive, whole)


def test_masked_mean():
    x = torch.tensor([[1.0, 2.0, math.nan], [4.0, math.inf, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert masked_mean(x, mask).item() == pytest.approx(13 / 4)
    torch.testing.assert_close(masked_mean(x, mask, dim=-1), torch.tensor([1.5, 5.0]))
    torch.testing.assert_close(masked_mean(x, mask, dim=0), torch.tensor([2.5, 2.0, 6.0]))
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0
    torch.testing.assert_close(masked_mean(x, torch.tensor([[1, 1, 0], [0, 0, 0]]), dim=1), torch.tensor([1.5, 0.0]))


def test_registry_names():
    assert AGGREGATIONS.names() == sorted(MODES)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("count", ["num_tokens", "num_sequences"])
def test_impossible_global_counts_are_refused(mode, count):
    # a count <= 0 with loss tokens in the mask used to become 1: the loss was silently the sum
    loss, mask = torch.ones(2, 3), torch.ones(2, 3)
    fn = AGGREGATIONS.get(mode)
    uses = {"token_mean": "num_tokens"}.get(mode, "num_sequences")
    for bad in (0, -5):
        if count == uses:
            with pytest.raises(ValueError, match=rf"{count} must be > 0 .* got {bad} with 6 loss tokens"):
                fn(loss, mask, max_len=3, **{count: bad})
    # an empty mask with a zero count is the documented "zero denominator yields 0"
    assert fn(loss, torch.zeros(2, 3), max_len=3, **{count: 0}).item() == 0.0
