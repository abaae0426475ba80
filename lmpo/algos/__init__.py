"""Pure tensor math for RL post-training: sequence and token advantage estimators, policy
losses, loss aggregation, KL estimators and adaptive KL control, the value loss, DAPO's batch
filters, token ops (log-probs, entropy, masked cross-entropy), preference losses (DPO, cDPO,
IPO, SimPO, robust, hinge, EXO, NCA, BCO, SPPO, AOT, APO, DiscoPOP, SFT, and weighted sums of
them; KTO and ORPO as functions), the Bradley–Terry reward-model loss, and the sampler/trainer mismatch
correction (truncated importance sampling, mismatch KL).

Tensors in, tensors out; each family is a `Registry` so configs can select methods by name.
Formulas and sources: ALGORITHMS.md in the project's shared notes.
"""

from lmpo.algos.advantages import (
    ADVANTAGES,
    advantages_of_valid,
    dr_grpo,
    group_means,
    grpo,
    rloo,
    whiten_sequences,
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
from lmpo.algos.kl import KL_ESTIMATORS, k1, k2, k3, k3_ratio
from lmpo.algos.policy_loss import POLICY_LOSSES, cispo, gspo, gspo_token, ppo_clip
from lmpo.algos.registry import Registry, UnknownNameError
from lmpo.algos.token_ops import entropy_from_logits, masked_cross_entropy, token_logprobs
from lmpo.algos.batch_filters import groups_with_signal, overlong_penalty, truncation_mask
from lmpo.algos.kl_control import adaptive_kl_coef
from lmpo.algos.token_advantages import (
    TOKEN_ADVANTAGES,
    discounted_returns,
    gae,
    masked_whiten,
    reinforce_pp,
    token_rewards,
)
from lmpo.algos.value_loss import clipped_value_loss
from lmpo.algos.preference import PREFERENCE_LOSSES, cdpo, dpo, ipo, simpo
from lmpo.algos.preference_pairs import bco_pair, exo_pair, hinge, nca_pair, robust, sft, sppo_hard
from lmpo.algos.preference_anchored import aot, aot_pair, apo_down, apo_zero, discopop
from lmpo.algos.preference_mix import parse_loss_weights, weighted_loss
from lmpo.algos.preference_unpaired import kto, kto_reference_point, odds_ratio_loss, orpo
from lmpo.algos.reward_model import bradley_terry_loss, gather_last, last_token_index
from lmpo.algos.sampler_mismatch import MismatchKL, mismatch_kl, tis_clipped, truncated_importance_weights

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "advantages_of_valid",
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
    "k3_ratio",
    "whiten_sequences",
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
    "TOKEN_ADVANTAGES",
    "adaptive_kl_coef",
    "clipped_value_loss",
    "discounted_returns",
    "gae",
    "groups_with_signal",
    "masked_whiten",
    "overlong_penalty",
    "reinforce_pp",
    "token_rewards",
    "truncation_mask",
    "PREFERENCE_LOSSES",
    "bradley_terry_loss",
    "cdpo",
    "dpo",
    "gather_last",
    "ipo",
    "last_token_index",
    "simpo",
    "aot",
    "aot_pair",
    "apo_down",
    "apo_zero",
    "bco_pair",
    "discopop",
    "exo_pair",
    "hinge",
    "kto",
    "kto_reference_point",
    "nca_pair",
    "odds_ratio_loss",
    "orpo",
    "parse_loss_weights",
    "robust",
    "sft",
    "sppo_hard",
    "weighted_loss",
    "MismatchKL",
    "mismatch_kl",
    "tis_clipped",
    "truncated_importance_weights",
]
