"""The doctor diagnoses planted failures and stays quiet on a healthy run.

Planted by real short runs (a few seconds each, from a fresh tiny model): no signal (the
correct-answer reward on a model that never answers right), entropy collapse (lr 0.03 with a
dense reward), truncation (`--max_new_tokens 2`). Synthetic metrics rows, where a real run would
take minutes: reward hacking with a learned reward model (shaped like a `ppo_rm` run whose reward
rises while held-out accuracy falls and completions stop ending with EOS), KL runaway, high clip
fraction, non-finite skips, unscorable rewards, length growth. The healthy run is a real
default `lmpo pipeline --seed 1` run on sort_digits, subsampled (tests/data/healthy_sort_pipeline)."""

import os
import sys
from pathlib import Path

import pytest

from lmpo.cli.main import main
from lmpo.reports.doctor import Thresholds, diagnose
from lmpo.reports.doctor_runs import diagnose_run

HERE = Path(__file__).parent


def _codes(findings) -> set[str]:
    return {f.code for f in findings if f.severity == "warning"}


def _rl_run(tmp_path: Path, name: str, *flags: str) -> Path:
    out = tmp_path / name
    argv = ["train", "grpo", "--model", "tiny", "--out", str(out), "--threads", "1", "--prompts_per_step", "2",
            "--group_size", "4", "--eval_problems", "20", "--prompt_pool", "100", "--eval_every", "100", *flags]
    assert main(argv) == 0
    return out


@pytest.fixture
def reward_fns_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), *sys.path]))


def test_healthy_run_has_no_warnings(capsys):
    findings = diagnose_run(HERE / "data" / "healthy_sort_pipeline")
    assert list(findings) == ["cpt", "sft", "grpo"]
    assert not any(f.severity == "warning" for items in findings.values() for f in items)
    assert main(["doctor", str(HERE / "data" / "healthy_sort_pipeline")]) == 0
    assert "no problems found in: cpt, sft, grpo" in capsys.readouterr().out


def test_all_equal_groups_under_a_critic_or_batch_baseline_are_a_note_not_no_gradient():
    from lmpo.algos import ADVANTAGES
    from lmpo.reports.doctor import GROUP_ADVANTAGES
    assert set(GROUP_ADVANTAGES) == set(ADVANTAGES.names())  # the doctor's torch-free copy of the names
    rows = [{"step": s, "reward_mean": 0.0, "accuracy": 0.0, "zero_var_frac": 1.0} for s in range(1, 11)]
    for advantage in ("gae", "reinforce_pp"):
        found = next(f for f in diagnose(rows, "rl", group_size=4, advantage=advantage) if f.code == "no_signal")
        assert found.severity == "note" and f"under {advantage} advantages they still get a gradient" in found.message
        assert "gave no gradient" not in found.message and "--group_size" not in found.remedy
    for advantage in (None, *GROUP_ADVANTAGES):  # None: a run without config.json
        found = next(f for f in diagnose(rows, "rl", group_size=4, advantage=advantage) if f.code == "no_signal")
        assert found.severity == "warning" and "gave no gradient" in found.message


def test_no_signal_from_a_model_that_is_never_right(tmp_path, capsys):
    out = _rl_run(tmp_path, "no_signal", "--steps", "3")
    found = diagnose_run(out)["no_signal"]
    assert {"no_signal", "reward_sparse"} <= _codes(found)
    no_signal = next(f for f in found if f.code == "no_signal")
    assert no_signal.metric == "zero_var_frac" and no_signal.value == "100.0%" and "pass@4" in no_signal.message
    assert main(["doctor", str(out)]) == 0
    assert "warning: no_signal" in capsys.readouterr().out


def test_partial_credit_that_varies_within_groups_is_not_called_sparse():
    """A custom reward (digits / 5) gave every group differing rewards while `correct` was never
    true: the doctor said `reward_sparse: ... almost every reward is 0`."""
    from lmpo.reports.doctor import Thresholds, check_signal

    varied = [{"step": s, "reward_mean": 0.1, "accuracy": 0.0, "zero_var_frac": 0.0} for s in range(1, 11)]
    assert check_signal(varied, Thresholds(), group_size=4) == []
    flat = [{**row, "zero_var_frac": 0.8} for row in varied]
    (sparse,) = check_signal(flat, Thresholds(), group_size=4)
    assert sparse.code == "reward_sparse" and "80.0% of the first steps' groups had all-equal rewards" in sparse.message


def test_a_run_with_partial_credit_already_is_not_told_to_add_it(tmp_path):
    """`lmpo doctor` of a run with `--rewards correct=1.0,rewards.py:digits=0.5` said "add partial
    credit (--rewards correct=1.0,format=0.1)"; it now reads the run's rewards from its run.json."""
    import json

    from lmpo.reports.doctor import Thresholds, check_signal
    from lmpo.reports.doctor_runs import diagnose_stage

    flat = [{"step": s, "reward_mean": 0.0, "accuracy": 0.0, "zero_var_frac": 0.8} for s in range(1, 11)]
    (alone,) = check_signal(flat, Thresholds(), rewards="correct=1.0")
    assert "add partial credit (--rewards correct=1.0,format=0.1)" in alone.remedy
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in flat))
    (tmp_path / "run.json").write_text(json.dumps({"trainer": "rl", "command": "dapo", "config": {
        "rewards": "correct=1.0,rewards.py:digits=0.5", "group_size": 4}}))
    (sparse,) = [f for f in diagnose_stage(tmp_path) if f.code == "reward_sparse"]
    assert "add partial credit" not in sparse.remedy and "a larger --group_size" in sparse.remedy
    assert sparse.remedy.endswith("(the run's --rewards correct=1.0,rewards.py:digits=0.5 already give partial "
                                  "credit; it did not tell a group's completions apart)")
    # an agent task whose environment rewards turns (after-sales: format=0.05 and reward_env): adding
    # `correct` would count the outcome twice
    env = [{**row, "reward_env": 0.0} for row in flat]
    (agent,) = check_signal(env, Thresholds(), rewards="format=0.05")
    assert "add partial credit" not in agent.remedy
    assert agent.remedy.endswith("(the environment's own rewards (reward_env) already give partial credit; "
                                 "it did not tell a group's completions apart)")


def test_entropy_collapse_from_a_too_high_learning_rate(tmp_path, reward_fns_on_path):
    out = _rl_run(tmp_path, "collapse", "--steps", "20", "--lr", "0.03", "--max_new_tokens", "8",
                  "--rewards", "reward_fns:count_sevens=1.0")
    found = diagnose_run(out)["collapse"]
    collapse = next(f for f in found if f.code == "entropy_collapse")
    assert "--lr" in collapse.remedy and collapse.metric == "entropy"


def test_truncation(tmp_path):
    out = _rl_run(tmp_path, "short", "--steps", "3", "--max_new_tokens", "2")
    truncation = next(f for f in diagnose_run(out)["short"] if f.code == "truncation")
    assert truncation.metric == "truncated_frac" and "--max_new_tokens" in truncation.remedy


def _rows(n: int, **series) -> list[dict]:
    """n RL rows; each keyword is (start, end), linearly interpolated."""
    rows = []
    for i in range(n):
        t = i / (n - 1)
        rows.append({"step": i + 1, "reward_mean": 0.5, "zero_var_frac": 0.3, "accuracy": 0.5,
                     **{k: a + (b - a) * t for k, (a, b) in series.items()}})
    return rows


def test_reward_hacking_with_a_learned_reward_model():
    """Synthetic: the reward model's score rises, held-out accuracy (step 0 and the last eval)
    falls, and completions stop ending with EOS."""
    rows = [{"step": 0, "eval_accuracy": 0.40, "eval_format_accuracy": 1.0}]
    rows += _rows(40, reward_mean=(0.1, 2.0), format_accuracy=(1.0, 0.3), truncated_frac=(0.0, 0.1))
    rows[-1].update(eval_accuracy=0.15, eval_format_accuracy=0.5)
    found = diagnose(rows, "rl")
    assert {"reward_hacking", "eos_loss"} <= _codes(found)
    hacking = next(f for f in found if f.code == "reward_hacking")
    assert "40.0% → 15.0%" in hacking.value
    kept = next(f for f in diagnose(rows, "rl", final={"accuracy": 0.38}) if f.code == "reward_hacking")
    assert kept.message.endswith("the model the stage hands on has held-out accuracy 38.0%)")


@pytest.mark.parametrize("series, extra, code", [
    ({"kl": (0.01, 3.0)}, {}, "kl_runaway"),
    ({"clip_frac": (0.3, 0.5)}, {}, "clip_high"),
    ({"sampler_kl": (0.0, 0.0)}, {"sampler_kl": 0.02}, "sampler_mismatch"),
    ({"completion_len_mean": (5.0, 30.0)}, {}, "length_growth"),
    ({}, {"skipped_updates": 2}, "nonfinite_skips"),
    ({}, {"unscorable": 3}, "unscorable"),
    ({"accuracy": (0.99, 1.0), "zero_var_frac": (0.95, 1.0)}, {}, "reward_easy"),
])
def test_synthetic_failures(series, extra, code):
    rows = _rows(30, **series)
    rows[10].update(extra)
    assert code in _codes(diagnose(rows, "rl"))
    assert _codes(diagnose(_rows(30), "rl")) == set()


def test_agent_runs_get_the_cause_of_their_endings_not_single_turn_advice():
    """On agent runs the doctor advised "raise --max_new_tokens" for turns cut by the per-turn cap,
    sent env_error and tool_timeout episodes to reward_failures.jsonl (which has none of them), and
    said nothing of episodes that all overflowed the context."""
    rows = _rows(30, truncated_frac=(0.9, 0.9), termination_turn_length=(0.9, 0.9), turns_mean=(2.0, 2.0))
    truncation = next(f for f in diagnose(rows, "rl") if f.code == "truncation")
    assert "per-turn cap" in truncation.message and truncation.remedy.startswith("raise --max_turn_tokens")
    # a single-turn run logs termination_token_budget too: its completions hit --max_new_tokens (QA U
    # got the agent wording, "episodes ran out of their token budget ... lower --max_turns")
    rows = _rows(30, truncated_frac=(0.9, 0.9), termination_token_budget=(0.9, 0.9))
    truncation = next(f for f in diagnose(rows, "rl") if f.code == "truncation")
    assert "completions hit --max_new_tokens" in truncation.message and "--max_turns" not in truncation.remedy
    rows = _rows(30, termination_context_overflow=(1.0, 1.0))
    cut = next(f for f in diagnose(rows, "rl") if f.code == "episodes_cut_short")
    assert "context_overflow" in cut.message and "--max_turns" in cut.remedy
    rows = _rows(30, termination_env_error=(0.1, 0.1))  # a few: a large share is env_errors (test_doctor_env_errors)
    rows[10].update(unscorable=5, unscorable_termination=4)
    found = {f.code: f for f in diagnose(rows, "rl")}
    assert found["episodes_excluded"].value == "4 episodes" and "env_error" in found["episodes_excluded"].message
    assert "lmpo trajectories" in found["episodes_excluded"].remedy
    assert found["unscorable"].value == "1 completions"  # the reward functions' own failures
    rows[10].update(unscorable=4)
    assert "unscorable" not in _codes(diagnose(rows, "rl"))


def test_supervised_stages():
    falling = [{"step": s, "loss": 3.0 - 0.02 * s} for s in range(10, 110, 10)]
    assert [f.code for f in diagnose(falling, "cpt")] == ["loss_still_falling"]
    assert [f.code for f in diagnose([{"step": 5, "eval_format_accuracy": 0.4}], "sft")] == ["sft_format_low"]
    assert diagnose(falling, "cpt", Thresholds(loss_still_falling=0.5)) == []


def test_findings_quote_metric_value_threshold_and_remedy():
    finding = diagnose(_rows(30, kl=(0.01, 3.0)), "rl")[0]
    text = finding.text()
    assert all(part in text for part in ("kl_runaway", "kl =", "threshold > 1", "--beta"))


def test_a_directory_of_runs_further_in_is_diagnosed_run_by_run(tmp_path, capsys):
    """`lmpo doctor runs/compare` stopped at "no metrics.jsonl": a comparison keeps its runs at
    SEED/METHOD/STAGE, a factcheck at runs/NAME."""
    import shutil

    healthy = HERE / "data" / "healthy_sort_pipeline" / "grpo"
    for run in ("seed0/grpo/grpo", "seed1/grpo/grpo", "runs/held_grpo"):
        shutil.copytree(healthy, tmp_path / "out" / run)
    findings = diagnose_run(tmp_path / "out")
    assert list(findings) == ["runs/held_grpo", "seed0/grpo/grpo", "seed1/grpo/grpo"]
    assert main(["doctor", str(tmp_path / "out")]) == 0
    assert "no problems found in: runs/held_grpo, seed0/grpo/grpo, seed1/grpo/grpo" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no metrics.jsonl here nor in the run directories under it"):
        diagnose_run(tmp_path / "empty")


def _kind_rows(evals: dict[int, tuple[float, dict[str, float]]]) -> list[dict]:
    rows = [{"step": 0}] + _rows(120)  # step 0: the held-out evaluation of the start model
    for row in rows:
        if row["step"] in evals:
            overall, kinds = evals[row["step"]]
            row.update(eval_accuracy=overall, **{f"eval_kind_{k}_accuracy": v for k, v in kinds.items()})
    return rows


# Held-out figures of a real run (`lmpo pipeline --task aftersales --seed 1 --threads 1` on an Intel
# Xeon): GRPO learned to refuse every refund, the in-policy ones too, and kept step 100; by its last
# step (120) it had also lost most `where` tickets.
AFTERSALES_SEED1 = {0: (0.56, {"refund": 0.476, "refund_late": 0.0, "where": 1.0}),
                    50: (0.746, {"refund": 0.0, "refund_late": 1.0, "where": 1.0}),
                    100: (0.748, {"refund": 0.0, "refund_late": 1.0, "where": 1.0}),
                    120: (0.582, {"refund": 0.0, "refund_late": 0.984, "where": 0.698})}


def test_a_kind_the_policy_gave_up_is_named_against_the_model_the_stage_hands_on():
    rows = _kind_rows(AFTERSALES_SEED1)
    final = {"accuracy": 0.748, "breakdown": {"by_kind": {"refund": {"accuracy": 0.0}, "refund_late": {"accuracy": 1.0},
                                                           "where": {"accuracy": 1.0}}}}
    lost = [f for f in diagnose(rows, "rl", final=final) if f.code == "kind_lost"]
    assert [(f.metric, f.value) for f in lost] == [("eval_kind_refund_accuracy", "47.6% → 0.0%")]
    assert "the stage's model" in lost[0].message and "traded that kind for others (held-out accuracy 56.0% → 74.8%)" in lost[0].message
    # Without the stage's result, the last evaluation: `where` fell there too, with the average.
    lost = [f for f in diagnose(rows, "rl") if f.code == "kind_lost"]
    assert [f.metric for f in lost] == ["eval_kind_refund_accuracy", "eval_kind_where_accuracy"]
    assert "the model of step 120" in lost[0].message
    # A kind that rises or falls less than the threshold says nothing; nor does a task without kinds.
    steady = {0: (0.5, {"refund": 1.0, "addr_late": 0.03}), 120: (0.86, {"refund": 0.81, "addr_late": 0.98})}
    assert "kind_lost" not in _codes(diagnose(_kind_rows(steady), "rl"))
    assert "kind_lost" not in _codes(diagnose(_kind_rows({0: (0.5, {}), 120: (0.2, {})}), "rl"))
    # A result.json of another shape falls back to the last evaluation rather than failing.
    for odd in ({"accuracy": 0.7, "breakdown": []}, {"accuracy": None, "breakdown": {"by_kind": {}}}, {"breakdown": None}):
        assert [f.metric for f in diagnose(rows, "rl", final=odd) if f.code == "kind_lost"] == [
            "eval_kind_refund_accuracy", "eval_kind_where_accuracy"]


def test_a_kind_given_up_entirely_is_named_however_small_its_start():
    """After-sales seed 1 on the AMD machine after cccff0a: `refund` 7.9% → 0.0%, every refund
    refused, and the doctor said nothing (the fall was under the 20-point bar)."""
    gone = {0: (0.75, {"refund": 0.079, "refund_late": 0.9, "where": 1.0}),
            120: (0.752, {"refund": 0.0, "refund_late": 1.0, "where": 0.95})}
    lost = [f for f in diagnose(_kind_rows(gone), "rl") if f.code == "kind_lost"]
    assert [(f.metric, f.value) for f in lost] == [("eval_kind_refund_accuracy", "7.9% → 0.0%")]
    assert "never at the end" in lost[0].threshold
    rare = {0: (0.75, {"refund": 0.04}), 120: (0.8, {"refund": 0.0})}  # under 5%: one problem may be luck
    assert "kind_lost" not in _codes(diagnose(_kind_rows(rare), "rl"))


def test_a_held_out_finding_gives_the_figure_of_the_model_the_stage_hands_on():
    """The seed-1 run's format fell by its last evaluation (93.4% → 78.4% at step 120) while the
    model it kept (step 100) ends 100% of its answers well: the finding says both."""
    rows = _kind_rows(AFTERSALES_SEED1)
    for row, fmt in zip([r for r in rows if "eval_accuracy" in r], (0.934, 1.0, 1.0, 0.784)):
        row["eval_format_accuracy"] = fmt
    eos = next(f for f in diagnose(rows, "rl", final={"accuracy": 0.748, "format_accuracy": 1.0}) if f.code == "eos_loss")
    assert eos.value == "93.4% → 78.4%"
    assert eos.message.endswith("(by the last evaluation; the model the stage hands on has held-out format accuracy 100.0%)")
    plain = next(f for f in diagnose(rows, "rl") if f.code == "eos_loss")
    assert "hands on" not in plain.message
    same = next(f for f in diagnose(rows, "rl", final={"format_accuracy": 0.784}) if f.code == "eos_loss")
    assert "hands on" not in same.message


def test_a_kl_or_loss_gone_to_inf_or_nan_is_a_finding():
    """The doctor read only finite values: a run whose KL went to inf (and loss to NaN) at step 90
    of 100 was reported with "no problems found"."""
    rows = _rows(100, kl=(0.01, 0.01), loss=(0.1, 0.1))
    for row in rows[89:]:
        row.update(kl=float("inf"), loss=float("nan"))
    found = [f for f in diagnose(rows, "rl") if f.code == "nonfinite"]
    assert [(f.metric, f.value) for f in found] == [("loss", "nan from step 90 (11 of 100 logged steps)"),
                                                     ("kl", "inf from step 90 (11 of 100 logged steps)")]
    assert all(f.severity == "warning" and "--lr" in f.remedy and "before step 90" in f.remedy for f in found)
    dpo = [{"step": s, "loss": 0.5 if s < 8 else float("nan")} for s in range(1, 11)]
    (loss,) = [f for f in diagnose(dpo, "dpo") if f.code == "nonfinite"]
    assert loss.value == "nan from step 8 (3 of 10 logged steps)" and "--beta" not in loss.remedy
    assert "nonfinite" not in _codes(diagnose(_rows(100, kl=(0.0, 0.1)), "rl"))


def test_a_run_getting_worse_is_a_finding_and_a_noisy_healthy_one_is_not():
    """Training and held-out accuracy both fell from 70% to 10% and the doctor said nothing."""
    rows = _rows(100, reward_mean=(0.7, 0.1), accuracy=(0.7, 0.1))
    for row in rows[9::10]:
        row["eval_accuracy"] = 0.7 - 0.6 * row["step"] / 100
    (worse,) = [f for f in diagnose(rows, "rl") if f.code == "decline"]
    assert worse.metric == "eval_accuracy" and worse.value == "61.0% (best, steps 10–20) → 13.0% (last 2 evaluations)"
    assert "training accuracy fell too" in worse.message
    assert all(flag in worse.remedy for flag in ("--lr", "--collapse_guard", "--stop_patience", "kl"))
    without_evals = [{k: v for k, v in r.items() if k != "eval_accuracy"} for r in rows]
    assert [f.metric for f in diagnose(without_evals, "rl") if f.code == "decline"] == ["accuracy"]
    # A real 20-step PPO run: held-out 35% → 50% → 32.5% of 40 problems, training accuracy of 16
    # samples a step jumping between 0% and 75%. Noise, not decline: it ends where it started.
    noisy = _rows(20, accuracy=(0.5, 0.5))
    for row, acc in zip(noisy, (0.69, 0.31, 0.25, 0.19, 0.31, 0.75, 0.25, 0.25, 0.19, 0.38, 0.19, 0.38, 0.06, 0.62,
                                0.06, 0.31, 0.12, 0.0, 0.25, 0.44)):
        row["accuracy"] = acc
    noisy = [{"step": 0, "eval_accuracy": 0.35}] + noisy
    noisy[10]["eval_accuracy"], noisy[20]["eval_accuracy"] = 0.5, 0.325
    assert "decline" not in _codes(diagnose(noisy, "rl"))
    # Held-out falling while the reward rises is reward hacking, said once.
    hacked = _rows(100, reward_mean=(0.3, 0.9))
    for row in hacked[9::10]:
        row["eval_accuracy"] = 0.6 - 0.4 * row["step"] / 100
    assert _codes(diagnose(hacked, "rl")) == {"reward_hacking"}


def test_a_run_beside_a_pipeline_and_a_comparison_does_not_hide_them(tmp_path, capsys):
    """`lmpo doctor DIR` with DIR/runA (a run), DIR/pipe (a pipeline) and DIR/cmp (a comparison)
    examined runA alone and said "no problems found"."""
    import shutil

    healthy = HERE / "data" / "healthy_sort_pipeline"
    shutil.copytree(healthy / "grpo", tmp_path / "runA")
    shutil.copytree(healthy, tmp_path / "pipe")
    shutil.copytree(healthy / "grpo", tmp_path / "cmp" / "seed0" / "grpo" / "grpo")
    findings = diagnose_run(tmp_path)
    assert list(findings) == ["runA", "cmp/seed0/grpo/grpo", "pipe/cpt", "pipe/sft", "pipe/grpo"]


def test_no_signal_says_what_it_computed_and_names_a_collapse():
    """A run at lr 1e-2: 68.8% right at step 1 (the starting model), 0% from step 2 on. The doctor
    called the first tenth's mean "the starting model's sampled accuracy", prescribed a larger
    group, and printed the entropy logged as -1.9e-6 as "-0.000"."""
    rows = [{"step": s, "reward_mean": 0.0, "accuracy": 0.0, "zero_var_frac": 1.0,
             "entropy": 0.9 if s < 9 else -1.9e-6} for s in range(1, 81)]
    rows[0].update(reward_mean=0.6875, accuracy=0.6875, zero_var_frac=0.75)
    found = {f.code: f for f in diagnose(rows, "rl", group_size=4)}
    assert "68.8% at step 1 (the starting model) and 0.0% over the last 8 steps" in found["no_signal"].message
    assert "--lr" in found["no_signal"].remedy and "--group_size" not in found["no_signal"].remedy
    assert found["entropy_collapse"].value == "0.900 → 0.000 nats/token"
    never = [{**row, "reward_mean": 0.0, "accuracy": 0.0} for row in rows]
    (no_signal,) = [f for f in diagnose(never, "rl", group_size=4) if f.code == "no_signal"]
    assert "the sampled accuracy is 0.0% over the first 8 steps, an estimated pass@4 of 0.0%" in no_signal.message
    assert "--group_size" in no_signal.remedy


def test_skipped_updates_are_totalled_as_each_trainer_logs_them():
    """RL logs each step's skipped updates, the other trainers a running total; the doctor quoted
    the largest value, 1 for an RL run that skipped an update every other step."""
    rows = _rows(100)
    for row in rows:
        row["skipped_updates"] = row["step"] % 2
    (skips,) = [f for f in diagnose(rows, "rl") if f.code == "nonfinite_skips"]
    assert skips.value == "50 updates in 50 steps of 100"
    sft = [{"step": s, "loss": 1.0, **({"skipped_updates": s // 20} if s >= 20 else {})} for s in range(1, 101)]
    (skips,) = [f for f in diagnose(sft, "sft") if f.code == "nonfinite_skips"]
    assert skips.value == "5 updates in all (by step 100)"
    assert "nonfinite_skips" not in _codes(diagnose([{**r, "skipped_updates": 0} for r in _rows(10)], "rl"))


def test_a_missing_path_or_a_file_is_named_as_such(tmp_path, capsys):
    """`lmpo doctor` said "no metrics.jsonl here" of a path that does not exist and of a file;
    given RUN/metrics.jsonl itself, it now reads RUN."""
    assert main(["doctor", str(tmp_path / "nope")]) == 2
    assert f"{tmp_path / 'nope'} does not exist" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("hi")
    assert main(["doctor", str(tmp_path / "notes.txt")]) == 2
    assert f"is a file, not a run directory (the directory holding it is {tmp_path})" in capsys.readouterr().err
    metrics = HERE / "data" / "healthy_sort_pipeline" / "grpo" / "metrics.jsonl"
    assert list(diagnose_run(metrics)) == ["grpo"]


def test_window_means_by_prefix_sums_equal_the_plain_means():
    """`decline`'s window means come from prefix sums (a window sum each was quadratic: 13 s of a
    100k-step run's doctor); they are the plain means to float rounding."""
    import random

    from lmpo.reports.doctor_faults import _windows

    rng = random.Random(0)
    xs = [rng.randint(0, 64) / 64 for _ in range(500)]
    for k in (1, 3, 50, 500):
        plain = [sum(xs[i:i + k]) / k for i in range(len(xs) - k + 1)]
        assert _windows(xs, k) == pytest.approx(plain, abs=1e-12)
