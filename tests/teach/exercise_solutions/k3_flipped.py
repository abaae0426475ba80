# lmpo exercise: k3
"""Planted mistake: kappa = log pi_theta - log pi_ref (the sign flipped)."""
from torch import Tensor


def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    kappa = (logprobs - ref_logprobs).clamp(-20.0, 20.0)
    return kappa.exp() - 1 - kappa
