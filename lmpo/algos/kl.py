"""Per-token estimators of KL(pi_theta || pi_ref) from tokens sampled from pi_theta.

Schulman 2020, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html), with
``kappa = ref_logprobs - logprobs`` (the log of pi_ref / pi_theta at the sampled token).
Every estimator has the signature ``fn(logprobs, ref_logprobs) -> Tensor`` (same shape,
elementwise); masking is the caller's job. ``k3_ratio`` also takes ``old_logprobs`` (the
behaviour policy's), by keyword.
"""

from __future__ import annotations

from torch import Tensor

from lmpo.algos.registry import Registry

KL_ESTIMATORS = Registry("KL estimator")

# k3 exponentiates kappa; clamping it keeps exp() finite (exp(20) ~ 5e8) on tokens where the
# policy and the reference disagree wildly, e.g. -inf reference log-probs under top-k.
K3_KAPPA_CLAMP = 20.0


def _same_shape(logprobs: Tensor, ref_logprobs: Tensor) -> None:
    if ref_logprobs.shape != logprobs.shape:
        raise ValueError(f"ref_logprobs shape {tuple(ref_logprobs.shape)} != logprobs {tuple(logprobs.shape)} (the estimators are elementwise)")


@KL_ESTIMATORS.register("k1")
def k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``k1 = -kappa = log pi_theta - log pi_ref``: unbiased, can be negative."""
    _same_shape(logprobs, ref_logprobs)
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``k2 = kappa^2 / 2``: biased, low variance, always >= 0."""
    _same_shape(logprobs, ref_logprobs)
    return 0.5 * (ref_logprobs - logprobs).square()


@KL_ESTIMATORS.register("k3")
def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``k3 = exp(kappa) - 1 - kappa``: unbiased, always >= 0 (the GRPO loss term).

    kappa is clamped to [-20, 20] first, so the result is finite (and still >= 0);
    outside that range the value is that of the clamped kappa and the gradient is 0.
    """
    _same_shape(logprobs, ref_logprobs)
    kappa = (ref_logprobs - logprobs).clamp(-K3_KAPPA_CLAMP, K3_KAPPA_CLAMP)
    return kappa.exp() - 1.0 - kappa


# the log-ratio to the behaviour policy is clamped before exp, as in the policy losses
K3_RATIO_LOG_CLAMP = 20.0


@KL_ESTIMATORS.register("k3_ratio")
def k3_ratio(logprobs: Tensor, ref_logprobs: Tensor, *, old_logprobs: Tensor | None = None) -> Tensor:
    """Bias-corrected k3: ``r * k3`` with ``r = pi_theta / pi_old = exp(logprobs - old_logprobs)``.

    The tokens were sampled from pi_old, not pi_theta: weighting k3 by the importance ratio makes
    it an estimate of KL(pi_theta || pi_ref) under pi_theta's own distribution (TRL's
    ``use_bias_correction_kl``, which multiplies its k3 by the ratio ``coef_1``). Both factors
    carry gradient (the ratio is not detached). With ``pi_old = pi_theta`` the value is k3's and
    its gradient with respect to ``logprobs`` is ``-kappa = log pi_theta - log pi_ref`` (k1's
    value), where plain k3's is ``1 - exp(kappa)``. ``old_logprobs`` is required and treated as a constant; the log-ratio is
    clamped to [-20, 20] before exp.
    """
    if old_logprobs is None:
        raise ValueError("k3_ratio needs old_logprobs (the behaviour policy's log-probs)")
    if old_logprobs.shape != logprobs.shape:
        raise ValueError(f"old_logprobs shape {tuple(old_logprobs.shape)} != logprobs {tuple(logprobs.shape)}")
    log_ratio = (logprobs - old_logprobs.detach()).clamp(-K3_RATIO_LOG_CLAMP, K3_RATIO_LOG_CLAMP)
    return log_ratio.exp() * k3(logprobs, ref_logprobs)
