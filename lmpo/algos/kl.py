"""Per-token estimators of KL(pi_theta || pi_ref) from tokens sampled from pi_theta.

Schulman 2020, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html), with
``kappa = ref_logprobs - logprobs`` (the log of pi_ref / pi_theta at the sampled token).
Every estimator has the signature ``fn(logprobs, ref_logprobs) -> Tensor`` (same shape,
elementwise); masking is the caller's job.
"""

from __future__ import annotations

from torch import Tensor

from lmpo.algos.registry import Registry

KL_ESTIMATORS = Registry("KL estimator")

# k3 exponentiates kappa; clamping it keeps exp() finite (exp(20) ~ 5e8) on tokens where the
# policy and the reference disagree wildly, e.g. -inf reference log-probs under top-k.
K3_KAPPA_CLAMP = 20.0


@KL_ESTIMATORS.register("k1")
def k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``k1 = -kappa = log pi_theta - log pi_ref``: unbiased, can be negative."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``k2 = kappa^2 / 2``: biased, low variance, always >= 0."""
    return 0.5 * (ref_logprobs - logprobs).square()


@KL_ESTIMATORS.register("k3")
def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``k3 = exp(kappa) - 1 - kappa``: unbiased, always >= 0 (the GRPO loss term).

    kappa is clamped to [-20, 20] first, so the result is finite (and still >= 0);
    outside that range the value is that of the clamped kappa and the gradient is 0.
    """
    kappa = (ref_logprobs - logprobs).clamp(-K3_KAPPA_CLAMP, K3_KAPPA_CLAMP)
    return kappa.exp() - 1.0 - kappa
