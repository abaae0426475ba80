"""The doctor: read a run's metrics and say in plain words what limits training.

Each check is a pure function over metrics rows (`metrics.jsonl`, one dict per step) that returns
findings: the metric, its value, the threshold it crossed, what that means and what to change.
`lmpo.reports.doctor_runs.diagnose_run(path)` reads a stage directory or every stage of a
pipeline directory.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial
from typing import Callable

from .doctor_base import Finding, Thresholds, rl_rows
from .doctor_base import ends as _ends, finite_points as _points, finite_values as _values
from .doctor_base import mean as _mean, pct as _pct, plural as _plural
from .doctor_faults import check_decline, check_faults, check_nonfinite, env_errors_first
from .doctor_quality import (beyond_noise, check_below_chance, check_eos, check_heldout_fall, counted, eval_count,
                             format_low, noise_bar)
from .doctor_remedies import PAIR_TRAINERS, for_trainer
from .metrics import Row, as_float


# lmpo.algos' ADVANTAGES (named here so that the doctor runs without torch; a test keeps them equal)
GROUP_ADVANTAGES = ("grpo", "dr_grpo", "rloo")


def check_signal(rows: list[Row], th: Thresholds, group_size: int | None = None,
                 advantage: str | None = None, rewards: str | None = None) -> list[Finding]:
    """No signal, and why: too sparse (rarely right), too easy (always right), or neither.
    `group_size` (from the run's config) turns the starting accuracy into an estimated pass@k.
    `advantage` (the run's estimator): an all-equal group gives no gradient only where the
    advantage compares completions within their group (grpo, dr_grpo, rloo); under gae or
    reinforce_pp the critic's values or the batch's baseline still give one. `rewards` (the run's
    --rewards): where it sums more than one function, or the environment rewards turns itself
    (`reward_env`), partial credit is not a remedy to suggest."""
    zero_var = _values(rows, "zero_var_frac")
    acc = _points(rows, "accuracy") or _points(rows, "reward_mean")
    if not zero_var or not acc:
        return []
    findings = []
    values = [v for _, v in acc]
    k = max(1, len(values) // 10)
    start_acc = _mean(values[:k])
    first_step, first_acc = acc[0]
    late = _mean(values[-k:])
    # Step 1 samples the starting model. A policy right that often at first and almost never
    # by the end was broken by its updates: more samples per group would not help.
    collapsed = first_acc >= th.decline and late <= first_acc * th.collapse_ratio
    group = group_size
    pass_k = 1 - (1 - start_acc) ** group if group else None
    pass_text = (f"; the sampled accuracy is {_pct(start_acc)} over the first {_plural(k, 'step')}, an estimated "
                 f"pass@{group} of {_pct(pass_k)} (independent samples assumed)") if pass_k is not None else ""
    z = _mean(zero_var)
    if z >= th.zero_var_frac and collapsed:
        findings.append(Finding("no_signal", "warning", "zero_var_frac", _pct(z), f">= {_pct(th.zero_var_frac)}",
                                f"{_pct(z)} of groups had all-equal rewards because the policy collapsed: its sampled "
                                f"accuracy was {_pct(first_acc)} at step {first_step} (the starting model) and "
                                f"{_pct(late)} over the last {_plural(k, 'step')}",
                                "lower --lr (the updates destroyed what the starting model could do), use "
                                "--collapse_guard true, raise --beta"))
        return findings
    if z >= th.zero_var_frac and advantage is not None and advantage not in GROUP_ADVANTAGES:
        findings.append(Finding("no_signal", "note", "zero_var_frac", _pct(z), f">= {_pct(th.zero_var_frac)}",
                                f"{_pct(z)} of groups had all-equal rewards; under {advantage} advantages they still "
                                f"get a gradient (from the critic's values or the batch's baseline, not from a "
                                f"comparison within the group), but their rewards say little{pass_text}",
                                "sample hotter (--temperature), or make the task's difficulty match the model"))
    elif z >= th.zero_var_frac:
        findings.append(Finding("no_signal", "warning", "zero_var_frac", _pct(z), f">= {_pct(th.zero_var_frac)}",
                                f"{_pct(z)} of groups had all-equal rewards and gave no gradient{pass_text}",
                                "raise --group_size (more chances of one right answer per group), sample hotter "
                                "(--temperature), or make the task's difficulty match the model"))
    flat = _ends(zero_var, 0.1)[0]
    flat_text = f"; {_pct(flat)} of the first steps' groups had all-equal rewards"
    if flat < th.flat_start:
        return findings
    if start_acc <= th.sparse_accuracy:
        several = rewards is not None and len([r for r in rewards.split(",") if r.strip()]) > 1
        env = bool(_values(rows, "reward_env"))  # the environment rewards turns too (an agent task's own)
        credit = ("" if several or env else "add partial credit (--rewards correct=1.0,format=0.1) or ")
        givers = " and ".join([f"the run's --rewards {rewards}"] * several
                              + ["the environment's own rewards (reward_env)"] * env)
        already = (f" ({givers} already give partial credit; it did not tell a group's "
                   f"completions apart)" if givers else "")
        findings.append(Finding("reward_sparse", "warning", "accuracy (first steps)", _pct(start_acc),
                                f"<= {_pct(th.sparse_accuracy)}",
                                f"the model is rarely right at the start, so the rewards of a group are mostly all "
                                f"equal{flat_text}",
                                "start from a model trained longer (in `lmpo pipeline`: --cpt.steps, --sft.epochs), "
                                f"use easier problems, {credit}a larger --group_size{already}"))
    elif start_acc >= th.easy_accuracy:
        findings.append(Finding("reward_easy", "warning", "accuracy (first steps)", _pct(start_acc),
                                f">= {_pct(th.easy_accuracy)}",
                                f"the model is already right almost always, so groups rarely differ{flat_text}",
                                "use harder problems (task options) or stop after SFT"))
    return findings


def check_entropy(rows: list[Row], th: Thresholds) -> list[Finding]:
    ent = _values(rows, "entropy")
    if len(ent) < 4:
        return []
    start, end = _ends(ent)
    if start > 0 and end / start <= th.entropy_ratio and end <= th.entropy_floor:
        # entropy is never negative; the trainer's float error logs -2e-6, shown as "-0.000"
        start, end = max(start, 0.0), max(end, 0.0)
        return [Finding("entropy_collapse", "warning", "entropy", f"{start:.3f} → {end:.3f} nats/token",
                        f"final <= {th.entropy_ratio:g} × start and <= {th.entropy_floor:g}",
                        "the policy became (nearly) deterministic: sampling stops exploring and groups stop differing",
                        "lower --lr (the evidence note: 3e-4 lost 22 points where 1e-4 gained), raise --beta, "
                        "or narrow the clip range")]
    return []


def check_kl(rows: list[Row], th: Thresholds) -> list[Finding]:
    kl = _values(rows, "kl")
    if not kl:
        return []
    end = _ends(kl)[1]
    if end > th.kl:
        return [Finding("kl_runaway", "warning", "kl", f"{end:.3f} nats/token (last tenth)", f"> {th.kl:g}",
                        "the policy drifted far from its reference", "raise --beta, lower --lr, or train fewer steps")]
    return []


# an agent episode cut off by a limit: what the limit was, and what lifts it
_CUT_OFF = {
    "turn_length": ("the model's turns hit the per-turn cap (--max_turn_tokens, or the task's own) before their "
                    "end-of-turn token: unterminated, so graded wrong",
                    "raise --max_turn_tokens (the budget --max_new_tokens caps it too), or teach shorter turns "
                    "in SFT"),
    "token_budget": ("episodes ran out of their token budget (--max_new_tokens counts every model, template and "
                     "tool-output token after the prompt) before an answer",
                     "raise --max_new_tokens (and --eval_max_new_tokens), or lower --max_turns"),
    "context_overflow": ("the conversation outgrew the model's context before an answer",
                         "lower --max_turns or --max_new_tokens, shorten the tools' output, or use a model with a "
                         "longer context"),
}


def _truncation_cause(rows: list[Row]) -> tuple[str, str]:
    """(what happened, what to do) for truncated completions: for an agent run, by the ending
    that cut most episodes off in the last tenth (raising --max_new_tokens does not lift a
    per-turn cap); for a single-turn run, the completion limit."""
    # a single-turn run logs `termination_token_budget` too (its completions hit --max_new_tokens);
    # only a multi-turn one has turns (`turns_mean`) whose caps may be what cut it
    multi_turn = any("turns_mean" in row for row in rows)
    shares = {ending: _ends(v)[1] for ending in _CUT_OFF if multi_turn and (v := _values(rows, f"termination_{ending}"))}
    if shares and max(shares.values()) > 0:
        return _CUT_OFF[max(shares, key=shares.get)]
    return ("completions hit --max_new_tokens before EOS: they are unterminated, so graded wrong, and their "
            "length gradient is biased",
            "raise --max_new_tokens (and --eval_max_new_tokens), or penalise length (--overlong penalty, "
            "--missing_eos_penalty)")


def _cut_short(rows: list[Row], th: Thresholds) -> list[Finding]:
    """Agent episodes that ended at the turn limit or the context, not on an answer: by default
    their tokens are masked (trained on neither way), and the truncation share does not count
    them, since each turn there ended."""
    remedies = {"max_turns": "raise --max_turns (or the task's own), or train them with "
                             "--termination_policy max_turns=penalise",
                "context_overflow": _CUT_OFF["context_overflow"][1]}
    shares = {e: _ends(v)[1] for e in remedies if (v := _values(rows, f"termination_{e}"))}
    if not shares or sum(shares.values()) <= th.truncated_frac:
        return []
    worst = max(shares, key=shares.get)
    return [Finding("episodes_cut_short", "warning", f"termination_{worst}", f"{_pct(shares[worst])} (last tenth)",
                    f"> {_pct(th.truncated_frac)}", f"episodes ended at a limit ({worst}) before an answer; by default "
                    "they are masked, so they train nothing", remedies[worst])]


def check_length(rows: list[Row], th: Thresholds) -> list[Finding]:
    findings = []
    trunc = _values(rows, "truncated_frac")
    if trunc:
        end = _ends(trunc)[1]
        if end > th.truncated_frac:
            findings.append(Finding("truncation", "warning", "truncated_frac", f"{_pct(end)} (last tenth)",
                                    f"> {_pct(th.truncated_frac)}", *_truncation_cause(rows)))
    findings += _cut_short(rows, th)
    length = _values(rows, "completion_len_mean")
    if len(length) >= 4:
        start, end = _ends(length)
        if start > 0 and end / start >= th.length_growth:
            findings.append(Finding("length_growth", "warning", "completion_len_mean",
                                    f"{start:.1f} → {end:.1f} tokens", f">= {th.length_growth:g} × start",
                                    "completions grew much longer during training",
                                    "check for rambling in `lmpo trajectories`; add --overlong penalty or "
                                    "--missing_eos_penalty, or use a length-neutral aggregation (dr_grpo)"))
    return findings


def check_hacking(rows: list[Row], th: Thresholds, eval_n: int | None = None) -> list[Finding]:
    """Reward up while held-out accuracy falls (completions that stop ending well: check_eos).
    `eval_n`: the run's --eval_problems; where it says how many problems each held-out share
    counts, the fall must also be beyond sampling noise (20/40 → 18/40 is none)."""
    reward = _values(rl_rows(rows), "reward_mean")
    evals = _values(rows, "eval_accuracy")
    if len(reward) < 4 or len(evals) < 2:
        return []
    r0, r1 = _ends(reward)
    n = eval_count(evals, eval_n)
    if r1 - r0 < th.reward_rise or evals[0] - evals[-1] < th.heldout_drop:
        return []
    if n is not None and not beyond_noise(evals[0], n, evals[-1], n, th):
        return []
    noise = f" and {noise_bar(th)}" if n is not None else ""
    return [Finding("reward_hacking", "warning", "reward_mean vs eval_accuracy",
                    f"reward {r0:.3f} → {r1:.3f}, held-out {counted(evals[0], n)} → {counted(evals[-1], n)}",
                    f"reward +{th.reward_rise:g} while held-out -{_pct(th.heldout_drop)}{noise}",
                    "the reward rose while held-out accuracy fell: the policy exploits the reward",
                    "score with the verifier (--rewards correct=1.0), keep the reward model's "
                    "output bounded, raise --beta, add --missing_eos_penalty, stop earlier")]


def check_kinds(rows: list[Row], th: Thresholds, final: dict | None = None) -> list[Finding]:
    """A kind of problem the policy gave up: the held-out average can rise while one kind falls
    (an after-sales GRPO run went 56.0% → 74.8% by learning to refuse every refund, the in-policy
    ones too: `refund` 47.6% → 0.0%). The start is the first held-out evaluation; the end is the
    stage's model (`final`: its result.json, which a stopping rule may have taken from an earlier
    step) or else the last evaluation."""
    evals = [r for r in rows if as_float(r.get("eval_accuracy")) is not None]
    if not evals:
        return []
    first, final = evals[0], final or {}
    breakdown = final.get("breakdown")
    by_kind = breakdown.get("by_kind") if isinstance(breakdown, dict) else None
    if isinstance(by_kind, dict) and as_float(final.get("accuracy")) is not None:
        end = {k: as_float(v.get("accuracy")) for k, v in by_kind.items() if isinstance(v, dict)}
        end_overall, which = as_float(final["accuracy"]), "the stage's model"
    else:
        last = evals[-1]
        end = {k[len("eval_kind_"):-len("_accuracy")]: as_float(v) for k, v in last.items()
               if k.startswith("eval_kind_") and k.endswith("_accuracy")}
        end_overall, which = as_float(last["eval_accuracy"]), f"the model of step {last.get('step')}"
    start_overall = as_float(first["eval_accuracy"])
    traded = end_overall is not None and start_overall is not None and end_overall >= start_overall
    findings = []
    for kind, after in sorted(end.items()):
        before = as_float(first.get(f"eval_kind_{kind}_accuracy"))
        if before is None or after is None:
            continue
        if before - after >= th.kind_drop:
            bar = f"a fall of >= {_pct(th.kind_drop)} from the start"
        elif after == 0 and before >= th.kind_gone:
            bar = f"solved by the start model (>= {_pct(th.kind_gone)}), never at the end"
        else:
            continue
        overall = f"held-out accuracy {_pct(start_overall)} → {_pct(end_overall)}"
        why = (f"the policy traded that kind for others ({overall})" if traded else
               f"and held-out accuracy fell too ({overall})")
        findings.append(Finding("kind_lost", "warning", f"eval_kind_{kind}_accuracy", f"{_pct(before)} → {_pct(after)}",
                                bar, f"{which} solves held-out `{kind}` problems less often than the start model: {why}",
                                "read its failures (`lmpo eval --model RUN_DIR/model --task TASK --out DIR`, then `lmpo "
                                "trajectories DIR --failed`); raise "
                                "--beta (holds the policy near the start model, which solved them), lower --lr, "
                                "or teach the kind before RL (its demonstrations in SFT)"))
    return findings


def check_clip(rows: list[Row], th: Thresholds) -> list[Finding]:
    clip = _values(rows, "clip_frac")
    if len(clip) < 4:
        return []
    share = sum(c > th.clip_frac for c in clip) / len(clip)
    if share >= th.clip_share:
        return [Finding("clip_high", "warning", "clip_frac", f"> {_pct(th.clip_frac)} in {_pct(share)} of steps",
                        f"> {_pct(th.clip_frac)} in >= {_pct(th.clip_share)} of steps",
                        "the ratio is clipped often: updates move the policy further than the trust region",
                        "lower --lr, fewer --num_iterations, or more --num_minibatches")]
    return []


def check_sampler(rows: list[Row], th: Thresholds) -> list[Finding]:
    points = [(step, v) for step, v in _points(rows, "sampler_kl") if v > th.sampler_kl]
    if not points:
        return []
    step, worst = max(points, key=lambda p: p[1])
    return [Finding("sampler_mismatch", "warning", "sampler_kl",
                    f"{worst:.2g} nats/token at step {step} ({_plural(len(points), 'step')} above the threshold)",
                    f"> {th.sampler_kl:g}",
                    "the engine's log-probs differ from the trainer's forward on the same weights by more than "
                    "float error: it sampled from another distribution than the policy being trained, and the "
                    "on-policy ratio (1 by construction) cannot show it",
                    "rerun a few steps with --precision fp32 (sampler_kl should read 0); if it stays high, the "
                    "engine is at fault: report it with the run directory")]


def check_supervised(rows: list[Row], th: Thresholds, stage: str, eval_n: int | None = None) -> list[Finding]:
    findings = []
    loss = [(as_float(r.get("step")), as_float(r.get("loss"))) for r in rows if as_float(r.get("loss")) is not None]
    values = [v for _, v in loss if v is not None and math.isfinite(v)]
    if len(values) >= 5 and stage == "cpt":
        k = max(1, len(values) // 5)
        before, last = _mean(values[-2 * k:-k]), _mean(values[-k:])
        if before > 0 and (before - last) / before >= th.loss_still_falling:
            findings.append(Finding("loss_still_falling", "note", "loss", f"{before:.3f} → {last:.3f} over the "
                                    "last fifth", f"a fall of >= {_pct(th.loss_still_falling)}",
                                    "the loss was still falling when the schedule ended",
                                    "more --steps (a better CPT model gives RL more right samples to reinforce)"))
    if len(values) >= 5 and stage in ("cpt", "sft"):
        k = max(1, len(values) // 5)
        first, last = _mean(values[:k]), _mean(values[-k:])
        if first > 0 and (last - first) / first >= th.loss_rise:
            findings.append(Finding("loss_rising", "warning", "loss", f"{first:.3f} → {last:.3f} (first and last "
                                    "fifth)", f"a rise of >= {_pct(th.loss_rise)}",
                                    "the training loss ended above where it started: the updates made the model "
                                    "worse on its own data (the learning rate is too high for it)",
                                    "lower --lr (or lengthen --warmup_steps), keep --grad_clip on (> 0)"))
    low = format_low(rows, th, eval_n) if stage == "sft" else None
    start = next((v for step, v in _points(rows, "eval_format_accuracy") if step == 0), None)
    if low is not None and start is not None and start >= th.sft_format:  # more of the same would not help
        findings.append(Finding("sft_format_low", "warning", "eval_format_accuracy", *low,
                                f"after SFT many answers are malformed or never end, where {_pct(start)} of the "
                                "start model's were well formed (step 0): the updates broke the format",
                                "lower --lr (or lengthen --warmup_steps); check that the demonstrations end with "
                                "EOS in the task's answer format"))
    elif low is not None:
        findings.append(Finding("sft_format_low", "warning", "eval_format_accuracy", *low,
                                "after SFT many answers are malformed or never end: RL gains would mostly be "
                                "learning to stop, not the task", "more --epochs or --demonstrations"))
    return findings


RL_CHECKS: tuple[Callable[[list[Row], Thresholds], list[Finding]], ...] = (
    check_nonfinite, check_entropy, check_kl, check_length, check_hacking, check_decline, check_clip, check_sampler,
    check_faults)


def diagnose(rows: list[Row], stage: str = "", thresholds: Thresholds | None = None,
             group_size: int | None = None, final: dict | None = None, advantage: str | None = None,
             rewards: str | None = None, eval_n: int | None = None) -> list[Finding]:
    """Every finding for one stage's metrics rows. RL rows (with `reward_mean`: RL, online DPO,
    RFT) get the RL checks; preference and reward-model runs (`stage` "dpo", "kto", "orpo", "rm")
    the decline, format and pairwise checks; supervised stages ("cpt" or "sft") the loss and
    format checks. `stage` is the run's trainer (run.json), whose flags the remedies name.
    `final`: the stage's result.json (the figures of the model it hands on), where there is one; `advantage`: the
    run's advantage estimator (config.json), which decides what an all-equal group means;
    `rewards`: the run's --rewards, which decides whether partial credit is a remedy; `eval_n`: its
    --eval_problems, the problems behind each held-out share (1/8 → 0/8 is noise, not a fall)."""
    th = thresholds or Thresholds()
    if rl_rows(rows):
        checks = [partial(check, eval_n=eval_n) if check is check_hacking else check for check in RL_CHECKS]
        found = check_signal(rows, th, group_size, advantage, rewards) + [f for check in checks for f in check(rows, th)]
        found = [_with_kept_model(f, rows, final) for f in found + check_eos(rows, th, group_size, eval_n)]
        return for_trainer(env_errors_first(found + check_kinds(rows, th, final), rows, th), stage)
    if stage in PAIR_TRAINERS:
        found = check_decline(rows, th) + check_heldout_fall(rows, th, eval_n) + check_eos(rows, th, eval_n=eval_n)
        found += check_below_chance(rows, th, stage)
        found = [_with_kept_model(f, rows, final) for f in found]
        return for_trainer(check_nonfinite(rows, th) + found + check_faults(rows, th), stage)
    return (check_nonfinite(rows, th) + check_heldout_fall(rows, th, eval_n) + check_supervised(rows, th, stage, eval_n)
            + check_faults(rows, th))


# A held-out finding's metric -> (the result.json field of the same figure, its metrics series, its name).
_KEPT_FIGURES = {"eval_format_accuracy": ("format_accuracy", "eval_format_accuracy", "format accuracy"),
                 "reward_mean vs eval_accuracy": ("accuracy", "eval_accuracy", "accuracy"),
                 "eval_accuracy": ("accuracy", "eval_accuracy", "accuracy")}


def _with_kept_model(finding: Finding, rows: list[Row], final: dict | None) -> Finding:
    """A held-out check reads the run's last evaluation; a stage whose stopping rule kept an
    earlier step hands on a model with other figures, so the finding says them too."""
    field, series, name = _KEPT_FIGURES.get(finding.metric, (None, None, None))
    kept = as_float((final or {}).get(field)) if field else None
    evals = _values(rows, series) if series else []
    if kept is None or not evals or abs(kept - evals[-1]) < 5e-4:
        return finding
    return replace(finding, message=f"{finding.message} (by the last evaluation; the model the stage hands on "
                                    f"has held-out {name} {_pct(kept)})")


def format_findings(findings: dict[str, list[Finding]] | list[Finding], label: str = "") -> str:
    """Lines for the terminal; empty when there is nothing to say."""
    if not isinstance(findings, dict):
        return "\n".join(f"{label}: {f.text()}" for f in findings)
    return "\n".join(f"{label}{stage}: {f.text()}" for stage, items in findings.items() for f in items)
