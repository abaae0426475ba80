"""Claim 6: the original GRPO aggregation (sequence mean of token means) biases length."""

from __future__ import annotations

import torch

from lmpo.algos import AGGREGATIONS, POLICY_LOSSES
from lmpo.teach.factcheck import plots
from lmpo.teach.factcheck.context import Context
from lmpo.teach.factcheck.core import DEPENDS, FAILS, HOLDS, Claim, Measured, Verdict

MAX_LEN = 12
NAMES = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")


def per_token_gradients(aggregation: str, advantage: float = -1.0) -> list[float]:
    """|∂loss/∂log π| of one token of a completion of length L = 1 … MAX_LEN, all with the same
    advantage, on-policy, through lmpo's ppo_clip and the named aggregation."""
    lengths = torch.arange(1, MAX_LEN + 1)
    mask = (torch.arange(MAX_LEN)[None, :] < lengths[:, None]).double()
    logprobs = torch.full((MAX_LEN, MAX_LEN), -1.0, dtype=torch.float64, requires_grad=True)
    advantages = torch.full((MAX_LEN, 1), advantage, dtype=torch.float64)
    loss, _ = POLICY_LOSSES.get("ppo_clip")(logprobs, logprobs.detach(), advantages, mask)
    (grad,) = torch.autograd.grad(AGGREGATIONS.get(aggregation)(loss, mask, max_len=MAX_LEN), logprobs)
    return grad[:, 0].abs().tolist()


def _measure(ctx: Context) -> Measured:
    grads = {name: per_token_gradients(name) for name in NAMES}
    values = {f"spread_{name}": g[0] / g[-1] for name, g in grads.items()}
    values.update({"short_token": grads[NAMES[0]][0], "long_token": grads[NAMES[0]][-1], "max_len": MAX_LEN,
                   "long_sequence_total": grads[NAMES[0]][-1] * MAX_LEN, "short_sequence_total": grads[NAMES[0]][0]})
    fig, (ax,) = plots.figure(1, width=5.5)
    plots.lines(ax, {name: (range(1, MAX_LEN + 1), g) for name, g in grads.items()},
                "gradient on each token, same advantage", "completion length L", "|∂loss/∂log π(token)|", marker="o")
    ax.set_yscale("log")
    return Measured(values, plots.png(fig))


def _judge(v: dict, limits: dict) -> Verdict:
    neutral = all(abs(v[f"spread_{name}"] - 1) <= limits["tol"] for name in NAMES[1:])
    biased = v["spread_seq_mean_token_mean"] > 1 + limits["margin"]
    if biased and neutral:
        return Verdict(HOLDS, "biased")
    if not biased:
        return Verdict(FAILS, "not_biased")
    return Verdict(DEPENDS, "all_biased")


LENGTH_BIAS = Claim(
    name="length_bias_aggregation", fast=True,
    papers=("Understanding R1-Zero-Like Training (Dr. GRPO), Liu et al. 2025, arXiv:2503.20783",
            "DAPO (token_mean), Yu et al. 2025, arXiv:2503.14476"),
    text="Averaging token losses per sequence, then over sequences (the original GRPO's aggregation), biases "
         "length: each token of a long completion gets less gradient than a token of a short one.",
    criterion="Autograd through lmpo's ppo_clip and each aggregation for completions of length 1–{max_len:g} with "
              "the same advantage. Spread = per-token gradient at L = 1 over that at L = {max_len:g}. Holds if "
              "seq_mean_token_mean's spread exceeds 1 + {margin:g} while token_mean's and "
              "seq_mean_token_sum_norm's are 1 within {tol:g}.",
    summary="per-token gradient spread (L=1 / L={max_len}): seq_mean_token_mean {spread_seq_mean_token_mean:.1f}×, "
            "token_mean {spread_token_mean:.2f}×, seq_mean_token_sum_norm {spread_seq_mean_token_sum_norm:.2f}×",
    notes={"biased": "Under seq_mean_token_mean every sequence gets the same total push, spread over its tokens: a "
                     "token of a 1-token answer gets {short_token:.4f}, one of a {max_len}-token answer "
                     "{long_token:.4f}. A long wrong answer is punished less per token, a short right one rewarded "
                     "more, so wrong answers drift longer. token_mean and Dr. GRPO's constant normaliser weigh "
                     "every token alike.",
           "not_biased": "seq_mean_token_mean weighted tokens of every length alike (spread "
                         "{spread_seq_mean_token_mean:.3f}).",
           "all_biased": "Every aggregation weighted tokens by length."},
    limits={"margin": 0.5, "tol": 1e-9, "max_len": MAX_LEN},
    measure=_measure, judge=_judge,
)

CLAIMS = [LENGTH_BIAS]
