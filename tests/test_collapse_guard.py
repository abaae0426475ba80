"""The collapse guard: a planted learning-rate spike collapses the policy's entropy; the guard
rolls back to the last checkpoint with a lower learning rate, and the run recovers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from html import escape as html_escape

import pytest

from lmpo.trainers.collapse_guard import CollapseGuard, GuardOptions
from lmpo.trainers.rl import train_rl
from lmpo.trainers.rl_config import RLConfig


def test_the_alarms():
    guard = CollapseGuard(GuardOptions(collapse_guard=True, guard_window=2, guard_reward_drop=0.3))
    assert guard.check({"entropy": 2.0, "reward_mean": 0.5}, 0, 3) is None
    assert "entropy collapse" in guard.check({"entropy": 0.1, "reward_mean": 0.5}, 0, 3)
    assert "KL runaway" in guard.check({"entropy": 2.0, "kl": 5.0, "reward_mean": 0.5}, 0, 3)
    assert guard.check({"entropy": 2.0, "reward_mean": 0.9}, 0, 3) is None
    assert guard.check({"entropy": 2.0, "reward_mean": 0.1}, 0, 3) is None  # mean 0.5: best 0.7 − 0.3 = 0.4
    assert "reward drop" in guard.check({"entropy": 2.0, "reward_mean": 0.1}, 0, 3)  # mean 0.1
    assert "non-finite" in guard.check({"entropy": 2.0, "reward_mean": 0.5}, 3, 3)
    assert guard.rolled_back() == 0.5


def test_the_rollback_skips_the_weights_the_alarm_was_measured_on():
    """Step 9's samples came from the weights saved at step 8: going back there would raise the
    same alarm again; the guard goes to the newest checkpoint before it, then further back."""
    guard = CollapseGuard(GuardOptions(collapse_guard=True))
    saved = [Path(f"ckpt/step_{n:06d}") for n in (4, 6, 8)]
    assert guard.target(saved, alarm_step=9) == saved[1]
    assert guard.target(saved, alarm_step=8) == saved[0]  # the alarm came back from step 6
    assert guard.target(saved, alarm_step=12) == saved[2]  # a newer one was written since
    assert CollapseGuard(GuardOptions(collapse_guard=True)).target(saved[:1], alarm_step=5) == saved[0]


def test_a_learning_rate_spike_is_rolled_back_and_the_run_recovers(start_model, tmp_path):
    out = tmp_path / "rl"
    # lr 0.05 is ~500x the default: within a few steps the policy's entropy collapses
    train_rl(RLConfig(model=start_model, out=str(out), steps=14, prompts_per_step=2, group_size=4, lr=0.05,
                      warmup_steps=0, lr_schedule="constant", beta=0.0, eval_problems=0, save_every=2, threads=1,
                      rewards="reward_fns:length=1.0", collapse_guard=True, guard_entropy_ratio=0.5,
                      guard_lr_factor=0.01, guard_reward_drop=10.0))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rollbacks = [r for r in rows if "rollback" in r]
    assert rollbacks and "entropy collapse" in rollbacks[0]["rollback"]
    assert rollbacks[0]["to_step"] % 2 == 0 and rollbacks[0]["to_step"] < rollbacks[0]["step"]
    last = rollbacks[-1]
    after = [r for r in rows[rows.index(last) + 1:] if "entropy" in r]
    first = next(r["entropy"] for r in rows if "entropy" in r)
    assert after and all(r["entropy"] >= 0.5 * first for r in after)  # recovered: no collapse after
    assert after[-1]["step"] == 14 and after[-1]["lr"] == pytest.approx(0.05 * 0.01 ** len(rollbacks))
    from lmpo.reports.doctor_runs import diagnose_run

    shown = [f for f in diagnose_run(str(out))["rl"] if f.code == "rollback"]  # the doctor (and the pipeline) say so
    assert shown and f"{len(rollbacks)} time(s)" in shown[0].message
    assert rollbacks[0]["new_lr"] == pytest.approx(0.05 * 0.01)  # logged: the rate training goes on with
    from lmpo.reports import write_report

    html = write_report(out).read_text()  # the report shows each rollback: a table row, and markers on the curves
    table = html[html.index("Collapse-guard rollbacks"):]
    table = table[:table.index("</table>")]
    assert table.count("<tr>") == 1 + len(rollbacks)
    for rb in rollbacks:
        assert html_escape(rb["rollback"]) in table and f'<td class="num">{rb["to_step"]}</td>' in table
        assert f'<td class="num">{rb["new_lr"]:.3g}</td>' in table
    assert "to_step" not in html and "to_elapsed_s" not in html  # a rollback's own figures are not drawn as metrics
    # its clock and the checkpoint's: `lmpo compare` leaves the abandoned branch's time out, as its samples
    assert all(0 < rb["to_elapsed_s"] < rb["elapsed_s"] for rb in rollbacks)
    from lmpo.teach.compare.records import read_run

    record = read_run(out, "grpo", 0, "rl")
    seconds = json.loads((out / "result.json").read_text())["seconds"]
    assert 0 < record.abandoned_seconds and record.seconds == pytest.approx(seconds - record.abandoned_seconds)


def test_rollbacks_are_marked_on_the_curves():
    from matplotlib.figure import Figure

    from lmpo.reports.rollbacks import mark_rollbacks, read_rollbacks

    rows = [{"step": 3, "entropy": 1.0}, {"step": 6, "rollback": "entropy collapse", "to_step": 4, "lr_scale": 0.5,
                                           "new_lr": 5e-5}, {"step": 5, "entropy": 1.0}]
    rollbacks = read_rollbacks(rows)
    assert [(r.step, r.to_step, r.new_lr) for r in rollbacks] == [(6.0, 4.0, 5e-5)]
    ax = Figure().subplots()
    mark_rollbacks(ax, rollbacks)
    line, = ax.lines
    assert list(line.get_xdata()) == [6.0, 6.0] and line.get_label() == "rollback"
    assert len(ax.patches) == 1  # the undone steps 4..6, shaded


def test_the_start_may_be_gone_back_to_again():
    """A step-0 checkpoint holds the model the run started from: not at fault when the alarm comes
    back from there, so the guard returns to it (with a lower rate each time)."""
    guard = CollapseGuard(GuardOptions(collapse_guard=True))
    start = [Path("ckpt/step_000000")]
    assert guard.target(start, alarm_step=2) == start[0]
    assert guard.target(start, alarm_step=2) == start[0]
    assert CollapseGuard(GuardOptions(collapse_guard=True)).target([Path("ckpt/step_000005")], 7) is not None
    later = CollapseGuard(GuardOptions(collapse_guard=True))
    assert later.target([Path("ckpt/step_000005")], 7) == Path("ckpt/step_000005")
    assert later.target([Path("ckpt/step_000005")], 7) is None  # came back from step 5: not the start


def test_a_blow_up_at_the_first_step_goes_back_to_the_start_and_a_hopeless_one_stops_in_one_line(
        start_model, tmp_path, capsys):
    from lmpo.cli.main import main

    out = tmp_path / "rl"
    args = ["train", "grpo", "--model", start_model, "--out", str(out), "--steps", "4", "--prompts_per_step", "2",
            "--group_size", "4", "--eval_problems", "0", "--save_every", "3", "--threads", "1", "--lr", "0.05",
            "--warmup_steps", "0", "--collapse_guard", "true", "--guard_kl_max", "1e-9", "--guard_max_rollbacks", "2",
            "--rewards", "reward_fns:length=1.0"]
    # step 1 samples the start (KL 0); every later step's KL is above 1e-9: the start is tried twice, then the run stops
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "lmpo: error: collapse guard: 2 rollbacks did not help" in err and "Traceback" not in err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["to_step"]) for r in rows if "rollback" in r] == [(2, 0), (2, 0)]


BATCHES = {"calls": 0}


def down_for_two_steps(task, problems, completions, terminated):
    """Scores 1.0, but the third and fourth steps' batches (and their one-by-one retries) fail."""
    if len(completions) > 1:
        BATCHES["calls"] += 1
    if BATCHES["calls"] in (3, 4):
        raise RuntimeError("scoring service briefly down")
    return [1.0] * len(completions)


def test_a_step_whose_reward_could_score_nothing_is_no_reward_drop(start_model, tmp_path):
    """Such a step was logged as reward_mean 0.0; the guard read it as a collapse, rolled good
    training back, halved the learning rate and blamed it. It now has no reward_mean (unscorable
    says why), and the guard's window skips it."""
    assert CollapseGuard(GuardOptions(collapse_guard=True)).check({"entropy": 1.0, "unscorable": 8}, 0, 3) is None
    BATCHES["calls"] = 0
    out = tmp_path / "rl"
    train_rl(RLConfig(model=start_model, out=str(out), steps=6, prompts_per_step=2, group_size=4, beta=0.0,
                      eval_problems=0, save_every=2, threads=1, reward_timeout=0.0,
                      rewards="test_collapse_guard:down_for_two_steps=1.0", collapse_guard=True, guard_window=2,
                      guard_reward_drop=0.4))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in rows if "rollback" in r]
    steps = {r["step"]: r for r in rows if "unscorable" in r}
    assert [s for s in sorted(steps) if "reward_mean" not in steps[s]] == [3, 4]
    assert steps[3]["unscorable"] == steps[4]["unscorable"] == 8 and steps[5]["reward_mean"] == 1.0


def test_the_doctor_reads_the_run_a_rollback_kept_not_the_branch_it_abandoned(tmp_path):
    """It averaged over the rolled-back steps too (QA F11): here all-equal groups in every kept step,
    none in the abandoned ones, which read as 50% and no finding."""
    from lmpo.reports.doctor_runs import diagnose_stage

    rows = [{"step": s, "reward_mean": 0.5, "accuracy": 0.5, "zero_var_frac": 0.0} for s in range(1, 5)]
    rows.append({"step": 4, "rollback": "KL runaway", "to_step": 0, "lr_scale": 0.5})
    rows += [{"step": s, "reward_mean": 0.0, "accuracy": 0.0, "zero_var_frac": 1.0} for s in range(1, 5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = {f.code: f for f in diagnose_stage(tmp_path)}
    assert found["no_signal"].value == "100.0%" and "rollback" in found


def test_a_nan_only_in_an_abandoned_branch_is_named_as_such_not_as_the_kept_runs(tmp_path):
    """A loss gone NaN at step 3 of a branch the guard then rolled back was not reported at all
    (the doctor reads the kept run). It is a note that the learning rate diverged once, in the
    abandoned branch, not a `nonfinite` warning about the kept run, whose figures are finite."""
    from lmpo.reports.doctor_runs import diagnose_stage

    rows = [{"step": s, "reward_mean": 0.5, "accuracy": 0.5, "zero_var_frac": 0.0, "loss": 0.1} for s in range(1, 5)]
    rows[2]["loss"] = math.nan
    rows.append({"step": 4, "rollback": "KL runaway: kl 1.9 > 1", "to_step": 2, "lr_scale": 0.5})
    rows += [{"step": s, "reward_mean": 0.5, "accuracy": 0.5, "zero_var_frac": 0.0, "loss": 0.1} for s in (3, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = {f.code: f for f in diagnose_stage(tmp_path)}
    assert "nonfinite" not in found
    note = found["nonfinite_abandoned"]
    assert note.severity == "note" and note.value == "nan at step 3"
    assert "in an abandoned branch (rolled back at step 4 to step 2: KL runaway" in note.message
    assert "its loss stayed finite" in note.message and "--lr" in note.remedy
    rows[-1]["loss"] = math.inf  # non-finite in the kept run too: that is the kept run's warning
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = {f.code: f for f in diagnose_stage(tmp_path)}
    assert found["nonfinite"].severity == "warning" and "in the kept run too" in found["nonfinite_abandoned"].message
