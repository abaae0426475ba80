import math
import re

import pytest
import torch

from lmpo.algos import POLICY_LOSSES, cispo, gspo, gspo_token, ppo_clip, seq_mean_token_mean


def _inputs(ratios, advantages):
    """One row of tokens with the given ratios r (old_logprobs = 0, logprobs = log r)."""
    logprobs = torch.tensor([[math.log(r) for r in ratios]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros_like(logprobs)
    adv = torch.tensor([advantages], dtype=torch.float64)
    return logprobs, old, adv, torch.ones_like(adv)


def _grad(loss, logprobs):
    (g,) = torch.autograd.grad(loss.sum(), logprobs)
    return g


def test_ppo_clip_hand_values():
    # (r, A): above/below the clip range, positive/negative A, and one in range.
    logprobs, old, adv, mask = _inputs([1.5, 1.5, 0.5, 0.5, 1.1], [1.0, -1.0, 1.0, -1.0, 2.0])
    loss, ind = ppo_clip(logprobs, old, adv, mask)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, 1.5, -0.5, 0.8, -2.2]], dtype=torch.float64))
    assert ind["clipped"].tolist() == [[1.0, 0.0, 0.0, 1.0, 0.0]]
    assert ind["clipped_high"].tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]
    assert ind["clipped_low"].tolist() == [[0.0, 0.0, 0.0, 1.0, 0.0]]
    # d(-r A)/d log r = -r A on unclipped tokens, 0 on clipped ones
    torch.testing.assert_close(
        _grad(loss, logprobs), torch.tensor([[0.0, 1.5, -0.5, 0.0, -2.2]], dtype=torch.float64)
    )


def test_ppo_clip_asymmetric_eps():
    logprobs, old, adv, mask = _inputs([1.25, 1.35, 0.85, 0.95], [1.0, 1.0, -1.0, -1.0])
    loss, ind = ppo_clip(logprobs, old, adv, mask, clip_eps_low=0.1, clip_eps_high=0.3)
    torch.testing.assert_close(loss, torch.tensor([[-1.25, -1.3, 0.9, 0.95]], dtype=torch.float64))
    assert ind["clipped"].tolist() == [[0.0, 1.0, 1.0, 0.0]]
    symmetric, _ = ppo_clip(logprobs, old, adv, mask)
    torch.testing.assert_close(symmetric, torch.tensor([[-1.2, -1.2, 0.85, 0.95]], dtype=torch.float64))


def test_dual_clip_only_changes_negative_advantages():
    ratios = [5.0, 5.0, 2.0, 0.5, 4.0, 1.0]
    advs = [-1.0, 1.0, -1.0, -1.0, -0.5, 0.7]
    logprobs, old, adv, mask = _inputs(ratios, advs)
    plain, _ = ppo_clip(logprobs, old, adv, mask)
    dual, ind = ppo_clip(logprobs, old, adv, mask, dual_clip=3.0)
    torch.testing.assert_close(dual, torch.tensor([[3.0, -1.2, 2.0, 0.8, 1.5, -0.7]], dtype=torch.float64))
    changed = (dual != plain)[0].tolist()
    assert changed == [True, False, False, False, True, False]
    assert all(a < 0 for a, c in zip(advs, changed) if c)
    assert ind["dual_clipped"].tolist() == [[1.0, 0.0, 0.0, 0.0, 1.0, 0.0]]
    assert ind["clipped"].tolist() == [[1.0, 1.0, 0.0, 1.0, 1.0, 0.0]]
    grad = _grad(dual, logprobs)
    assert grad[0, 0] == 0 and grad[0, 4] == 0 and grad[0, 2] == pytest.approx(2.0)


@pytest.mark.parametrize("c", [1.0, 0.5, -3.0])
def test_dual_clip_must_exceed_one(c):
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip(*_inputs([1.0], [1.0]), dual_clip=c)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "gspo_token", "cispo"])
def test_masked_positions_are_exactly_zero(name):
    gen = torch.Generator().manual_seed(1)
    base = -torch.rand(3, 5, generator=gen) - 0.1
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [0, 0, 0, 0, 0]], dtype=torch.float32)
    garbage = torch.tensor([-math.inf, math.nan, math.inf, -1e30, -math.inf])
    logprobs = torch.where(mask.bool(), base, garbage).requires_grad_(True)
    old = torch.where(mask.bool(), base - 0.01 * torch.randn(3, 5, generator=gen), -math.inf)
    adv = torch.where(mask.bool(), torch.randn(3, 5, generator=gen), math.nan)
    loss, ind = POLICY_LOSSES.get(name)(logprobs, old, adv, mask)
    assert loss.shape == (3, 5)
    assert (loss[mask == 0] == 0).all() and torch.isfinite(loss).all()
    assert (loss[mask == 1] != 0).all()
    assert "clipped" in ind
    for value in ind.values():
        assert value.shape == (3, 5) and (value[mask == 0] == 0).all()
    grad = _grad(seq_mean_token_mean(loss, mask), logprobs)
    assert torch.isfinite(grad).all() and (grad[mask == 0] == 0).all()


def test_on_policy_gradient_is_plain_policy_gradient():
    gen = torch.Generator().manual_seed(2)
    logprobs = (-torch.rand(4, 6, generator=gen, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    mask = (torch.rand(4, 6, generator=gen) > 0.3).double()
    loss, ind = ppo_clip(logprobs, logprobs.detach().clone(), adv, mask)
    torch.testing.assert_close(_grad(loss, logprobs), -adv * mask)
    assert ind["clipped"].sum() == 0


def _random_batch(seed, scale=0.05):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(3, 6, generator=gen, dtype=torch.float64) - 0.5
    logprobs = (old + scale * torch.randn(3, 6, generator=gen, dtype=torch.float64)).requires_grad_(True)
    row_adv = torch.tensor([[1.5], [-0.7], [0.4]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]], dtype=torch.float64)
    return logprobs, old, row_adv.expand(3, 6).clone(), mask


def test_gspo_sequence_ratio_is_geometric_mean_of_token_ratios():
    logprobs, old, adv, mask = _random_batch(3)
    loss, ind = gspo(logprobs, old, adv, mask, clip_eps_low=10.0, clip_eps_high=10.0)
    for i in range(3):
        valid = mask[i].bool()
        token_ratios = (logprobs[i, valid] - old[i, valid]).exp().tolist()
        s_i = math.prod(token_ratios) ** (1 / len(token_ratios))
        a_i = adv[i, 0].item()
        expected = torch.where(valid, -s_i * a_i, 0.0).double()
        torch.testing.assert_close(loss[i], expected)
    assert ind["clipped"].sum() == 0


def test_gspo_gradient_and_clip():
    logprobs, old, adv, mask = _random_batch(4)
    loss, _ = gspo(logprobs, old, adv, mask, clip_eps_low=10.0, clip_eps_high=10.0)
    grad = _grad(seq_mean_token_mean(loss, mask), logprobs)
    lengths = mask.sum(-1, keepdim=True)
    s = (((logprobs - old) * mask).sum(-1, keepdim=True) / lengths).exp()
    # d/d logprob_{i,t} of (1/G) sum_i -s_i A_i = -(1/G) A_i s_i / L_i on row i's tokens
    torch.testing.assert_close(grad, (-adv * s / lengths / 3 * mask).detach())

    # with the paper's tiny eps, a row is clipped iff its ratio left the range on A's side
    clipped_loss, ind = gspo(logprobs, old, adv, mask)
    assert ind["clipped"].sum(-1).tolist() == [4.0, 0.0, 2.0]  # rows 0, 2 clipped; row 1 (A<0) not
    expected_clipped = torch.where(s > 1 + 4e-4, (adv > 0).double(), (adv < 0).double()) * mask
    assert torch.equal(ind["clipped"], expected_clipped.detach())
    clipped_grad = _grad(seq_mean_token_mean(clipped_loss, mask), logprobs)
    assert (clipped_grad[ind["clipped"] == 1] == 0).all()
    assert (clipped_grad[(ind["clipped"] == 0) & (mask == 1)] != 0).all()


def test_gspo_token_matches_gspo_with_constant_advantages():
    logprobs, old, adv, mask = _random_batch(5)
    wide = {"clip_eps_low": 10.0, "clip_eps_high": 10.0}
    seq_loss, _ = gspo(logprobs, old, adv, mask, **wide)
    tok_loss, _ = gspo_token(logprobs, old, adv, mask, **wide)
    torch.testing.assert_close(tok_loss, seq_loss)
    torch.testing.assert_close(
        _grad(seq_mean_token_mean(tok_loss, mask), logprobs),
        _grad(seq_mean_token_mean(seq_loss, mask), logprobs),
    )


def test_gspo_token_per_token_gradient():
    logprobs, old, _, mask = _random_batch(6)
    adv = torch.randn(3, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    loss, _ = gspo_token(logprobs, old, adv, mask, clip_eps_low=10.0, clip_eps_high=10.0)
    s = (((logprobs - old) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)).exp()
    torch.testing.assert_close(loss, (-s * adv * mask).detach())
    # d l_{i,t} / d logprob_{i,t} = -sg(s_i) A_{i,t}; no cross-token terms.
    torch.testing.assert_close(_grad(loss, logprobs), (-s * adv * mask).detach())


def test_cispo_gradient_uses_stop_gradient_clipped_weight():
    ratios = [1.5, 0.5, 1.1, 0.7]
    advs = [1.0, -2.0, 0.5, 1.0]
    logprobs = torch.tensor([[-0.4, -1.3, -2.0, -0.1]], dtype=torch.float64, requires_grad=True)
    old = logprobs.detach() - torch.tensor([[math.log(r) for r in ratios]], dtype=torch.float64)
    adv = torch.tensor([advs], dtype=torch.float64)
    mask = torch.ones_like(adv)
    loss, ind = cispo(logprobs, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    weight = torch.tensor([[1.28, 0.8, 1.1, 0.8]], dtype=torch.float64)
    torch.testing.assert_close(loss, (-weight * adv * logprobs).detach())
    # gradient flows even through clipped tokens, with the weight as a constant
    torch.testing.assert_close(_grad(loss, logprobs), -weight * adv)
    assert ind["clipped"].tolist() == [[1.0, 1.0, 0.0, 1.0]]


def test_cispo_ratio_cap_is_absolute():
    # TRL's cispo: weight = sg(min(r, cap)), no lower bound; cap 0.9 is below 1
    ratios = [1.5, 0.5, 0.95, 0.7]
    advs = [1.0, -2.0, 0.5, 1.0]
    logprobs = torch.tensor([[-0.4, -1.3, -2.0, -0.1]], dtype=torch.float64, requires_grad=True)
    old = logprobs.detach() - torch.tensor([[math.log(r) for r in ratios]], dtype=torch.float64)
    adv = torch.tensor([advs], dtype=torch.float64)
    mask = torch.ones_like(adv)
    loss, ind = cispo(logprobs, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28, ratio_cap=0.9)
    # min(1.5, 0.9) = 0.9; 0.5 stays 0.5 (no lower bound); min(0.95, 0.9) = 0.9; 0.7 stays
    weight = torch.tensor([[0.9, 0.5, 0.9, 0.7]], dtype=torch.float64)
    # hand value of the first token: -0.9 * 1.0 * (-0.4) = 0.36
    assert loss[0, 0].item() == pytest.approx(0.36)
    torch.testing.assert_close(loss, (-weight * adv * logprobs).detach())
    torch.testing.assert_close(_grad(loss, logprobs), -weight * adv)
    assert ind["clipped"].tolist() == [[1.0, 0.0, 1.0, 0.0]]
    assert ind["clipped_low"].sum() == 0
    with pytest.raises(ValueError, match="ratio_cap"):
        cispo(logprobs, old, adv, mask, ratio_cap=0.0)


def test_cispo_sequence_ratio():
    # row 0: rho = [log 2, 0] over 2 loss tokens (third masked) -> s = exp(log(2)/2) = sqrt 2
    # weight = min(max(sqrt 2, 0.8), 1.28) = 1.28 on both tokens; A = 1
    # row 1: rho = [0.1, -0.1, 0.3] -> mean 0.1 -> s = e^0.1 = 1.10517, in range: weight s
    logprobs = torch.tensor([[-0.5, -1.0, -7.0], [-0.2, -0.3, -0.4]], dtype=torch.float64, requires_grad=True)
    rho = torch.tensor([[math.log(2.0), 0.0, 0.0], [0.1, -0.1, 0.3]], dtype=torch.float64)
    old = logprobs.detach() - rho
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0], [-2.0]], dtype=torch.float64)
    loss, ind = cispo(logprobs, old, adv, mask, ratio_level="sequence")
    weight = torch.tensor([[1.28, 1.28, 0.0], [math.exp(0.1)] * 3], dtype=torch.float64)
    expected = (-weight * adv * logprobs * mask).detach()
    torch.testing.assert_close(loss, expected, atol=1e-12, rtol=1e-12)
    assert loss[0, 0].item() == pytest.approx(-1.28 * 1.0 * -0.5)  # 0.64
    torch.testing.assert_close(_grad(loss, logprobs), -weight * adv * mask)
    assert ind["clipped"].tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    # with the TRL cap: min(sqrt 2, 5) = sqrt 2
    loss, _ = cispo(logprobs, old, adv, mask, ratio_level="sequence", ratio_cap=5.0)
    assert loss[0, 0].item() == pytest.approx(-math.sqrt(2.0) * -0.5)
    with pytest.raises(ValueError, match="ratio_level"):
        cispo(logprobs, old, adv, mask, ratio_level="group")


def test_registry_and_eps_validation():
    assert POLICY_LOSSES.names() == ["cispo", "gspo", "gspo_token", "ppo_clip"]
    for name in POLICY_LOSSES.names():
        with pytest.raises(ValueError):
            POLICY_LOSSES.get(name)(*_inputs([1.0], [1.0]), clip_eps_low=-0.1)
    with pytest.raises(ValueError, match="shape"):
        ppo_clip(*_inputs([1.0, 1.0], [1.0, 1.0])[:3], torch.ones(1, 3))


def test_extreme_ratio_with_zero_advantage_is_finite():
    logprobs, old, adv, mask = _inputs([1.0, 1.0], [0.0, 1.0])
    old = torch.tensor([[-200.0, 0.0]], dtype=torch.float64)  # rho = 200 on the first token
    for name in POLICY_LOSSES.names():
        loss, _ = POLICY_LOSSES.get(name)(logprobs, old, adv, mask)
        assert torch.isfinite(loss).all() and torch.isfinite(_grad(loss, logprobs)).all()


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "gspo_token", "cispo"])
@pytest.mark.parametrize("length", [3, 5])  # B == T and B != T
def test_one_advantage_per_row_is_broadcast_over_the_rows_tokens(name, length):
    """`[B]` advantages (what the sequence estimators return) with B == T were broadcast along T:
    row 0 took the advantages of rows 0, 1, 2 token by token; with B != T, a raw torch expand error."""
    gen = torch.Generator().manual_seed(2)
    logprobs = (-torch.rand(3, length, generator=gen, dtype=torch.float64) - 0.1).requires_grad_(True)
    old = logprobs.detach() - 0.05 * torch.rand(3, length, generator=gen, dtype=torch.float64)
    mask = torch.ones(3, length, dtype=torch.float64)
    mask[2, -1] = 0
    per_row = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    fn = POLICY_LOSSES.get(name)
    loss, _ = fn(logprobs, old, per_row, mask)
    expected, _ = fn(logprobs, old, per_row[:, None].expand(3, length), mask)
    assert torch.equal(loss, expected)
    torch.testing.assert_close(fn(logprobs, old, per_row[:, None], mask)[0], expected, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(3, 4), (1, 5), (5,), (), (3, 5, 1), (1, 1)])
def test_advantages_of_another_shape_are_refused_naming_the_shapes(shape):
    logprobs = torch.zeros(3, 5)
    with pytest.raises(ValueError, match=re.escape(f"got shape {shape} for logprobs (3, 5)")):
        ppo_clip(logprobs, logprobs, torch.ones(shape), torch.ones(3, 5))
