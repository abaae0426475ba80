"""The trainer options `lmpo compare` matches budgets with: offline DPO's wall-time cap, and what
DPO and online DPO record of the samples they used."""

import json

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
