"""Pure tensor math for RL post-training: advantages, policy losses, aggregation, KL, token ops.

Tensors in, tensors out; each family is a `Registry` so configs can select methods by name.
Formulas and sources: /work/shared/ALGORITHMS.md.
"""

from lmpo.algos.advantages import (
    ADVANTAGES,
    dr_grpo,
    group_means,
    grpo,
    rloo,
    zero_variance_fraction,
    zero_variance_groups,
)
from lmpo.algos.aggregation import (
    AGGREGATIONS,
    masked_mean,
    seq_mean_token_mean,
    seq_mean_token_sum_norm,
    token_mean,
)
from lmpo.algos.kl import KL_ESTIMATORS, k1, k2, k3
from lmpo.algos.policy_loss import POLICY_LOSSES, cispo, gspo, gspo_token, ppo_clip
from lmpo.algos.registry import Registry, UnknownNameError
from lmpo.algos.token_ops import entropy_from_logits, masked_cross_entropy, token_logprobs

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "Registry",
    "UnknownNameError",
    "cispo",
    "dr_grpo",
    "entropy_from_logits",
    "group_means",
    "grpo",
    "gspo",
    "gspo_token",
    "k1",
    "k2",
    "k3",
    "masked_cross_entropy",
    "masked_mean",
    "ppo_clip",
    "rloo",
    "seq_mean_token_mean",
    "seq_mean_token_sum_norm",
    "token_logprobs",
    "token_mean",
    "zero_variance_fraction",
    "zero_variance_groups",
]
