"""Claim 12: a learned reward model can be hacked, and a missing-EOS penalty closes one hole."""

from __future__ import annotations

from lmpo.teach.factcheck import plots
from lmpo.teach.factcheck.context import Context
from lmpo.teach.factcheck.core import DEPENDS, FAILS, HOLDS, Claim, Measured, Verdict
from lmpo.teach.factcheck.runs import head_mean, rl_run, tail_mean

RM_PAIRS = 2000
"""Pairs the reward model trains on (one epoch). The pipeline's ppo_rm stage uses 10,000 x 3 epochs;
the README records PPO hacking a 2000-pair reward model with sorted wrong digits."""
HACK_STEPS = 150
HACK_BETA = 0.0
"""No KL leash (as many recent recipes): measured, the grpo preset's β = 0.04 held the hack off for 150 steps."""
PROBE_PROBLEMS = 200


def _reward_model(ctx: Context) -> str:
    from lmpo.trainers.reward_model import train_reward_model

    def train():
        cfg = ctx.stage("rm", "reward_model", "ppo_rm", pairs=RM_PAIRS, epochs=1, save_every=0)
        with ctx.quiet("reward_model"):
            return train_reward_model(cfg)
    return ctx.once("reward_model", train)


def eos_probe(ctx: Context, rm_dir: str, penalty: float) -> dict[str, float]:
    """On held-out problems: how often the reward model scores the right answer followed by
    rambling without EOS (what a length cap cuts off) above the right answer that ends with EOS;
    with `penalty` subtracted from unterminated completions as `missing_eos_penalty` does."""
    from lmpo.envs import make_task
    from lmpo.rollout.reward_runner import RewardRunner

    task = make_task(ctx.task)
    problems = task.heldout_problems(PROBE_PROBLEMS)
    width = ctx.stage("rl", "eos_probe").max_new_tokens
    rambles = [(p.answer + p.answer[-1] * width)[:width] for p in problems]
    runner = RewardRunner.from_spec("rm=1.0", rm_dir, 0)
    try:
        right = runner.score(task, problems, [p.answer for p in problems], [True] * len(problems)).components["rm"]
        ramble = runner.score(task, problems, rambles, [False] * len(problems)).components["rm"]
    finally:
        runner.close()
    return {"open": float((ramble > right).float().mean()),
            "closed": float((ramble - penalty > right).float().mean()),
            "ramble_score": float(ramble.mean()), "right_score": float(right.mean())}


def _hacking(ctx: Context) -> Measured:
    from lmpo.reports.doctor import Thresholds, check_hacking
    from lmpo.trainers.presets import PPO_RM_SETTINGS

    rm = _reward_model(ctx)
    penalty = float(PPO_RM_SETTINGS["missing_eos_penalty"])
    values = {"rm_pairs": RM_PAIRS, "rm_accuracy": rm.accuracy, "penalty": penalty, "steps": HACK_STEPS,
              "acc_start": ctx.start().sft_accuracy}
    scores, accuracies = {}, {}
    for tag, pen in (("plain", 0.0), ("eos", penalty)):
        run = rl_run(ctx, f"rm_reward_{tag}", "grpo", rewards="rm=1.0", reward_model=rm.model_dir,
                     reward_timeout=0, missing_eos_penalty=pen, steps=HACK_STEPS, beta=HACK_BETA, eval_every=50)
        rm_reward, accuracy = run.series("reward_rm"), run.series("accuracy")
        values.update({f"{tag}_hacked": int(bool(check_hacking(run.rows, Thresholds()))),
                       f"{tag}_rm_first": head_mean(rm_reward, 0.1), f"{tag}_rm_last": tail_mean(rm_reward, 0.1),
                       f"{tag}_acc_first": head_mean(accuracy, 0.1), f"{tag}_acc_last": tail_mean(accuracy, 0.1),
                       f"{tag}_truncated": tail_mean(run.series("truncated_frac")),
                       f"{tag}_heldout_first": run.evals()[0], f"{tag}_heldout_last": run.evals()[-1]})
        scores[f"missing-EOS penalty {pen:g}"] = (range(1, len(rm_reward) + 1), plots.rolling(rm_reward))
        accuracies[f"missing-EOS penalty {pen:g}"] = (range(1, len(accuracy) + 1), plots.rolling(accuracy))
    probe = eos_probe(ctx, rm.model_dir, penalty)
    values.update({f"probe_{k}": v for k, v in probe.items()})
    fig, (left, right) = plots.figure(2)
    plots.lines(left, scores, "reward model's score (what GRPO maximises)", "step", "5-step mean")
    plots.lines(right, accuracies, "verifier: right answers (same samples)", "step", "5-step mean")
    return Measured(values, plots.png(fig))


def _judge_hacking(v: dict, limits: dict) -> Verdict:
    if not v["plain_hacked"]:
        return Verdict(DEPENDS, "not_hacked")
    if v["probe_open"] <= limits["share"]:
        return Verdict(DEPENDS, "no_eos_hole")
    if v["probe_closed"] > limits["share"]:
        return Verdict(FAILS, "still_open")
    return Verdict(HOLDS, "hacked_elsewhere" if v["eos_hacked"] else "closed")


HACKING = Claim(
    name="reward_model_hacking", fast=False,
    papers=("Scaling Laws for Reward Model Overoptimization, Gao et al. 2022, arXiv:2210.10760",
            "InstructGPT, Ouyang et al. 2022, arXiv:2203.02155 (missing-EOS penalty: TRL's missing_eos_penalty)"),
    text="A learned reward model can be hacked, and a penalty on completions that never end (missing EOS) closes "
         "one hole.",
    criterion="A reward model (lmpo's trainer, {rm_pairs:,.0f} pairs, 1 epoch), then GRPO (β = {beta:g}) from the SFT start "
              "on its score alone, {steps:g} steps, without and with the missing-EOS penalty. Hacked = lmpo's doctor "
              "finds reward_hacking (the reward rises ≥ 0.1 while held-out accuracy falls ≥ 5 points). The hole = "
              "the share of 200 held-out problems where the model scores the right answer followed by rambling "
              "without EOS above the right answer with EOS. Holds if the plain run is hacked, the hole is open "
              "(> {share:g}) and the penalty closes it (≤ {share:g}).",
    summary="RM {rm_accuracy:.1%} pairwise; plain: RM score {plain_rm_first:.2f} → {plain_rm_last:.2f}, verifier "
            "{plain_acc_first:.0%} → {plain_acc_last:.0%}, held-out {plain_heldout_first:.1%} → "
            "{plain_heldout_last:.1%}; cut off without EOS {plain_truncated:.0%}; with "
            "penalty: held-out → {eos_heldout_last:.1%}, cut off {eos_truncated:.0%}; rambling preferred on "
            "{probe_open:.0%} of problems, {probe_closed:.0%} with the penalty",
    notes={"closed": "Optimising the reward model's score raised it from {plain_rm_first:.2f} to {plain_rm_last:.2f} "
                     "while the verifier's accuracy on the same samples fell from {plain_acc_first:.0%} to "
                     "{plain_acc_last:.0%}, held-out accuracy from {plain_heldout_first:.1%} to {plain_heldout_last:.1%}; at "
                     "the end {plain_truncated:.0%} of its completions rambled to the length cap. The reward model "
                     "prefers such rambling to the right answer on {probe_open:.0%} of problems; a penalty of "
                     "{penalty:g} closes that hole ({probe_closed:.0%}; cut off: {eos_truncated:.0%}), and the "
                     "penalised run was not flagged (held-out {eos_heldout_last:.1%}).",
           "hacked_elsewhere": "Optimising the reward model's score raised it from {plain_rm_first:.2f} to "
                               "{plain_rm_last:.2f} while the verifier's accuracy on the same samples fell from "
                               "{plain_acc_first:.0%} to {plain_acc_last:.0%}. The penalty of {penalty:g} closes the "
                               "no-EOS hole (rambling preferred on {probe_open:.0%} of problems, {probe_closed:.0%} "
                               "with it), but the penalised run was hacked too, through answers that end well and "
                               "are wrong (truncated: {eos_truncated:.0%}): it closes one hole, not all.",
           "not_hacked": "Not hacked within {steps:g} steps (doctor: no reward_hacking finding); a bigger budget "
                         "may be needed.",
           "no_eos_hole": "The policy hacked the reward model, but this reward model never prefers unterminated "
                          "rambling ({probe_open:.0%}): the penalty has no hole to close here.",
           "still_open": "Even with the penalty, rambling scores above the right answer on {probe_closed:.0%} of "
                         "problems."},
    limits={"share": 0.0, "rm_pairs": RM_PAIRS, "steps": HACK_STEPS, "beta": HACK_BETA},
    measure=_hacking, judge=_judge_hacking,
)

CLAIMS = [HACKING]
