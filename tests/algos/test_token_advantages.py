import math

import pytest
import torch

from lmpo.algos import (
    TOKEN_ADVANTAGES,
    discounted_returns,
    gae,
    masked_whiten,
    reinforce_pp,
    token_rewards,
)

NAN = float("nan")


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


# Hand-worked: r = [0, 0, 0, 1], V = [0.5, 0.6, 0.7, 0.8], gamma = 0.9, lam = 0.8 (gamma*lam = 0.72)
# delta_3 = 1 + 0.9*0   - 0.8 = 0.2      A_3 = 0.2
# delta_2 = 0 + 0.9*0.8 - 0.7 = 0.02     A_2 = 0.02 + 0.72*0.2     = 0.164
# delta_1 = 0 + 0.9*0.7 - 0.6 = 0.03     A_1 = 0.03 + 0.72*0.164   = 0.14808
# delta_0 = 0 + 0.9*0.6 - 0.5 = 0.04     A_0 = 0.04 + 0.72*0.14808 = 0.1466176
# returns = A + V = [0.6466176, 0.74808, 0.864, 1.0]
HAND_ADV = [0.1466176, 0.14808, 0.164, 0.2]
HAND_RET = [0.6466176, 0.74808, 0.864, 1.0]


def test_gae_hand_worked():
    adv, ret = gae(_t([[0, 0, 0, 1]]), _t([[1, 1, 1, 1]]), values=_t([[0.5, 0.6, 0.7, 0.8]]),
                   gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, _t([HAND_ADV]))
    torch.testing.assert_close(ret, _t([HAND_RET]))


def test_gae_skips_holes_and_ignores_garbage_off_mask():
    # The same trajectory with an observation token (mask 0, NaN reward/value) inserted at
    # t=2 and padding at the end: the model tokens get the same numbers, the others exactly 0.
    rewards = _t([[0, 0, NAN, 0, 1, NAN]])
    values = _t([[0.5, 0.6, NAN, 0.7, 0.8, NAN]])
    mask = _t([[1, 1, 0, 1, 1, 0]])
    adv, ret = gae(rewards, mask, values=values, gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, _t([[HAND_ADV[0], HAND_ADV[1], 0, HAND_ADV[2], HAND_ADV[3], 0]]))
    torch.testing.assert_close(ret, _t([[HAND_RET[0], HAND_RET[1], 0, HAND_RET[2], HAND_RET[3], 0]]))


def test_gae_gamma_lam_one_is_future_reward_sum_minus_value():
    gen = torch.Generator().manual_seed(3)
    r = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    v = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    adv, ret = gae(r, torch.ones_like(r), values=v)
    future = r.flip(-1).cumsum(-1).flip(-1)
    torch.testing.assert_close(adv, future - v)
    torch.testing.assert_close(ret, future)


def reference_gae(rewards, values, mask, gamma, lam):
    """Plain-Python float64 GAE, one row at a time, over the mask-1 tokens only."""
    adv_out, ret_out = [], []
    for r_row, v_row, m_row in zip(rewards, values, mask):
        idx = [t for t, m in enumerate(m_row) if m]
        adv_row, ret_row = [0.0] * len(m_row), [0.0] * len(m_row)
        running, next_v = 0.0, 0.0
        for t in reversed(idx):
            delta = r_row[t] + gamma * next_v - v_row[t]
            running = delta + gamma * lam * running
            adv_row[t], ret_row[t] = running, running + v_row[t]
            next_v = v_row[t]
        adv_out.append(adv_row)
        ret_out.append(ret_row)
    return _t(adv_out), _t(ret_out)


def _random_batch(seed, b=6, t=9):
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(b, t, generator=gen, dtype=torch.float64)
    v = torch.randn(b, t, generator=gen, dtype=torch.float64)
    mask = (torch.rand(b, t, generator=gen) > 0.35).double()
    mask[0] = 0.0  # fully masked row
    mask[1] = _t([1, 1, 0, 0, 1, 1, 0, 1, 0])  # holes (two tool turns) and trailing padding
    r[mask == 0] = NAN
    v[mask == 0] = NAN
    return r, v, mask


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.9, 0.8), (0.99, 0.95), (0.5, 0.0)])
def test_gae_against_reference(gamma, lam):
    r, v, mask = _random_batch(0)
    adv, ret = gae(r, mask, values=v, gamma=gamma, lam=lam)
    ref_adv, ref_ret = reference_gae(r.tolist(), v.tolist(), mask.tolist(), gamma, lam)
    torch.testing.assert_close(adv, ref_adv, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(ret, ref_ret, atol=1e-12, rtol=1e-12)
    assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()
    assert (adv[0] == 0).all()


def test_gae_dtype_and_no_grad():
    r = torch.zeros(2, 3, requires_grad=True)
    v = torch.ones(2, 3, requires_grad=True)
    adv, ret = gae(r, torch.ones(2, 3), values=v, gamma=0.9, lam=0.9)
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    assert not adv.requires_grad and not ret.requires_grad


def test_discounted_returns_and_reinforce_pp_returns():
    # gamma = 0.5, r = [1, 2, hole, 4]: G_3 = 4, G_1 = 2 + 0.5*4 = 4, G_0 = 1 + 0.5*4 = 3
    # (the hole is skipped, not discounted)
    r, mask = _t([[1, 2, NAN, 4]]), _t([[1, 1, 0, 1]])
    expected = _t([[3, 4, 0, 4]])
    torch.testing.assert_close(discounted_returns(r, mask, 0.5), expected)
    _, returns = reinforce_pp(r, mask, gamma=0.5)
    torch.testing.assert_close(returns, expected)


def test_reinforce_pp_whitens_over_the_whole_batch():
    r, v, mask = _random_batch(1)
    adv, ret = reinforce_pp(r, mask, values=v, gamma=0.95, lam=0.3)
    ref_ret = reference_gae(r.tolist(), [[0.0] * 9] * 6, mask.tolist(), 0.95, 1.0)[1]
    torch.testing.assert_close(ret, ref_ret, atol=1e-12, rtol=1e-12)
    sel = adv[mask == 1]
    assert abs(sel.mean().item()) < 1e-12
    assert sel.std(correction=0).item() == pytest.approx(1.0, abs=1e-6)
    g = ret[mask == 1]
    torch.testing.assert_close(sel, (g - g.mean()) / (g.var(correction=0) + 1e-8).sqrt())
    assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()
    # per-row means are not 0: the whitening is batch-wide, not per sequence or group
    assert any(abs(adv[i][mask[i] == 1].mean().item()) > 0.1 for i in range(1, 6))


def test_masked_whiten_options():
    x, mask = _t([[1, 2, NAN], [3, 9, 4]]), _t([[1, 1, 0], [1, 0, 1]])
    # masked values 1, 2, 3, 4: mean 2.5, population var 1.25, sample var 5/3
    out = masked_whiten(x, mask, eps=0.0)
    torch.testing.assert_close(out, _t([[-1.5, -0.5, 0], [0.5, 0, 1.5]]) / math.sqrt(1.25))
    out = masked_whiten(x, mask, eps=0.0, unbiased=True)
    torch.testing.assert_close(out, _t([[-1.5, -0.5, 0], [0.5, 0, 1.5]]) / math.sqrt(5 / 3))
    kept = masked_whiten(x, mask, shift_mean=False, eps=0.0)
    torch.testing.assert_close(kept[mask == 1].mean(), torch.tensor(2.5, dtype=torch.float64))
    assert (kept[mask == 0] == 0).all()
    assert (masked_whiten(x, torch.zeros_like(mask)) == 0).all()


def test_token_rewards_placement():
    mask = _t([[1, 1, 1, 0, 0], [0, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    seq = _t([2.0, -1.0, 5.0, 0.5])
    out = token_rewards(seq, mask)
    expected = _t([[0, 0, 2, 0, 0], [0, 0, 0, -1, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0.5]])
    torch.testing.assert_close(out, expected)
    kl = torch.full((4, 5), 0.5, dtype=torch.float64)
    kl[mask == 0] = NAN
    out = token_rewards(seq, mask, kl=kl, beta=0.1)
    torch.testing.assert_close(out, expected - 0.05 * mask)
    assert (out[mask == 0] == 0).all()
    # the kl is ignored when beta is 0
    torch.testing.assert_close(token_rewards(seq, mask, kl=kl, beta=0.0), expected)


def test_token_rewards_dtype_and_errors():
    mask = torch.ones(2, 3)
    assert token_rewards(torch.tensor([1, 0]), mask).dtype == torch.get_default_dtype()
    with pytest.raises(ValueError, match="kl"):
        token_rewards(torch.ones(2), mask, beta=0.1)
    with pytest.raises(ValueError):
        token_rewards(torch.ones(3), mask)


def test_registry_single_signature_and_end_to_end_sequence_rewards():
    # R on the last token and gamma = 1: every model token's return is R_i - beta * future kl.
    mask = _t([[1, 1, 0, 1], [1, 1, 1, 0]])
    kl = _t([[0.1, 0.2, NAN, 0.3], [0.0, 0.0, 0.4, NAN]])
    r = token_rewards(_t([1.0, 0.0]), mask, kl=kl, beta=1.0)
    _, ret = reinforce_pp(r, mask)
    torch.testing.assert_close(ret, _t([[0.4, 0.5, 0, 0.7], [-0.4, -0.4, -0.4, 0]]))
    values = torch.zeros_like(r)
    for name in TOKEN_ADVANTAGES.names():
        adv, ret = TOKEN_ADVANTAGES.get(name)(r, mask, values=values, gamma=1.0, lam=1.0)
        assert torch.isfinite(adv).all() and (adv[mask == 0] == 0).all()


def test_gae_errors():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="values"):
        gae(x, x)
    with pytest.raises(ValueError):
        gae(x, x, values=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="gamma"):
        gae(x, x, values=x, gamma=1.5)
    with pytest.raises(ValueError, match="choose one of: gae, reinforce_pp"):
        TOKEN_ADVANTAGES.get("ppo")


@pytest.mark.parametrize("name", ["gae", "reinforce_pp"])
def test_unknown_keyword_is_refused(name):
    # a misspelt option (lamda for lam) used to be swallowed by **_, silently running with lam=1
    mask = _t([[1, 1, 1]])
    with pytest.raises(TypeError, match="lamda"):
        TOKEN_ADVANTAGES.get(name)(_t([[0, 0, 1]]), mask, values=_t([[0.1, 0.2, 0.3]]), gamma=0.9, lamda=0.5)
    # every estimator still takes the options the RL loop passes to all of them
    TOKEN_ADVANTAGES.get(name)(_t([[0, 0, 1]]), mask, values=_t([[0.1, 0.2, 0.3]]), gamma=0.9, lam=0.5)
