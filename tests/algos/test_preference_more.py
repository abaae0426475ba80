"""The preference losses beyond dpo/cdpo/ipo/simpo: hand-computed values and an independent
float64 reference for each, the weighted sums, KTO and ORPO."""

import math

import pytest
import torch

from lmpo.algos import (PREFERENCE_LOSSES, aot, aot_pair, bco_pair, discopop, exo_pair, hinge, kto,
                        kto_reference_point, odds_ratio_loss, orpo, parse_loss_weights, robust, sft)

NEW = ["robust", "hinge", "exo_pair", "nca_pair", "bco_pair", "sppo_hard", "aot", "aot_pair", "apo_zero",
       "apo_down", "discopop", "sft"]


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


def ls(x):  # log sigma(x), stable, plain Python
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def sig(x):
    return math.exp(ls(x))


# One pair, beta = 0.1: pi_w = -10, pi_l = -14, ref_w = -12, ref_l = -11
# u_w = 2, u_l = -3; rewards beta*u: 0.2 and -0.3; h = 0.5
PAIR = (t(-10.0), t(-14.0), t(-12.0), t(-11.0))
LENGTHS = {"chosen_lengths": torch.tensor([4]), "rejected_lengths": torch.tensor([2])}
# Constants used below: log sigma(0.5) = -0.4740770, log sigma(-0.5) = -0.9740770,
# sigma(0.5) = 0.6224593, sigma(0.2) = 0.5498340, sigma(-0.3) = 0.4255575
HAND = {
    # [0.9*0.4740770 - 0.1*0.9740770] / (1 - 0.2) = 0.3292616 / 0.8
    "robust": 0.4115770,
    # max(0, 1 - 0.5)
    "hinge": 0.5,
    # eps = 0.1: 0.6224593*(-0.4740770 - log 0.9) + 0.3775407*(-0.9740770 - log 0.1)
    #          = 0.6224593*(-0.3687165) + 0.3775407*(1.3285081) = -0.2295104 + 0.5015652
    "exo_pair": 0.2720548,
    # -log sigma(0.2) - 0.5*log sigma(-0.2) - 0.5*log sigma(0.3)
    #   = 0.5981389 + 0.5*0.7981389 + 0.5*0.5543552
    "nca_pair": 1.2743859,
    # delta = mean(0.2, -0.3) = -0.05: -log sigma(0.25) - log sigma(-(-0.3 + 0.05)) = 2*0.5759394
    "bco_pair": 1.1518788,
    # 1/(2 beta) = 5: (2 - 5)^2 + (-3 + 5)^2 = 9 + 4
    "sppo_hard": 13.0,
    # 1 - sigma(0.2) + sigma(-0.3) = 0.4501660 + 0.4255575
    "apo_zero": 0.8757235,
    # sigma(0.2) + 1 - sigma(0.5) = 0.5498340 + 0.3775407
    "apo_down": 0.9273747,
    # tau = 0.05: m = sigma(10) = 0.9999546; (1 - m)*0.4740770 + m*e^-0.5 = 0.0000215 + 0.6065031
    "discopop": 0.6065246,
    # -pi_w/|y_w| = 10/4
    "sft": 2.5,
}
OPTIONS = {"robust": {"label_smoothing": 0.1}, "exo_pair": {"label_smoothing": 0.1},
           "discopop": {"discopop_tau": 0.05}}


@pytest.mark.parametrize("name", sorted(HAND))
def test_hand_values(name):
    loss, figs = PREFERENCE_LOSSES.get(name)(*PAIR, beta=0.1, **LENGTHS, **OPTIONS.get(name, {}))
    assert loss.item() == pytest.approx(HAND[name], abs=1e-7)
    if name != "sft":
        assert figs["chosen_reward"].item() == pytest.approx(0.2)
        assert figs["rejected_reward"].item() == pytest.approx(-0.3)
        assert figs["accuracy"].item() == 1.0


def test_hinge_is_zero_past_the_margin():
    # beta = 1: h = 2 - (-3) = 5 >= 1
    loss, _ = hinge(*PAIR, beta=1.0)
    assert loss.item() == 0.0


# Two pairs for the sorted (AOT) losses: pair 1 as above, pair 2 pi_w = -9, pi_l = -9, ref_w = -8,
# ref_l = -9. Policy margins pi_w - pi_l: [4, 0]; reference margins: [-1, 1];
# aot: sorted [0, 4] - sorted [-1, 1] = [1, 3] -> -log sigma(0.1), -log sigma(0.3) = 0.6443967, 0.5543552
# aot_pair: u_w = [2, -1] -> [-1, 2]; u_l = [-3, 0] -> [-3, 0]; deltas [2, 2] -> 0.5981389 twice
TWO = (t(-10.0, -9.0), t(-14.0, -9.0), t(-12.0, -8.0), t(-11.0, -9.0))


def test_aot_hand_values():
    loss, figs = aot(*TWO, beta=0.1)
    torch.testing.assert_close(loss, t(0.6443967, 0.5543552), atol=1e-7, rtol=0)
    loss, _ = aot_pair(*TWO, beta=0.1)
    torch.testing.assert_close(loss, t(0.5981389, 0.5981389), atol=1e-7, rtol=0)
    # figures stay per pair: pair 2's rewards are -0.1 and 0
    torch.testing.assert_close(figs["chosen_reward"], t(0.2, -0.1))
    # label smoothing 0.2 on the first delta (0.1): 0.8*0.6443967 + 0.2*0.7443967 = 0.6643967
    loss, _ = aot(*TWO, beta=0.1, label_smoothing=0.2)
    assert loss[0].item() == pytest.approx(0.6643967, abs=1e-7)


def reference(name, rows, beta, eps=0.1, tau=0.05):
    """Independent float64 reference, straight from each paper's formula, on a list of
    (pi_w, pi_l, ref_w, ref_l, len_w, len_l) rows; returns per-pair (or per-rank) losses."""
    uw = [r[0] - r[2] for r in rows]
    ul = [r[1] - r[3] for r in rows]
    out = []
    if name in ("aot", "aot_pair"):
        if name == "aot":
            a = sorted(r[0] - r[1] for r in rows)
            b = sorted(r[2] - r[3] for r in rows)
        else:
            a, b = sorted(uw), sorted(ul)
        return [-(1 - eps) * ls(beta * (x - y)) - eps * ls(-beta * (x - y)) for x, y in zip(a, b)]
    mean_reward = sum(beta * u for u in uw + ul) / (2 * len(rows))
    for (pw, pl, rw, rl, lw, ll), w, l in zip(rows, uw, ul):
        h = beta * (w - l)
        if name == "robust":
            out.append((-(1 - eps) * ls(h) + eps * ls(-h)) / (1 - 2 * eps))
        elif name == "hinge":
            out.append(max(0.0, 1 - h))
        elif name == "exo_pair":
            out.append(sig(h) * (ls(h) - math.log(1 - eps)) + sig(-h) * (ls(-h) - math.log(eps)))
        elif name == "nca_pair":
            out.append(-ls(beta * w) - 0.5 * ls(-beta * w) - 0.5 * ls(-beta * l))
        elif name == "bco_pair":
            out.append(-ls(beta * w - mean_reward) - ls(-(beta * l - mean_reward)))
        elif name == "sppo_hard":
            out.append((w - 1 / (2 * beta)) ** 2 + (l + 1 / (2 * beta)) ** 2)
        elif name == "apo_zero":
            out.append(1 - sig(beta * w) + sig(beta * l))
        elif name == "apo_down":
            out.append(sig(beta * w) + 1 - sig(beta * (w - l)))
        elif name == "discopop":
            m = sig(h / tau)
            out.append((1 - m) * -ls(h) + m * math.exp(-h))
        elif name == "sft":
            out.append(-pw / max(lw, 1))
    return out


def _random_batch(n=16, seed=0, scale=30.0):
    gen = torch.Generator().manual_seed(seed)
    pw, pl, rw, rl = (-scale * torch.rand(n, generator=gen, dtype=torch.float64) for _ in range(4))
    lw, ll = (torch.randint(1, 40, (n,), generator=gen) for _ in range(2))
    return pw, pl, rw, rl, lw, ll


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("beta", [0.1, 0.7])
def test_against_reference(name, beta):
    pw, pl, rw, rl, lw, ll = batch = _random_batch(scale=10.0)  # |h| moderate: discopop's exp stays sane
    options = {"label_smoothing": 0.15} if name in ("robust", "exo_pair", "aot", "aot_pair") else {}
    if name == "discopop":
        options = {"discopop_tau": 0.3}
    loss, figs = PREFERENCE_LOSSES.get(name)(pw, pl, rw, rl, beta=beta, chosen_lengths=lw, rejected_lengths=ll,
                                             **options)
    assert loss.shape == (16,) and loss.dtype == torch.float64
    rows = list(zip(*(x.tolist() for x in batch)))
    expected = reference(name, rows, beta, eps=options.get("label_smoothing", 0.1), tau=options.get("discopop_tau", 0.05))
    torch.testing.assert_close(loss, t(*expected), rtol=1e-10, atol=1e-10)
    assert not any(f.requires_grad for f in figs.values())
    if name != "sft":
        torch.testing.assert_close(figs["chosen_reward"], beta * (pw - rw), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", [n for n in NEW if n not in ("sft",)])
def test_need_references(name):
    pw, pl, rw, rl, lw, ll = _random_batch()
    with pytest.raises(ValueError, match="ref_"):
        PREFERENCE_LOSSES.get(name)(pw, pl, None, rl, chosen_lengths=lw, rejected_lengths=ll)


@pytest.mark.parametrize("name", NEW)
def test_gradient_flows_to_policy_only_and_is_finite(name):
    pw, pl, rw, rl, lw, ll = _random_batch(seed=5)
    pw, rw = pw.clone().requires_grad_(True), rw.clone().requires_grad_(True)
    loss, _ = PREFERENCE_LOSSES.get(name)(pw, pl, rw, rl, chosen_lengths=lw, rejected_lengths=ll)
    loss.sum().backward()
    assert rw.grad is None and torch.isfinite(pw.grad).all()


@pytest.mark.parametrize("name", NEW)
def test_extreme_values_are_finite(name):
    big, zero = t(1e4, -1e4), t(0.0, 0.0)
    loss, _ = PREFERENCE_LOSSES.get(name)(big, zero, zero, zero, chosen_lengths=torch.tensor([0, 1]),
                                          rejected_lengths=torch.tensor([1, 0]))
    if name != "discopop":
        assert torch.isfinite(loss).all()
    else:  # h = +1000 must not give 0*inf; at h = -1000 the loss exp(-h) itself overflows
        assert torch.isfinite(loss[0]) and loss[0].item() == pytest.approx(0.0, abs=1e-12)


def test_option_checks():
    pw, pl, rw, rl, _, _ = _random_batch()
    with pytest.raises(ValueError, match="label_smoothing"):
        robust(pw, pl, rw, rl, label_smoothing=0.5)
    with pytest.raises(ValueError, match="label_smoothing"):
        exo_pair(pw, pl, rw, rl, label_smoothing=0.0)
    with pytest.raises(ValueError, match="discopop_tau"):
        discopop(pw, pl, rw, rl, discopop_tau=0.0)
    with pytest.raises(TypeError):
        hinge(pw, pl, rw, rl, label_smoothing=0.1)
    # robust with no smoothing is DPO; bco_pair with an explicit delta uses it
    a, _ = robust(pw, pl, rw, rl, label_smoothing=0.0)
    b, _ = PREFERENCE_LOSSES.get("dpo")(pw, pl, rw, rl)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    loss, _ = bco_pair(*PAIR, beta=0.1, delta=0.0)  # -log sigma(0.2) - log sigma(0.3)
    assert loss.item() == pytest.approx(0.5981389 + 0.5543552, abs=1e-7)


def test_sft_and_flags():
    assert sft.reference_free and orpo.reference_free and PREFERENCE_LOSSES.get("simpo").reference_free
    assert not getattr(PREFERENCE_LOSSES.get("dpo"), "reference_free", False)
    with pytest.raises(ValueError, match="chosen_lengths"):
        sft(*PAIR)
    loss, _ = sft(PAIR[0], PAIR[1], None, None, **LENGTHS)
    assert loss.item() == 2.5


# ---- weighted sums ----

def test_parse_loss_weights():
    assert parse_loss_weights("dpo=0.8, bco_pair=0.2,sft", PREFERENCE_LOSSES) == [
        ("dpo", 0.8), ("bco_pair", 0.2), ("sft", 1.0)]
    for spec, message in [("dpo=0.8,kto=0.2", "unknown preference loss 'kto'"), ("dpo=1,dpo=2", "twice"),
                          ("dpo=x", "not a number"), ("dpo=0", "> 0"), ("dpo=-1", "> 0"), ("dpo=inf", "finite"),
                          ("dpo=1,", "empty part")]:
        with pytest.raises(ValueError, match=message):
            PREFERENCE_LOSSES.get(spec)
        assert spec not in PREFERENCE_LOSSES
    assert "dpo=0.8,bco_pair=0.2,sft=1" in PREFERENCE_LOSSES and "dpo" in PREFERENCE_LOSSES


def test_mpo_hand_value():
    # MPO: 0.8*dpo + 0.2*bco_pair + 1*sft = 0.8*0.4740770 + 0.2*1.1518788 + 2.5 = 3.1096374
    fn = PREFERENCE_LOSSES.get("dpo=0.8,bco_pair=0.2,sft=1")
    loss, figs = fn(*PAIR, beta=0.1, **LENGTHS)
    assert loss.item() == pytest.approx(3.1096374, abs=1e-7)
    assert figs["loss_dpo"].item() == pytest.approx(0.4740770, abs=1e-7)
    assert figs["loss_bco_pair"].item() == pytest.approx(1.1518788, abs=1e-7)
    assert figs["loss_sft"].item() == 2.5
    assert figs["margin"].item() == pytest.approx(0.5)  # the first part's figures
    assert not fn.reference_free and fn.parts == [("dpo", 0.8), ("bco_pair", 0.2), ("sft", 1.0)]


def test_weighted_sum_matches_its_parts_and_routes_options():
    import inspect

    pw, pl, rw, rl, lw, ll = _random_batch(seed=7)
    fn = PREFERENCE_LOSSES.get("cdpo=0.5,simpo=2,discopop=1")
    params = inspect.signature(fn).parameters
    assert {"label_smoothing", "gamma", "discopop_tau"} <= set(params)
    kw = {"beta": 0.3, "chosen_lengths": lw, "rejected_lengths": ll}
    loss, _ = fn(pw, pl, rw, rl, **kw, label_smoothing=0.2, gamma=0.7, discopop_tau=0.4)
    expected = (0.5 * PREFERENCE_LOSSES.get("cdpo")(pw, pl, rw, rl, **kw, label_smoothing=0.2)[0]
                + 2 * PREFERENCE_LOSSES.get("simpo")(pw, pl, rw, rl, **kw, gamma=0.7)[0]
                + PREFERENCE_LOSSES.get("discopop")(pw, pl, rw, rl, **kw, discopop_tau=0.4)[0])
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="unexpected"):
        fn(pw, pl, rw, rl, **kw, delta=0.1)
    assert PREFERENCE_LOSSES.get("simpo=1,sft=0.5").reference_free
    # a one-part spec is that loss, scaled
    one, _ = PREFERENCE_LOSSES.get("dpo=2")(pw, pl, rw, rl)
    torch.testing.assert_close(one, 2 * PREFERENCE_LOSSES.get("dpo")(pw, pl, rw, rl)[0])


# ---- KTO and ORPO ----

def test_kto_hand_values():
    # beta = 0.1, z0 = 1 (beta*z0 = 0.1); weights lambda_D = 1, lambda_U = 1.5
    # desirable, u = 3: r = 0.3; 1 - sigma(0.3 - 0.1) = 1 - 0.5498340 = 0.4501660
    # undesirable, u = -2: r = -0.2; 1.5*(1 - sigma(0.1 + 0.2)) = 1.5*0.4255575 = 0.6383362
    policy, ref = t(-7.0, -12.0), t(-10.0, -10.0)
    loss, figs = kto(policy, ref, torch.tensor([True, False]), t(1.0), beta=0.1, undesirable_weight=1.5)
    torch.testing.assert_close(loss, t(0.4501660, 0.6383362), atol=1e-7, rtol=0)
    torch.testing.assert_close(figs["reward"], t(0.3, -0.2))
    torch.testing.assert_close(figs["z0"], t(1.0, 1.0))
    # z0: mean KL estimate, clamped at 0: mean(1, -3) = -1 -> 0; mean(2, 1) = 1.5
    assert kto_reference_point(t(-4.0, -6.0), t(-5.0, -3.0)).item() == 0.0
    assert kto_reference_point(t(-3.0, -4.0), t(-5.0, -5.0)).item() == 1.5


def test_kto_against_reference():
    gen = torch.Generator().manual_seed(3)
    policy, ref = (-20 * torch.rand(12, generator=gen, dtype=torch.float64) for _ in range(2))
    desirable = torch.rand(12, generator=gen) > 0.4
    z0, beta, wd, wu = 0.37, 0.25, 1.2, 0.8
    policy = policy.requires_grad_(True)
    loss, _ = kto(policy, ref, desirable, torch.tensor(z0, dtype=torch.float64), beta=beta, desirable_weight=wd, undesirable_weight=wu)
    expected = [wd * (1 - sig(beta * (p - r) - beta * z0)) if d else wu * (1 - sig(beta * z0 - beta * (p - r)))
                for p, r, d in zip(policy.tolist(), ref.tolist(), desirable.tolist())]
    torch.testing.assert_close(loss, t(*expected), rtol=1e-12, atol=1e-12)
    loss.sum().backward()
    # raising a desirable example's log-prob lowers its loss; an undesirable one's raises it
    assert (policy.grad[desirable] < 0).all() and (policy.grad[~desirable] > 0).all()
    with pytest.raises(ValueError, match="bool"):
        kto(policy, ref, desirable.float(), 0.0)
    with pytest.raises(ValueError, match="scalar"):
        kto(policy, ref, desirable, t(0.0, 1.0))


def test_orpo_hand_values():
    # chosen: average log-prob log 0.5 (odds 1, log odds 0) over 4 tokens;
    # rejected: log 0.2 (odds 0.25, log odds -1.3862944) over 2 tokens
    # log odds ratio 1.3862944; -log sigma(1.3862944) = log(1 + 0.25) = 0.2231436
    # loss = NLL 0.6931472 + 0.1*0.2231436 = 0.7154615
    chosen, rejected = t(4 * math.log(0.5)), t(2 * math.log(0.2))
    loss, figs = orpo(chosen, rejected, None, None, beta=0.1, **LENGTHS)
    assert loss.item() == pytest.approx(0.7154615, abs=1e-7)
    assert figs["log_odds_ratio"].item() == pytest.approx(math.log(4.0), abs=1e-12)
    assert figs["nll"].item() == pytest.approx(math.log(2.0), abs=1e-12)
    term, _ = odds_ratio_loss(t(math.log(0.5)), t(math.log(0.2)))
    assert term.item() == pytest.approx(math.log(1.25), abs=1e-12)


def test_orpo_against_reference_and_edges():
    pw, pl, _, _, lw, ll = _random_batch(seed=9, scale=5.0)
    loss, _ = orpo(pw, pl, None, None, beta=0.3, chosen_lengths=lw, rejected_lengths=ll)
    expected = []
    for a, b, n, m in zip(pw.tolist(), pl.tolist(), lw.tolist(), ll.tolist()):
        aw, al = a / n, b / m
        log_odds = (aw - math.log(1 - math.exp(aw))) - (al - math.log(1 - math.exp(al)))
        expected.append(-aw - 0.3 * ls(log_odds))
    torch.testing.assert_close(loss, t(*expected), rtol=1e-10, atol=1e-10)
    # an average log-prob of exactly 0 (p = 1) and a very negative one stay finite
    term, log_odds = odds_ratio_loss(t(0.0, -1e-30, -200.0), t(-1.0, 0.0, -0.5))
    assert torch.isfinite(term).all() and torch.isfinite(log_odds).all()
