"""The trainer options `lmpo compare` matches budgets with: offline DPO's wall-time cap, and what
DPO and online DPO record of the samples they used."""

import json
import re

from lmpo.cli.main import main
from tests.test_max_minutes_resume import CAP, clock  # noqa: F401 (a fixture)


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_dpo_stops_at_its_wall_time_cap_and_evaluates_that_model(start_model, tmp_path, clock):
    # the fake clock (one second per update): a real one's 0.06 s now run out in the reference pass, which stops too
    out = tmp_path / "dpo"
    assert main(["train", "dpo", "--model", start_model, "--out", str(out), "--pairs", "4000", "--batch_size", "8",
                 "--eval_problems", "16", "--threads", "1", "--max_minutes", CAP]) == 0
    rows, result = _rows(out), json.loads((out / "result.json").read_text())
    stopped = [r for r in rows if "stopped" in r]
    assert len(stopped) == 1 and stopped[0]["step"] < 500
    last = rows[-1]
    assert last["step"] == stopped[0]["step"] and "eval_accuracy" in last and last["elapsed_s"] > 0.06
    assert result["pairs_trained"] == 8 * stopped[0]["step"] and result["completion_tokens"] > 0


def test_dpo_without_a_cap_trains_every_pair_and_counts_them(start_model, tmp_path):
    out = tmp_path / "dpo"
    assert main(["train", "dpo", "--model", start_model, "--out", str(out), "--pairs", "24", "--batch_size", "8",
                 "--eval_problems", "8", "--threads", "1"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["pairs_trained"] == 24 and not [r for r in _rows(out) if "stopped" in r]
    assert [r["step"] for r in _rows(out) if "eval_accuracy" in r] == [0, 3]


def test_online_dpo_records_the_samples_and_tokens_of_each_round(start_model, tmp_path):
    out = tmp_path / "online"
    assert main(["train", "online_dpo", "--model", start_model, "--out", str(out), "--rounds", "2",
                 "--prompts_per_round", "4", "--samples_per_prompt", "3", "--batch_size", "4",
                 "--eval_problems", "8", "--threads", "1"]) == 0
    rounds = [r for r in _rows(out) if "round" in r]
    assert [r["samples"] for r in rounds] == [12, 12]
    assert all(12 <= r["completion_tokens"] <= 12 * 12 for r in rounds)  # 1 to max_new_tokens each


def test_a_dpo_whose_reference_pass_outlasts_the_time_budget_counts_as_the_start_model(start_model, tmp_path, capsys):
    """`lmpo compare --budget time` with DPO whose reference log-prob pass alone used up --minutes:
    the DPO run stopped before step 1 (exit 1, no model) and the whole comparison aborted with
    "compare: dpo (seed 0) failed with exit code 1". Now DPO counts as 0 steps trained (the start
    model's accuracy, marked, not ranked), the other methods are compared, and a line says to
    raise --minutes. 0.0001 minutes: loading the model alone outlasts it, so the pass stops at
    its first batch; GRPO stops after its first step."""
    out = tmp_path / "cmp"
    argv = ["compare", "--methods", "grpo,dpo", "--seeds", "0", "--budget", "time", "--minutes", "0.0001",
            "--samples", "128", "--threads", "1", "--device", "cpu", "--start", start_model, "--out", str(out)]
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert re.search(r"seed 0 dpo: trained 0 steps in \d+\.\d s: the wall-time cap of 0.0001 minutes stopped the "
                     r"reference log-prob pass at batch 0 of \d+, before any training step; it counts as the start", said)
    # its log says what the comparison made of it, not the trainer's "(no model written)" alone
    log_line = next(line for line in (out / "seed0" / "dpo" / "log.txt").read_text().splitlines()
                    if line.startswith("[compare]"))
    assert "(no model written)" not in log_line and "the comparison counts it as the start model" in log_line
    assert "RuntimeWarning" not in (out / "seed0" / "grpo" / "log.txt").read_text()  # runpy's, in every run's log
    data = json.loads((out / "compare.json").read_text())
    runs = {r["method"]: r for r in data["runs"]}
    assert runs["dpo"]["no_steps"] and runs["dpo"]["samples"] == 0 and runs["dpo"]["peak_rss_mb"] > 0
    assert runs["dpo"]["accuracy"] == data["start"]["mean"] == runs["grpo"]["start_accuracy"]
    assert not runs["grpo"]["no_steps"] and runs["grpo"]["samples"] > 0
    assert data["recommendation"]["best"] == "grpo"
    lines = data["recommendation"]["lines"]
    assert any(line.startswith("dpo: trained 0 steps on every seed: its reference log-prob pass alone took longer "
                               "than --minutes 0.0001") and "Raise --minutes" in line for line in lines)
    # its wall time to a tenth, and what it was spent on (it read "0" where it took under half a second)
    assert re.search(r"\| dpo \| \d+\.\d% \(0 steps: the start model\) \| \d+\.\d \(reference pass only\) \|",
                     (out / "compare.md").read_text())
    assert not (out / "seed0" / "dpo" / "dpo" / "model").exists()
    log = (out / "seed0" / "dpo" / "log.txt").stat().st_mtime_ns
    assert main(argv) == 0  # the rerun keeps the 0-step run: at this budget that is its result
    assert (out / "seed0" / "dpo" / "log.txt").stat().st_mtime_ns == log
