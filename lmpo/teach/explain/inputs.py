"""The inputs of the worked examples: chosen by hand, shown on the pages as "given".

Everything derived from them is computed by `lmpo.algos`. Rows are sequences, cells tokens;
None marks a position the loss mask leaves out (padding, or a tool's output in a multi-turn row).
"""

from __future__ import annotations

import torch

# one group of G = 4 completions for one prompt (ALGORITHMS.md's worked example)
REWARDS = [0.9, 0.6, 0.2, 0.0]
FLAT_REWARDS = [1.0, 1.0, 1.0, 1.0]  # a group with no signal: every completion right
OLD_LOGPROBS = [[-0.8, -1.2, -0.5, -2.0], [-0.3, -1.5, None, None], [-1.0, -0.7, -1.1, None], [-0.6, None, None, None]]
# after an update: ratios inside and outside PPO's range, for both signs of the advantage
NEW_LOGPROBS = [[-0.58, -1.15, -0.6, -1.7], [-0.6, -1.35, None, None], [-0.9, -1.05, -1.08, None],
                [-0.65, None, None, None]]
# GSPO's range is ~1e-3 wide, so its example moves the policy that little
NEW_LOGPROBS_GSPO = [[-0.7995, -1.1994, -0.4996, -1.9995], [-0.3002, -1.4999, None, None],
                     [-1.0004, -0.7005, -1.1003, None], [-0.5999, None, None, None]]
REF_LOGPROBS = [[-0.9, -1.1, -0.6, -1.8], [-0.4, -1.3, None, None], [-0.9, -0.8, -1.0, None], [-0.5, None, None, None]]
# DAPO: completion lengths for the soft overlong penalty (tokens)
LENGTHS = [7, 9, 11, 12]

# PPO: two trajectories; the first is multi-turn, with two tool-output tokens (mask 0) inside it
PPO_REWARDS = [1.0, 0.0]
PPO_OLD_LOGPROBS = [[-0.5, -0.9, None, None, -0.4, -1.1], [-0.7, -1.3, -0.6, -0.8, None, None]]
PPO_NEW_LOGPROBS = [[-0.25, -1.0, None, None, -0.35, -0.8], [-1.0, -1.2, -0.58, -1.05, None, None]]
PPO_REF_LOGPROBS = [[-0.6, -0.8, None, None, -0.5, -1.0], [-0.9, -1.2, -0.5, -0.9, None, None]]
PPO_OLD_VALUES = [[0.4, 0.5, None, None, 0.6, 0.8], [0.3, 0.2, 0.1, 0.1, None, None]]
PPO_NEW_VALUES = [[0.7, 0.7, None, None, 0.65, 0.75], [0.2, 0.3, 0.05, -0.1, None, None]]

# preference pairs: summed log-probs of the chosen (w) and rejected (l) completions
CHOSEN_LOGPS = [-12.0, -20.5, -8.0]
REJECTED_LOGPS = [-14.0, -17.0, -15.5]
REF_CHOSEN_LOGPS = [-13.0, -21.0, -9.0]
REF_REJECTED_LOGPS = [-13.5, -18.0, -14.0]
CHOSEN_LENGTHS = [6, 10, 5]
REJECTED_LENGTHS = [7, 9, 8]

# reward model: scores of the chosen and rejected answers of three pairs
CHOSEN_SCORES = [1.2, -0.3, 0.8]
REJECTED_SCORES = [0.4, 0.5, -1.1]
RM_MARGIN_DEMO = 1.0  # a margin m and centering c to show what each option changes
RM_CENTER_DEMO = 0.01  # Eisenstein et al.'s value

DUAL_CLIP_DEMO = 3.0  # dual-clip's c, as in Ye et al. 2020 (not in any preset)

# KL: a policy and a reference over a vocabulary of four tokens (logits)
POLICY_LOGITS = [2.0, 1.0, 0.5, -1.0]
REFERENCE_LOGITS = [1.5, 1.2, 0.0, 0.3]


# float64, so that the inputs print as typed (0.05, not 0.0500001); the formulas are the same in fp32
DTYPE = torch.float64


def tensor(rows) -> torch.Tensor:
    """Rows (or a flat list) as float64, masked cells as 0."""
    if rows and isinstance(rows[0], list):
        return torch.tensor([[0.0 if c is None else c for c in row] for row in rows], dtype=DTYPE)
    return torch.tensor([float(c) for c in rows], dtype=DTYPE)


def mask_of(rows) -> torch.Tensor:
    """1.0 where a cell is given, 0.0 where it is None."""
    return torch.tensor([[0.0 if c is None else 1.0 for c in row] for row in rows], dtype=DTYPE)
