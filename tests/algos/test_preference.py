import math

import pytest
import torch

from lmpo.algos import PREFERENCE_LOSSES, cdpo, dpo, ipo, simpo

LOSSES = ["dpo", "cdpo", "ipo", "simpo"]


def log_sigmoid(x):
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def reference(name, pw, pl, rw, rl, lw, ll, beta, eps=0.1, gamma=0.5):
    """Plain-Python float64 reference for one pair: (loss, chosen_reward, rejected_reward)."""
    if name in ("dpo", "cdpo"):
        cr, rr = beta * (pw - rw), beta * (pl - rl)
        h = cr - rr
        e = eps if name == "cdpo" else 0.0
        return -(1 - e) * log_sigmoid(h) - e * log_sigmoid(-h), cr, rr
    if name == "ipo":
        cr, rr = beta * (pw / lw - rw / lw), beta * (pl / ll - rl / ll)
        return ((cr - rr) / beta - 1 / (2 * beta)) ** 2, cr, rr
    cr, rr = beta * pw / lw, beta * pl / ll
    return -log_sigmoid(cr - rr - gamma), cr, rr


def _random_batch(n=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    pw, pl, rw, rl = (-30 * torch.rand(n, generator=gen, dtype=torch.float64) for _ in range(4))
    lw, ll = (torch.randint(1, 40, (n,), generator=gen) for _ in range(2))
    return pw, pl, rw, rl, lw, ll


def _call(name, pw, pl, rw, rl, lw=None, ll=None, **options):
    fn = PREFERENCE_LOSSES.get(name)
    return fn(pw, pl, rw, rl, chosen_lengths=lw, rejected_lengths=ll, **options)


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


def test_registry():
    more = ["robust", "hinge", "exo_pair", "nca_pair", "bco_pair", "sppo_hard", "aot", "aot_pair", "apo_zero",
            "apo_down", "discopop", "sft"]  # tests/algos/test_preference_more.py
    assert PREFERENCE_LOSSES.names() == sorted(LOSSES + more)
    assert PREFERENCE_LOSSES.get("dpo") is dpo and PREFERENCE_LOSSES.get("simpo") is simpo
    with pytest.raises(ValueError, match="choose one of"):
        PREFERENCE_LOSSES.get("orpo")


def test_dpo_cdpo_hand_values():
    # beta = 0.1; pi_w = -10, ref_w = -12, pi_l = -14, ref_l = -11
    # chosen reward = 0.1*(-10+12) = 0.2, rejected reward = 0.1*(-14+11) = -0.3, h = 0.5
    args = (t(-10.0), t(-14.0), t(-12.0), t(-11.0))
    loss, figs = dpo(*args, beta=0.1)
    # -log sigma(0.5) = log(1 + e^-0.5) = log(1.6065307) = 0.4740770
    assert loss.item() == pytest.approx(0.4740770, abs=1e-7)
    assert figs["chosen_reward"].item() == pytest.approx(0.2)
    assert figs["rejected_reward"].item() == pytest.approx(-0.3)
    assert figs["margin"].item() == pytest.approx(0.5)
    assert figs["accuracy"].item() == 1.0
    # cdpo, eps = 0.1: 0.9*0.4740770 + 0.1*(-log sigma(-0.5)) = 0.9*0.4740770 + 0.1*0.9740770
    #   = 0.4266693 + 0.0974077 = 0.5240770   (-log sigma(-h) = h - log sigma(h))
    loss, figs = cdpo(*args, beta=0.1, label_smoothing=0.1)
    assert loss.item() == pytest.approx(0.5240770, abs=1e-7)
    assert figs["margin"].item() == pytest.approx(0.5)


def test_tied_pair_is_not_accurate():
    # policy == reference on both sides: rewards 0, margin 0, accuracy 0; dpo loss log 2
    loss, figs = dpo(t(-3.0), t(-7.0), t(-3.0), t(-7.0))
    assert loss.item() == pytest.approx(math.log(2.0))
    assert figs["margin"].item() == 0.0 and figs["accuracy"].item() == 0.0


def test_ipo_hand_values():
    # beta = 0.1; |y_w| = 4, |y_l| = 2
    # chosen: pi_w/4 - ref_w/4 = -8/4 + 10/4 = 0.5; rejected: -6/2 + 5/2 = -0.5
    # h/beta = 0.5 - (-0.5) = 1; target 1/(2*0.1) = 5; loss = (1 - 5)^2 = 16
    loss, figs = ipo(t(-8.0), t(-6.0), t(-10.0), t(-5.0), beta=0.1,
                     chosen_lengths=torch.tensor([4]), rejected_lengths=torch.tensor([2]))
    assert loss.item() == pytest.approx(16.0)
    # rewards are beta * averaged log-ratios: 0.05 and -0.05, margin 0.1
    assert figs["chosen_reward"].item() == pytest.approx(0.05)
    assert figs["rejected_reward"].item() == pytest.approx(-0.05)
    assert figs["margin"].item() == pytest.approx(0.1)
    assert figs["accuracy"].item() == 1.0


def test_simpo_hand_values():
    # beta = 2, gamma = 0.5; pi_w = -8 over 4 tokens -> -2 -> reward -4;
    # pi_l = -9 over 3 tokens -> -3 -> reward -6; margin 2
    # loss = -log sigma(2 - 0.5) = log(1 + e^-1.5) = log(1.2231302) = 0.2014133
    loss, figs = simpo(t(-8.0), t(-9.0), None, None, beta=2.0, gamma=0.5,
                       chosen_lengths=torch.tensor([4]), rejected_lengths=torch.tensor([3]))
    assert loss.item() == pytest.approx(0.2014133, abs=1e-7)
    assert figs["chosen_reward"].item() == pytest.approx(-4.0)
    assert figs["rejected_reward"].item() == pytest.approx(-6.0)
    assert figs["margin"].item() == pytest.approx(2.0)
    # gamma = 0 would give -log sigma(2) = 0.1269280
    loss0, _ = simpo(t(-8.0), t(-9.0), None, None, beta=2.0, gamma=0.0,
                     chosen_lengths=torch.tensor([4]), rejected_lengths=torch.tensor([3]))
    assert loss0.item() == pytest.approx(0.1269280, abs=1e-7)


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("beta", [0.1, 2.0])
def test_against_reference(name, beta):
    batch = _random_batch()
    loss, figs = _call(name, *batch, beta=beta)
    assert loss.shape == (16,) and loss.dtype == torch.float64
    rows = [reference(name, *vals, beta=beta) for vals in zip(*(x.tolist() for x in batch))]
    expected = torch.tensor(rows, dtype=torch.float64)
    torch.testing.assert_close(loss, expected[:, 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(figs["chosen_reward"], expected[:, 1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(figs["rejected_reward"], expected[:, 2], rtol=1e-12, atol=1e-12)
    margin = expected[:, 1] - expected[:, 2]
    torch.testing.assert_close(figs["margin"], margin, rtol=1e-12, atol=1e-12)
    assert figs["accuracy"].tolist() == [float(m > 0) for m in margin.tolist()]
    assert 0 < figs["accuracy"].sum() < 16  # the batch exercises both outcomes


def test_options_reach_the_loss():
    batch = _random_batch()
    rows = list(zip(*(x.tolist() for x in batch)))
    loss, _ = _call("cdpo", *batch, beta=0.3, label_smoothing=0.25)
    expected = [reference("cdpo", *r, beta=0.3, eps=0.25)[0] for r in rows]
    torch.testing.assert_close(loss, t(*expected), rtol=1e-12, atol=1e-12)
    loss, _ = _call("simpo", *batch, beta=2.5, gamma=1.4)
    expected = [reference("simpo", *r, beta=2.5, gamma=1.4)[0] for r in rows]
    torch.testing.assert_close(loss, t(*expected), rtol=1e-12, atol=1e-12)


def test_cdpo_with_zero_smoothing_is_dpo():
    pw, pl, rw, rl, _, _ = _random_batch(seed=1)
    a, fa = dpo(pw, pl, rw, rl, beta=0.5)
    b, fb = cdpo(pw, pl, rw, rl, beta=0.5, label_smoothing=0.0)
    assert torch.equal(a, b)
    assert all(torch.equal(fa[k], fb[k]) for k in fa)


@pytest.mark.parametrize("name", ["dpo", "cdpo", "simpo"])
def test_raising_chosen_logps_lowers_the_loss(name):
    pw, pl, rw, rl, lw, ll = _random_batch(seed=2)
    rw = pw - 0.5  # keeps |h| small, below cdpo's optimum h = log(0.9/0.1)
    rl = pl + 0.5
    pw = pw.clone().requires_grad_(True)
    loss, _ = _call(name, pw, pl, rw, rl, lw, ll, beta=1.0)
    loss.sum().backward()
    assert (pw.grad < 0).all()
    higher, _ = _call(name, pw.detach() + 0.5, pl, rw, rl, lw, ll, beta=1.0)
    assert (higher < loss.detach()).all()


def test_ipo_minimised_at_target():
    beta = 0.2  # target h/beta = 1/(2*0.2) = 2.5
    lw, ll = torch.tensor([5, 5, 5]), torch.tensor([2, 2, 2])
    rw, pl, rl = t(-10.0, -10.0, -10.0), t(-4.0, -4.0, -4.0), t(-4.0, -4.0, -4.0)
    # rejected log-ratio is 0, so h/beta = (pi_w + 10)/5: pi_w = 2.5 sits exactly on the target
    pw = t(2.5 - 1.0, 2.5, 2.5 + 1.0).requires_grad_(True)
    loss, _ = ipo(pw, pl, rw, rl, beta=beta, chosen_lengths=lw, rejected_lengths=ll)
    loss.sum().backward()
    # (h/beta - 2.5)^2 with h/beta = 2.5 -+ 0.2: 0.04, 0, 0.04
    torch.testing.assert_close(loss.detach(), t(0.04, 0.0, 0.04))
    assert pw.grad[0] < 0 and pw.grad[1] == 0 and pw.grad[2] > 0


def test_simpo_ignores_refs():
    pw, pl, rw, rl, lw, ll = _random_batch(seed=3)
    a, fa = simpo(pw, pl, None, None, beta=2.0, chosen_lengths=lw, rejected_lengths=ll)
    b, fb = simpo(pw, pl, rw, rl, beta=2.0, chosen_lengths=lw, rejected_lengths=ll)
    assert torch.equal(a, b)
    assert all(torch.equal(fa[k], fb[k]) for k in fa)


def test_refs_are_constants_and_figures_detached():
    pw, pl, rw, rl, lw, ll = _random_batch(seed=4)
    pw, rw = pw.clone().requires_grad_(True), rw.clone().requires_grad_(True)
    for name in LOSSES:
        loss, figs = _call(name, pw, pl, rw, rl, lw, ll)
        loss.sum().backward()
        assert rw.grad is None
        assert not any(f.requires_grad for f in figs.values())


def test_extreme_values_are_finite():
    # |h| = 1000 would overflow a naive log(sigmoid(h)); an empty completion (length 0,
    # log-prob sum 0) is divided by 1, not 0
    big, zero = t(1e4, -1e4), t(0.0, 0.0)
    for name in LOSSES:
        loss, _ = _call(name, big, zero, zero, zero, torch.tensor([0, 1]), torch.tensor([1, 0]))
        assert torch.isfinite(loss).all()
    loss, _ = dpo(big, zero, zero, zero)
    torch.testing.assert_close(loss, t(0.0, 1000.0))


@pytest.mark.parametrize("name", ["dpo", "cdpo", "ipo"])
@pytest.mark.parametrize("missing", [2, 3])
def test_reference_losses_need_refs(name, missing):
    args = list(_random_batch()[:4])
    args[missing] = None
    lw, ll = torch.ones(16), torch.ones(16)
    with pytest.raises(ValueError, match="ref_"):
        _call(name, *args, lw, ll)


@pytest.mark.parametrize("name", ["ipo", "simpo"])
def test_normalised_losses_need_lengths(name):
    pw, pl, rw, rl, lw, ll = _random_batch()
    with pytest.raises(ValueError, match="rejected_lengths"):
        _call(name, pw, pl, rw, rl, lw, None)
    with pytest.raises(ValueError, match="chosen_lengths"):
        _call(name, pw, pl, rw, rl, None, ll)


def test_bad_arguments():
    pw, pl, rw, rl, lw, ll = _random_batch()
    for eps in (-0.1, 0.5, 0.7):
        with pytest.raises(ValueError, match="label_smoothing"):
            cdpo(pw, pl, rw, rl, label_smoothing=eps)
    for name in LOSSES:
        with pytest.raises(ValueError, match="beta"):
            _call(name, pw, pl, rw, rl, lw, ll, beta=0.0)
        with pytest.raises(ValueError, match="shape"):
            _call(name, pw, pl[:3], rw, rl, lw, ll)
        with pytest.raises(ValueError, match="1-D"):
            _call(name, pw[None], pl[None], rw[None], rl[None], lw[None], ll[None])
    with pytest.raises(TypeError):
        dpo(pw, pl, rw, rl, gamma=0.5)  # options of other losses are not silently ignored
