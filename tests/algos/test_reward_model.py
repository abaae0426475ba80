import math

import pytest
import torch

from lmpo.algos import bradley_terry_loss, gather_last, last_token_index


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


def reference(rw, rl, m, c):
    """Plain-Python float64 reference for one pair."""
    x = rw - rl - m
    nll = math.log1p(math.exp(-x)) if x >= 0 else -x + math.log1p(math.exp(x))
    return nll + c * (rw + rl) ** 2


def test_bradley_terry_hand_values():
    chosen, rejected = t(1.0, 0.0, -1.0), t(-0.5, 0.0, 1.0)
    loss, figs = bradley_terry_loss(chosen, rejected)
    # differences 1.5, 0, -2: log(1 + e^-1.5) = 0.2014133, log 2 = 0.6931472,
    # log(1 + e^2) = 2.1269280
    torch.testing.assert_close(loss, t(0.2014133, 0.6931472, 2.1269280), atol=1e-7, rtol=0)
    torch.testing.assert_close(figs["margin"], t(1.5, 0.0, -2.0))
    assert figs["accuracy"].tolist() == [1.0, 0.0, 0.0]  # a tie is not a correct ranking


def test_bradley_terry_margin_and_centering():
    chosen, rejected = t(1.0), t(-0.5)
    # m = 0.5: -log sigma(1.5 - 0.5) = log(1 + e^-1) = 0.3132617
    loss, figs = bradley_terry_loss(chosen, rejected, margin=0.5)
    assert loss.item() == pytest.approx(0.3132617, abs=1e-7)
    assert figs["margin"].item() == pytest.approx(1.5)  # the figure is r_w - r_l, without m
    # + c*(r_w + r_l)^2 = 0.01 * 0.5^2 = 0.0025 -> 0.3157617
    loss, _ = bradley_terry_loss(chosen, rejected, margin=0.5, center_coef=0.01)
    assert loss.item() == pytest.approx(0.3157617, abs=1e-7)
    # per-pair margins: m = (0.5, 3.5) -> log(1 + e^-1) = 0.3132617, log(1 + e^2) = 2.1269280
    loss, _ = bradley_terry_loss(t(1.0, 1.0), t(-0.5, -0.5), margin=t(0.5, 3.5))
    torch.testing.assert_close(loss, t(0.3132617, 2.1269280), atol=1e-7, rtol=0)


def test_bradley_terry_against_reference():
    gen = torch.Generator().manual_seed(0)
    chosen, rejected, m = (3 * torch.randn(32, generator=gen, dtype=torch.float64) for _ in range(3))
    m = m.abs()
    loss, figs = bradley_terry_loss(chosen, rejected, margin=m, center_coef=0.05)
    rows = zip(chosen.tolist(), rejected.tolist(), m.tolist())
    expected = t(*(reference(a, b, mi, 0.05) for a, b, mi in rows))
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    assert figs["accuracy"].tolist() == [float(a > b) for a, b in zip(chosen, rejected)]
    assert 0 < figs["accuracy"].sum() < 32


def test_bradley_terry_gradients():
    chosen = t(0.3, -2.0, 5.0).requires_grad_(True)
    rejected = t(0.1, 1.0, -5.0).requires_grad_(True)
    margin = t(0.2, 0.2, 0.2).requires_grad_(True)
    loss, figs = bradley_terry_loss(chosen, rejected, margin=margin)
    loss.sum().backward()
    assert (chosen.grad < 0).all() and (rejected.grad > 0).all()
    assert margin.grad is None  # the margin is data, not a parameter
    assert not any(f.requires_grad for f in figs.values())
    # centering pushes the pair's mean toward 0: both scores high -> both gradients up
    chosen, rejected = t(10.0).requires_grad_(True), t(9.0).requires_grad_(True)
    loss, _ = bradley_terry_loss(chosen, rejected, center_coef=0.1)
    loss.backward()
    assert rejected.grad.item() > 0 and chosen.grad.item() > 0


def test_bradley_terry_extreme_values_are_finite():
    loss, _ = bradley_terry_loss(t(1e4, -1e4), t(0.0, 0.0))
    torch.testing.assert_close(loss, t(0.0, 1e4))


def test_bradley_terry_bad_arguments():
    with pytest.raises(ValueError, match="center_coef"):
        bradley_terry_loss(t(1.0), t(0.0), center_coef=-0.1)
    with pytest.raises(ValueError, match="shape"):
        bradley_terry_loss(t(1.0, 2.0), t(0.0))
    with pytest.raises(ValueError, match="margin shape"):
        bradley_terry_loss(t(1.0, 2.0), t(0.0, 0.0), margin=t(1.0, 2.0, 3.0))
    with pytest.raises(ValueError, match="1-D"):
        bradley_terry_loss(t(1.0, 2.0)[None], t(0.0, 0.0)[None])


def _mask(rows):
    return torch.tensor(rows)


@pytest.mark.parametrize(
    "rows, expected",
    [
        ([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]], [2, 0, 3]),  # right padding
        ([[0, 0, 1, 1, 1], [0, 0, 0, 0, 1], [0, 1, 1, 1, 1]], [4, 4, 4]),  # left padding
        ([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1]], [4, 4]),  # no padding
        ([[0, 0, 0, 0, 0], [1, 1, 0, 0, 0]], [0, 1]),  # a row of all padding -> index 0
        ([[0, 0, 0, 0, 0]], [0]),
    ],
)
def test_last_token_index(rows, expected):
    for mask in (_mask(rows), _mask(rows).bool(), _mask(rows).float()):
        index = last_token_index(mask)
        assert index.dtype == torch.int64
        assert index.tolist() == expected


def test_last_token_index_matches_lengths_on_random_masks():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 9, (20,), generator=gen)
    pos = torch.arange(8)
    right = (pos < lengths[:, None]).long()
    left = (pos >= 8 - lengths[:, None]).long()
    assert torch.equal(last_token_index(right), lengths - 1)
    assert torch.equal(last_token_index(left), torch.full((20,), 7))


def test_gather_last():
    values = torch.arange(15, dtype=torch.float32).reshape(3, 5)
    mask = _mask([[1, 1, 0, 0, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]])
    # rows 0..2 read positions 1, 4 and 0: values 1, 9, 10
    assert gather_last(values, mask).tolist() == [1.0, 9.0, 10.0]
    scores = torch.randn(3, 5, requires_grad=True)
    gather_last(scores, mask).sum().backward()
    expected_grad = torch.zeros(3, 5)
    expected_grad[0, 1] = expected_grad[1, 4] = expected_grad[2, 0] = 1.0
    assert torch.equal(scores.grad, expected_grad)


def test_last_token_bad_arguments():
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        last_token_index(torch.ones(5))
    with pytest.raises(ValueError, match="T = 0"):
        last_token_index(torch.ones(2, 0))
    with pytest.raises(ValueError, match="shape"):
        gather_last(torch.zeros(2, 4), torch.ones(2, 5))
