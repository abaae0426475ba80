"""The doctor on an agent run whose environment raised in many episodes (env_error).

Before: it reported `no_signal` and `reward_sparse` (raise --group_size, partial credit, ...) as
if the reward were at fault, with the env_error episodes only in a later `episodes_excluded`.
Failed episodes score nothing and count as wrong, so those figures describe the environment.
Now a large env_error share leads, and the reward-signal findings it explains are left out.

tests/data/env_error_agent_run is a real run: `lmpo train grpo --model tiny --task
half_reset_task.py:HalfTask --steps 6 --prompts_per_step 2 --group_size 4 --eval_problems 0
--threads 1 --max_turn_tokens 60 --max_new_tokens 80 --reward_timeout 0` (its metrics.jsonl,
run.json and config.json; every other environment raises in `reset`, some in `step`)."""

import json
from pathlib import Path

from lmpo.reports.doctor import diagnose
from lmpo.reports.doctor_runs import diagnose_run

RUN = Path(__file__).parent / "data" / "env_error_agent_run"


def _rows() -> list[dict]:
    return [json.loads(line) for line in (RUN / "metrics.jsonl").read_text().splitlines()]


def _scaled(rows: list[dict], share: float) -> list[dict]:
    """The run's rows with `share` of episodes ending in env_error instead."""
    return [{**r, "termination_env_error": share} for r in rows]


def test_a_run_whose_environment_mostly_raised_leads_with_that_not_the_reward():
    findings = diagnose_run(RUN)["env_error_agent_run"]
    first, codes = findings[0], [f.code for f in findings]
    assert first.code == "env_errors" and first.severity == "warning"
    assert first.value == "62.5% of episodes (mean over 6 steps)"
    assert "lmpo trajectories RUN_DIR --failed" in first.remedy
    assert "no_signal and reward_sparse are not reported" in first.message
    assert not {"no_signal", "reward_sparse", "episodes_excluded"} & set(codes)


def test_a_few_env_errors_leave_the_reward_findings_as_they_were():
    codes = [f.code for f in diagnose(_scaled(_rows(), 0.125), "rl")]
    assert "env_errors" not in codes
    assert {"no_signal", "reward_sparse", "episodes_excluded"} <= set(codes)


def test_tool_timeouts_keep_their_episodes_excluded_finding():
    rows = [{**r, "termination_tool_timeout": 0.125} for r in _rows()]
    codes = [f.code for f in diagnose(rows, "rl")]
    assert codes[0] == "env_errors" and "episodes_excluded" in codes and "no_signal" not in codes
