"""The doctor: read a run's metrics and say in plain words what limits training.

Each check is a pure function over metrics rows (`metrics.jsonl`, one dict per step) that returns
findings: the metric, its value, the threshold it crossed, what that means and what to change.
`lmpo.reports.doctor_runs.diagnose_run(path)` reads a stage directory or every stage of a
pipeline directory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from .metrics import Row, as_float


@dataclass(frozen=True)
class Finding:
    """One diagnosis. `severity`: "warning" (training is limited or going wrong) or "note"."""

    code: str
    severity: str
    metric: str
    value: str
    threshold: str
    message: str
    remedy: str

    def text(self) -> str:
        return (f"{self.severity}: {self.code}: {self.message} [{self.metric} = {self.value}; "
                f"threshold {self.threshold}] → {self.remedy}")


@dataclass(frozen=True)
class Thresholds:
    """Where each check fires; every finding quotes the one it crossed."""

    zero_var_frac: float = 0.9
    """Mean share of groups whose rewards are all equal (no gradient)."""
    sparse_accuracy: float = 0.05
    """Sampled training accuracy at the start below which the reward is too sparse."""
    easy_accuracy: float = 0.95
    """Sampled training accuracy at the start above which the task is too easy."""
    flat_start: float = 0.5
    """...when at least this share of the first steps' groups also had all-equal rewards (below it,
    partial credit makes the rewards differ within groups whatever the accuracy)."""
    entropy_ratio: float = 0.25
    """Final entropy over starting entropy below which entropy collapsed..."""
    entropy_floor: float = 0.05
    """...when the final entropy (nats/token) is also below this."""
    kl: float = 1.0
    """Mean KL to the reference over the last tenth of the run (nats/token)."""
    truncated_frac: float = 0.2
    """Share of completions cut at max_new_tokens over the last tenth."""
    length_growth: float = 2.0
    """Final over starting mean completion length."""
    reward_rise: float = 0.1
    """A rise of the training reward ..."""
    heldout_drop: float = 0.05
    """... while held-out accuracy falls by this much: reward hacking."""
    eos_drop: float = 0.1
    """A fall of format accuracy (terminated, well-formed answers), train or held-out."""
    kind_drop: float = 0.2
    """A fall of one kind's held-out accuracy (tasks whose problems have kinds: `eval_kind_*`)."""
    clip_frac: float = 0.2
    """Clip fraction above which ..."""
    clip_share: float = 0.5
    """... in this share of steps is persistently high."""
    loss_still_falling: float = 0.05
    """Relative fall of a supervised loss over the last fifth of the schedule."""
    decline: float = 0.15
    """A fall of accuracy (held-out, or training without held-out evaluations) from its best
    window to the last one, ..."""
    decline_ratio: float = 0.3
    """... that is also this share of the best ...
    (a run that only returns to where it started, after a lucky evaluation, is noise)."""
    collapse_ratio: float = 0.25
    """Sampled accuracy at the last steps over that of the first step (the starting model, when
    that was >= `decline`) at or below which a run without signal had collapsed."""
    sft_format: float = 0.9
    """Held-out format accuracy after SFT below which RL would mostly learn to stop."""


def _points(rows: list[Row], key: str) -> list[tuple[object, float]]:
    """(step, value) of each row with a finite `key`."""
    return [(row.get("step"), v) for row in rows if (v := as_float(row.get(key))) is not None and math.isfinite(v)]


def _values(rows: list[Row], key: str) -> list[float]:
    return [v for _, v in _points(rows, key)]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _ends(xs: list[float], share: float = 0.1) -> tuple[float, float]:
    """Means of the first and the last `share` of a series (at least one point each)."""
    k = max(1, int(len(xs) * share))
    return _mean(xs[:k]), _mean(xs[-k:])


def rl_rows(rows: list[Row]) -> list[Row]:
    return [r for r in rows if "reward_mean" in r]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


# lmpo.algos' ADVANTAGES (named here so that the doctor runs without torch; a test keeps them equal)
GROUP_ADVANTAGES = ("grpo", "dr_grpo", "rloo")


def check_signal(rows: list[Row], th: Thresholds, group_size: int | None = None,
                 advantage: str | None = None) -> list[Finding]:
    """No signal, and why: too sparse (rarely right), too easy (always right), or neither.
    `group_size` (from the run's config) turns the starting accuracy into an estimated pass@k.
    `advantage` (the run's estimator): an all-equal group gives no gradient only where the
    advantage compares completions within their group (grpo, dr_grpo, rloo); under gae or
    reinforce_pp the critic's values or the batch's baseline still give one."""
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
        findings.append(Finding("reward_sparse", "warning", "accuracy (first steps)", _pct(start_acc),
                                f"<= {_pct(th.sparse_accuracy)}",
                                f"the model is rarely right at the start, so the rewards of a group are mostly all "
                                f"equal{flat_text}",
                                "start from a model trained longer (in `lmpo pipeline`: --cpt.steps, --sft.epochs), "
                                "use easier problems, add partial credit (--rewards correct=1.0,format=0.1) or a "
                                "larger --group_size"))
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


def check_length(rows: list[Row], th: Thresholds) -> list[Finding]:
    findings = []
    trunc = _values(rows, "truncated_frac")
    if trunc:
        end = _ends(trunc)[1]
        if end > th.truncated_frac:
            findings.append(Finding("truncation", "warning", "truncated_frac", f"{_pct(end)} (last tenth)",
                                    f"> {_pct(th.truncated_frac)}",
                                    "completions hit --max_new_tokens before EOS: they are unterminated, "
                                    "so graded wrong, and their length gradient is biased",
                                    "raise --max_new_tokens (and --eval_max_new_tokens), or penalise length "
                                    "(--overlong penalty, --missing_eos_penalty)"))
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


def check_hacking(rows: list[Row], th: Thresholds) -> list[Finding]:
    """Reward up while held-out accuracy falls, or completions that stop ending well."""
    findings = []
    reward = _values(rl_rows(rows), "reward_mean")
    evals = _values(rows, "eval_accuracy")
    if len(reward) >= 4 and len(evals) >= 2:
        r0, r1 = _ends(reward)
        if r1 - r0 >= th.reward_rise and evals[-1] - evals[0] <= -th.heldout_drop:
            findings.append(Finding("reward_hacking", "warning", "reward_mean vs eval_accuracy",
                                    f"reward {r0:.3f} → {r1:.3f}, held-out {_pct(evals[0])} → {_pct(evals[-1])}",
                                    f"reward +{th.reward_rise:g} while held-out -{_pct(th.heldout_drop)}",
                                    "the reward rose while held-out accuracy fell: the policy exploits the reward",
                                    "score with the verifier (--rewards correct=1.0), keep the reward model's "
                                    "output bounded, raise --beta, add --missing_eos_penalty, stop earlier"))
    for key, where in (("format_accuracy", "training"), ("eval_format_accuracy", "held-out")):
        fmt = _values(rows, key)
        if len(fmt) >= 2:
            f0, f1 = _ends(fmt) if len(fmt) >= 4 else (fmt[0], fmt[-1])
            if f0 - f1 >= th.eos_drop:
                findings.append(Finding("eos_loss", "warning", key, f"{_pct(f0)} → {_pct(f1)}",
                                        f"a fall of >= {_pct(th.eos_drop)}",
                                        f"fewer {where} completions end with EOS in the answer format",
                                        "add --missing_eos_penalty, raise --beta, lower --lr; if a reward model "
                                        "scores, it likely rewards unterminated text"))
                break
    return findings


def _windows(xs: list[float], k: int) -> list[float]:
    return [_mean(xs[i:i + k]) for i in range(len(xs) - k + 1)]


def _decline(xs: list[float], k: int, th: Thresholds) -> tuple[float, int, float, float] | None:
    """(best window mean, its first index, start window mean, end window mean) of a series that
    fell by `th.decline` and `th.decline_ratio` from its best and also ended below its start
    (by half the fall threshold)."""
    means = _windows(xs, k)
    best_at = max(range(len(means)), key=means.__getitem__)
    best, start, end = means[best_at], means[0], means[-1]
    if best - end >= th.decline and end <= best * (1 - th.decline_ratio) and start - end >= th.decline / 2:
        return best, best_at, start, end
    return None


def check_decline(rows: list[Row], th: Thresholds) -> list[Finding]:
    """A run getting worse: held-out accuracy (or, without held-out evaluations, training accuracy)
    falls a lot from its best to the end and ends below its start. Window means, not single
    points, so that one lucky evaluation or batch is no peak. A training reward that rose meanwhile
    is reward hacking (check_hacking), not this."""
    reward = _values(rl_rows(rows), "reward_mean")
    if len(reward) >= 4 and _ends(reward)[1] - _ends(reward)[0] >= th.reward_rise:
        return []
    evals = [(r.get("step"), v) for r in rows if (v := as_float(r.get("eval_accuracy"))) is not None
             and math.isfinite(v)]
    train = _values(rl_rows(rows), "accuracy")
    k_train = max(3, len(train) // 10)
    train_fall = _decline(train, k_train, th) if len(train) >= 2 * k_train else None
    if len(evals) >= 3:
        k = max(1, len(evals) // 4)
        fall = _decline([v for _, v in evals], k, th)
        if fall is None:
            return []
        best, at, start, end = fall
        metric, where = "eval_accuracy", "held-out accuracy"
        first, last = evals[at][0], evals[at + k - 1][0]
        best_steps = f"step {first}" if k == 1 else f"steps {first}–{last}"
        value = f"{_pct(best)} (best, {best_steps}) → {_pct(end)} (last {_plural(k, 'evaluation')})"
    elif train_fall is not None and len(train) >= 20:
        best, at, start, end = train_fall
        metric, where = "accuracy", "training accuracy (sampled)"
        value = f"{_pct(best)} (best {k_train} steps) → {_pct(end)} (last {k_train} steps)"
    else:
        return []
    also = ""
    if metric == "eval_accuracy" and train_fall is not None:
        also = f"; training accuracy fell too, {_pct(train_fall[0])} → {_pct(train_fall[3])}"
    return [Finding("decline", "warning", metric, value,
                    f"a fall of >= {_pct(th.decline)} and >= {th.decline_ratio:.0%} of the best, ending below the start",
                    f"{where} fell from its best and ended below where it started ({_pct(start)}){also}: "
                    "the run is getting worse, not better",
                    "lower --lr; use --collapse_guard true (rolls back to a checkpoint when the reward falls); "
                    "keep the best evaluation with --stop_patience N; check the kl (a growing KL: raise --beta)")]


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
        if before is None or after is None or before - after < th.kind_drop:
            continue
        overall = f"held-out accuracy {_pct(start_overall)} → {_pct(end_overall)}"
        why = (f"the policy traded that kind for others ({overall})" if traded else
               f"and held-out accuracy fell too ({overall})")
        findings.append(Finding("kind_lost", "warning", f"eval_kind_{kind}_accuracy", f"{_pct(before)} → {_pct(after)}",
                                f"a fall of >= {_pct(th.kind_drop)} from the start",
                                f"{which} solves held-out `{kind}` problems less often than the start model: {why}",
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


# Figures that a diverged run turns to inf or NaN (`_values` leaves those out of every other check).
NONFINITE_KEYS = ("loss", "kl", "reward_mean", "entropy", "eval_loss")


def check_nonfinite(rows: list[Row], th: Thresholds) -> list[Finding]:
    """A loss, KL, reward or entropy logged as inf or NaN: the run diverged from that step on."""
    findings = []
    rl_remedy = "raise --beta (a KL that grows without bound), use --collapse_guard true, " if rl_rows(rows) else ""
    for key in NONFINITE_KEYS:
        logged = [(r.get("step"), v) for r in rows if (v := as_float(r.get(key))) is not None]
        bad = [(step, v) for step, v in logged if not math.isfinite(v)]
        if not bad:
            continue
        step, value = bad[0]
        findings.append(Finding("nonfinite", "warning", key,
                                f"{value} from step {step} ({len(bad)} of {len(logged)} logged steps)", "finite",
                                f"{key} left the finite range at step {step}: the run diverged there, and its "
                                "figures after that step (and the model it saved) cannot be trusted",
                                f"lower --lr, keep --grad_clip, {rl_remedy}or restart from a checkpoint saved "
                                f"before step {step}"))
    return findings


def _skipped_updates(rows: list[Row]) -> str:
    """How many updates were skipped in all, as evidence; "" when none. The RL trainer logs each
    step's own count (zero_var_frac is its figure alone); the others log the running total."""
    points = _points(rows, "skipped_updates")
    if not any(v > 0 for _, v in points):
        return ""
    if any("zero_var_frac" in r for r in rows):
        steps = sum(v > 0 for _, v in points)
        return f"{int(sum(v for _, v in points))} updates in {_plural(steps, 'step')} of {len(rl_rows(rows))}"
    step, total = max(points, key=lambda p: p[1])
    return f"{int(total)} updates in all (by step {step})"


def check_faults(rows: list[Row], th: Thresholds) -> list[Finding]:
    findings = []
    skipped = _skipped_updates(rows)
    if skipped:
        findings.append(Finding("nonfinite_skips", "warning", "skipped_updates", skipped, "> 0",
                                "some updates had a non-finite loss or gradient and were skipped",
                                "lower --lr, keep --grad_clip, check the reward for inf/NaN"))
    rollbacks = [r for r in rows if "rollback" in r]
    if rollbacks:
        last = rollbacks[-1]
        findings.append(Finding("rollback", "warning", "rollback", f"{len(rollbacks)}", "> 0",
                                f"the collapse guard rolled back {len(rollbacks)} time(s); last at step {last['step']} "
                                f"to step {last.get('to_step')}: {last['rollback']}",
                                "the learning rate was lowered to x" f"{last.get('lr_scale', 1):g}; start the next run "
                                "with a lower --lr"))
    unscorable = _values(rows, "unscorable")
    if unscorable and sum(unscorable) > 0:
        findings.append(Finding("unscorable", "warning", "unscorable", f"{int(sum(unscorable))} completions",
                                "> 0", "a reward function could not score some completions (left out of the "
                                "baseline, zero advantage)", "read RUN_DIR/reward_failures.jsonl; fix the function "
                                "or raise --reward_timeout"))
    return findings


def check_supervised(rows: list[Row], th: Thresholds, stage: str) -> list[Finding]:
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
                                    "more --cpt.steps (a better CPT model gives RL more right samples to reinforce)"))
    fmt = _values(rows, "eval_format_accuracy")
    if stage == "sft" and fmt and fmt[-1] < th.sft_format:
        findings.append(Finding("sft_format_low", "warning", "eval_format_accuracy", _pct(fmt[-1]),
                                f"< {_pct(th.sft_format)}",
                                "after SFT many answers are malformed or never end: RL gains would mostly be "
                                "learning to stop, not the task", "more --sft.epochs or --sft.demonstrations"))
    return findings


RL_CHECKS: tuple[Callable[[list[Row], Thresholds], list[Finding]], ...] = (
    check_nonfinite, check_entropy, check_kl, check_length, check_hacking, check_decline, check_clip, check_faults)


def diagnose(rows: list[Row], stage: str = "", thresholds: Thresholds | None = None,
             group_size: int | None = None, final: dict | None = None, advantage: str | None = None) -> list[Finding]:
    """Every finding for one stage's metrics rows. RL rows (with `reward_mean`) get the RL checks;
    supervised stages (`stage` "cpt" or "sft") the loss and format checks. `final`: the stage's
    result.json (the figures of the model it hands on), where there is one; `advantage`: the
    run's advantage estimator (config.json), which decides what an all-equal group means."""
    th = thresholds or Thresholds()
    if rl_rows(rows):
        found = check_signal(rows, th, group_size, advantage) + [f for check in RL_CHECKS for f in check(rows, th)]
        return [_with_kept_model(f, rows, final) for f in found] + check_kinds(rows, th, final)
    return check_nonfinite(rows, th) + check_supervised(rows, th, stage) + check_faults(rows, th)


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
