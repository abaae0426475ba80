# lmpo exercise: k3
"""A correct solution: kappa = ref - policy, clamped to [-20, 20]."""
from torch import Tensor


def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    kappa = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return kappa.exp() - 1 - kappa
