# lmpo exercise: k3
"""Planted mistake: no clamp on kappa, exp overflows."""
from torch import Tensor


def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    kappa = ref_logprobs - logprobs
    return kappa.exp() - 1 - kappa
