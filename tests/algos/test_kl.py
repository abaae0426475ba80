import math

import pytest
import torch

from lmpo.algos import KL_ESTIMATORS, k1, k2, k3, k3_ratio


def test_hand_values():
    logprobs = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.5, -1.0, -0.5])
    # kappa = ref - logprobs = [-0.5, 1.0, 0.0]
    torch.testing.assert_close(k1(logprobs, ref), torch.tensor([0.5, -1.0, 0.0]))
    torch.testing.assert_close(k2(logprobs, ref), torch.tensor([0.125, 0.5, 0.0]))
    expected_k3 = torch.tensor([math.exp(-0.5) - 1 + 0.5, math.e - 2.0, 0.0])
    torch.testing.assert_close(k3(logprobs, ref), expected_k3)


def test_k3_nonnegative_and_finite_for_extreme_values():
    gen = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(1000, generator=gen) * 30
    ref = -torch.rand(1000, generator=gen) * 30
    assert (k3(logprobs, ref) >= 0).all()
    extreme = k3(torch.tensor([0.0, -500.0, 0.0]), torch.tensor([-math.inf, 0.0, -500.0]))
    assert torch.isfinite(extreme).all() and (extreme >= 0).all()
    # kappa = 500 is clamped to 20
    assert extreme[1].item() == pytest.approx(math.exp(20) - 21, rel=1e-6)


def test_k3_gradient():
    logprobs = torch.tensor([-1.0, -0.2], requires_grad=True)
    ref = torch.tensor([-0.3, -0.9])
    k3(logprobs, ref).sum().backward()
    kappa = ref - logprobs.detach()
    # d/dlogprobs (e^kappa - 1 - kappa) = -(e^kappa - 1)
    torch.testing.assert_close(logprobs.grad, -(kappa.exp() - 1))


def test_monte_carlo_estimates_of_true_kl():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)  # pi_theta (sampling)
    q = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)  # pi_ref
    true_kl = (p * (p / q).log()).sum().item()
    gen = torch.Generator().manual_seed(0)
    samples = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    logprobs, ref = p.log()[samples], q.log()[samples]
    assert k1(logprobs, ref).mean().item() == pytest.approx(true_kl, rel=0.03)
    assert k3(logprobs, ref).mean().item() == pytest.approx(true_kl, rel=0.03)
    # k1 is negative on some samples, k3 never
    assert (k1(logprobs, ref) < 0).any() and (k3(logprobs, ref) >= 0).all()


def test_registry():
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3", "k3_ratio"]
    assert KL_ESTIMATORS.get("k3") is k3
    with pytest.raises(KeyError, match="choose one of: k1, k2, k3, k3_ratio"):
        KL_ESTIMATORS.get("k4")


def test_k3_ratio_hand_values():
    # kappa = ref - logprobs = [-0.5, 1.0]; log r = logprobs - old = [0.2, -0.1]
    logprobs = torch.tensor([-1.0, -2.0], dtype=torch.float64)
    ref = torch.tensor([-1.5, -1.0], dtype=torch.float64)
    old = torch.tensor([-1.2, -1.9], dtype=torch.float64)
    # k3 = [e^-0.5 - 1 + 0.5, e - 2] = [0.1065307, 0.7182818]
    # r  = [e^0.2, e^-0.1] = [1.2214028, 0.9048374]
    # r*k3 = [0.1301168, 0.6499283]
    out = k3_ratio(logprobs, ref, old_logprobs=old)
    torch.testing.assert_close(out, torch.tensor([0.1301168, 0.6499283], dtype=torch.float64), atol=1e-7, rtol=0)
    # float64 reference straight from the formula
    expected = [math.exp(lp - o) * (math.exp(r - lp) - 1 - (r - lp))
                for lp, r, o in zip(logprobs.tolist(), ref.tolist(), old.tolist())]
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=1e-12)


def test_k3_ratio_on_policy_value_and_gradient():
    # pi_old = pi_theta: the value is k3's, the gradient is -kappa (k1's value), not 1 - e^kappa
    gen = torch.Generator().manual_seed(1)
    logprobs = (-3 * torch.rand(6, generator=gen, dtype=torch.float64)).requires_grad_(True)
    ref = -3 * torch.rand(6, generator=gen, dtype=torch.float64)
    out = k3_ratio(logprobs, ref, old_logprobs=logprobs.detach())
    torch.testing.assert_close(out, k3(logprobs, ref))
    out.sum().backward()
    torch.testing.assert_close(logprobs.grad, (logprobs - ref).detach())
    # the ratio carries gradient: off-policy, d/dlogp (r*k3) = r*k3 + r*(1 - e^kappa)
    lp = logprobs.detach().clone().requires_grad_(True)
    old = lp.detach() - 0.3
    k3_ratio(lp, ref, old_logprobs=old).sum().backward()
    kappa, r = (ref - lp).detach(), math.exp(0.3)
    torch.testing.assert_close(lp.grad, r * (kappa.exp() - 1 - kappa) + r * (1 - kappa.exp()))


def test_k3_ratio_needs_old_logprobs():
    with pytest.raises(ValueError, match="old_logprobs"):
        k3_ratio(torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match="shape"):
        k3_ratio(torch.zeros(2), torch.zeros(2), old_logprobs=torch.zeros(3))


@pytest.mark.parametrize("name", ["k1", "k2", "k3", "k3_ratio"])
@pytest.mark.parametrize("shapes", [((4,), (4, 1)), ((2, 4), (4,))])
def test_estimators_refuse_mismatched_shapes(name, shapes):
    # elementwise estimators: a [T] vs [T, 1] pair used to broadcast to a [T, T] result
    logprobs, ref = torch.randn(shapes[0]), torch.randn(shapes[1])
    with pytest.raises(ValueError, match=r"ref_logprobs shape .* != logprobs"):
        KL_ESTIMATORS.get(name)(logprobs, ref, **({"old_logprobs": logprobs} if name == "k3_ratio" else {}))
