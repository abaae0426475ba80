"""Doctor checks of a run going wrong: getting worse (check_decline), figures gone to inf/NaN
(check_nonfinite), skipped updates, rollbacks and unscorable rewards (check_faults)."""

from __future__ import annotations

import itertools
import math

from .doctor_base import Finding, Thresholds, ends, finite_points, finite_values, pct, plural, rl_rows
from .metrics import Row, as_float, final_branch


def _windows(xs: list[float], k: int) -> list[float]:
    """The mean of every k consecutive values, by prefix sums (k grows with the run: a window sum
    each would be quadratic, 13 s on a 100k-step run)."""
    sums = [0.0, *itertools.accumulate(xs)]
    return [(sums[i + k] - sums[i]) / k for i in range(len(xs) - k + 1)]


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
    reward = finite_values(rl_rows(rows), "reward_mean")
    if len(reward) >= 4 and ends(reward)[1] - ends(reward)[0] >= th.reward_rise:
        return []
    evals = finite_points(rows, "eval_accuracy")
    # online DPO's rows (`pairs`) log its pairs' accuracy (the implicit reward ranks the chosen
    # first; 0 at the first update, whose policy is the reference), not how often samples were right
    train = finite_values([r for r in rl_rows(rows) if "pairs" not in r], "accuracy")
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
        value = f"{pct(best)} (best, {best_steps}) → {pct(end)} (last {plural(k, 'evaluation')})"
    elif train_fall is not None and len(train) >= 20:
        best, at, start, end = train_fall
        metric, where = "accuracy", "training accuracy (sampled)"
        value = f"{pct(best)} (best {k_train} steps) → {pct(end)} (last {k_train} steps)"
    else:
        return []
    also = ""
    if metric == "eval_accuracy" and train_fall is not None:
        also = f"; training accuracy fell too, {pct(train_fall[0])} → {pct(train_fall[3])}"
    return [Finding("decline", "warning", metric, value,
                    f"a fall of >= {pct(th.decline)} and >= {th.decline_ratio:.0%} of the best, ending below the start",
                    f"{where} fell from its best and ended below where it started ({pct(start)}){also}: "
                    "the run is getting worse, not better",
                    "lower --lr; use --collapse_guard true (rolls back to a checkpoint when the reward falls); "
                    "keep the best evaluation with --stop_patience N; check the kl (a growing KL: raise --beta)")]


# Figures that a diverged run turns to inf or NaN (`finite_values` leaves those out of every other check).
NONFINITE_KEYS = ("loss", "kl", "reward_mean", "entropy", "eval_loss")


def check_nonfinite(rows: list[Row], th: Thresholds) -> list[Finding]:
    """A loss, KL, reward or entropy logged as inf or NaN: the run diverged from that step on."""
    findings = []
    # only `lmpo train` RL logs zero_var_frac, and has --collapse_guard (online DPO and RFT log reward_mean too)
    rl_trainer = any("zero_var_frac" in r for r in rows)
    rl_remedy = "raise --beta (a KL that grows without bound), use --collapse_guard true, " if rl_trainer else ""
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


def check_abandoned_nonfinite(rows: list[Row]) -> list[Finding]:
    """A figure that went to inf or NaN only in steps a collapse-guard rollback abandoned (`rows`:
    every row logged, the abandoned branches too): the kept run's checks never see it, yet it says
    the learning rate diverged once; the kept run's curves and model do not contain it."""
    kept = final_branch(rows)
    kept_ids, kept_bad = {id(r) for r in kept}, {f.metric for f in check_nonfinite(kept, Thresholds())}
    findings = []
    for key in NONFINITE_KEYS:
        bad = next(((i, r) for i, r in enumerate(rows) if id(r) not in kept_ids
                    and (v := as_float(r.get(key))) is not None and not math.isfinite(v)), None)
        if bad is None:
            continue
        i, row = bad
        step = as_float(row.get("step"))
        undone = next((r for r in rows[i + 1:] if "rollback" in r and step is not None
                       and (as_float(r.get("to_step")) or 0.0) < step), {})
        kept_too = ("; it left the finite range in the kept run too (see nonfinite)" if key in kept_bad else
                    f"; the kept run trained the steps after step {undone.get('to_step')} again and its {key} "
                    "stayed finite")
        findings.append(Finding("nonfinite_abandoned", "note", key, f"{row.get(key)} at step {row.get('step')}",
                                "finite", f"{key} left the finite range at step {row.get('step')} in an abandoned "
                                f"branch (rolled back at step {undone.get('step')} to step {undone.get('to_step')}: "
                                f"{undone.get('rollback')}){kept_too}",
                                "nothing to repair in the kept run (its curves and model leave that branch out); "
                                "the learning rate diverged once: start the next run with a lower --lr and keep "
                                "--grad_clip"))
    return findings


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def check_grad_norm(rows: list[Row], th: Thresholds) -> list[Finding]:
    """A gradient norm that exploded while the loss may still look finite: --grad_clip cuts each
    update to its norm, so only `grad_norm` (logged before clipping) shows the steep ground the
    weights reached. Medians of the first and last tenth (at least 3 logged values each, the
    first of those above 0: an RL step with no signal has a norm of 0), so a spike is no explosion.
    Non-finite norms skip their update, and check_faults reports those (skipped_updates)."""
    norms = finite_points(rows, "grad_norm")
    k = max(3, len(norms) // 10)
    start = [v for _, v in norms if v > 0][:k]
    if len(norms) < 2 * k or len(start) < k or _median(start) <= 0:
        return []
    before, after = _median(start), _median([v for _, v in norms[-k:]])
    if after < th.grad_growth * before:
        return []
    return [Finding("grad_norm_explosion", "warning", "grad_norm",
                    f"{before:.3g} → {after:.3g} (medians of the first and last {k} logged steps)",
                    f">= {th.grad_growth:g} × the start",
                    f"the gradient norm grew {after / before:.3g}-fold by step {norms[-1][0]}: the updates took the "
                    "weights where the loss is very steep, close to diverging (each update is cut to --grad_clip, "
                    "which is what keeps the loss finite, if it is on)",
                    "lower --lr (or lengthen --warmup_steps), keep --grad_clip on (> 0), or restart from a "
                    "checkpoint saved before the norm grew")]


def _skipped_updates(rows: list[Row]) -> str:
    """How many updates were skipped in all, as evidence; "" when none. The RL trainer logs each
    step's own count (zero_var_frac is its figure alone); the others log the running total."""
    points = finite_points(rows, "skipped_updates")
    if not any(v > 0 for _, v in points):
        return ""
    if any("zero_var_frac" in r for r in rows):
        steps = sum(v > 0 for _, v in points)
        return f"{int(sum(v for _, v in points))} updates in {plural(steps, 'step')} of {len(rl_rows(rows))}"
    step, total = max(points, key=lambda p: p[1])
    return f"{int(total)} updates in all (by step {step})"


def check_faults(rows: list[Row], th: Thresholds) -> list[Finding]:
    findings = check_grad_norm(rows, th)
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
    findings += _no_updates(rows)
    excluded = int(sum(finite_values(rows, "unscorable_termination")))  # episodes left out by how they ended
    unscored = int(sum(finite_values(rows, "unscorable"))) - excluded
    if excluded > 0:
        endings = sorted({k.removeprefix("termination_") for r in rows for k in r
                          if k in ("termination_tool_timeout", "termination_env_error") and as_float(r[k])})
        findings.append(Finding("episodes_excluded", "warning", "unscorable_termination",
                                f"{plural(excluded, 'episode')}", "> 0",
                                f"episodes that ended in {' or '.join(endings) or 'an ending --termination_policy excludes'} "
                                "(the environment or a tool failed, not the model) were left out of training",
                                "read each one's error with `lmpo trajectories RUN_DIR` and the run's [env] warnings; "
                                "fix the environment or tool, or give a slow tool more time"))
    if unscored > 0:
        findings.append(Finding("unscorable", "warning", "unscorable", f"{unscored} completions",
                                "> 0", "a reward function could not score some completions (left out of the "
                                "baseline, zero advantage)", "read RUN_DIR/reward_failures.jsonl; fix the function "
                                "or raise --reward_timeout"))
    return findings


# Findings a failing environment explains: its episodes score nothing and count as wrong, so groups
# look all-equal and the model rarely right whatever the reward's design.
EXPLAINED_BY_ENV_ERRORS = ("no_signal", "reward_sparse")


def env_errors_first(found: list[Finding], rows: list[Row], th: Thresholds) -> list[Finding]:
    """`found` led by an `env_errors` finding where a large share of episodes ended in env_error,
    without the reward-signal findings it explains (and the episodes_excluded one it says again)."""
    steps = rl_rows(rows)
    shares = [as_float(r.get("termination_env_error")) or 0.0 for r in steps]
    share = sum(shares) / len(shares) if shares else 0.0
    if share < th.env_error_share:
        return found
    timeouts = any(as_float(r.get("termination_tool_timeout")) for r in steps)
    dropped = [f.code for f in found if f.code in EXPLAINED_BY_ENV_ERRORS]
    set_aside = (f"; {' and '.join(dict.fromkeys(dropped))} are not reported: failed episodes score nothing and "
                 "count as wrong, so the reward figures describe the environment, not the model" if dropped else "")
    lead = Finding("env_errors", "warning", "termination_env_error",
                   f"{pct(share)} of episodes (mean over {plural(len(steps), 'step')})",
                   f">= {pct(th.env_error_share)}",
                   f"the environment raised in {pct(share)} of episodes (env_error): those are left out of training, "
                   f"so it, not the model or the reward, limits this run{set_aside}",
                   "read the errors with `lmpo trajectories RUN_DIR --failed` (an env_error episode shows `error: "
                   "...`, with the file and line that raised) and the run's [env] warnings; fix the environment, "
                   "then train again and run the doctor on that run")
    kept = [f for f in found if f.code not in EXPLAINED_BY_ENV_ERRORS
            and (f.code != "episodes_excluded" or timeouts)]
    return [lead, *kept]


def _no_updates(rows: list[Row]) -> list[Finding]:
    """Online DPO or RFT that never trained: every round's samples tied (no pair), or none was
    accepted. The run ends as any other, and the model it saves is the one it started from."""
    rft = [r for r in rows if "acceptance_rate" in r]
    counts = finite_values(rft, "updates") if rft else finite_values(rows, "optimizer_steps")
    if not counts or max(counts) > 0:
        return []
    if rft:
        return [Finding("no_updates", "warning", "updates", f"0 in {plural(len(rft), 'round')}", "> 0",
                        "no sample was accepted in any round (kept 0), so nothing was fine-tuned: the saved model "
                        "is the start model",
                        "lower --accept_threshold, or keep each prompt's best samples whatever their reward with "
                        "--accept_threshold -inf --keep_top_k N (--keep_top_k alone keeps only accepted ones), "
                        "sample more with --samples_per_prompt, or start from a model that solves some prompts")]
    unended = finite_values(rows, "unended_frac")
    if unended and sum(unended) / len(unended) >= 0.5:
        return [Finding("no_updates", "warning", "optimizer_steps", f"0 in {plural(len(counts), 'round')} (prompts "
                        f"no sample of which ended: {100 * sum(unended) / len(unended):.0f}%)", "> 0",
                        "no pair was formed: most prompts' samples were all cut off at --max_new_tokens, and a "
                        "cut-off sample is never chosen, so nothing was trained: the saved model is the start model",
                        "raise --max_new_tokens (or teach the model to stop, in SFT)")]
    return [Finding("no_updates", "warning", "optimizer_steps", f"0 in {plural(len(counts), 'round')}", "> 0",
                    "every round's samples scored alike, so no pair was formed and nothing was trained: the "
                    "saved model is the start model",
                    "sample more with --samples_per_prompt, raise --temperature, or rank with rewards that tell "
                    "samples apart (more reward functions, a reward model)")]
