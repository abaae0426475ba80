"""A step in which no token is trained (every episode masked, say each one ended on a length
limit): its token means (entropy, KL, loss, clip fraction) are not measurements, so they are not
logged; the collapse guard and the doctor do not read them as an entropy collapse."""

from __future__ import annotations

import json

from lmpo.reports.doctor_runs import diagnose_run
from lmpo.trainers import rl as rl_module
from lmpo.trainers.rl import train_rl
from lmpo.trainers.rl_config import RLConfig

TOKEN_FIGURES = ("entropy", "kl", "loss", "policy_loss", "clip_frac")


def test_a_step_without_trained_tokens_logs_no_token_means_and_raises_no_alarm(start_model, tmp_path, monkeypatch):
    real_make_batch, calls = rl_module.make_batch, []

    def second_step_all_masked(*args, **kwargs):
        batch = real_make_batch(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            batch.loss_mask = batch.loss_mask * 0
        return batch

    monkeypatch.setattr(rl_module, "make_batch", second_step_all_masked)
    out = tmp_path / "rl"
    train_rl(RLConfig(model=start_model, out=str(out), steps=3, prompts_per_step=2, group_size=4, max_new_tokens=6,
                      eval_problems=0, beta=0.04, target_kl=0.01, save_every=1, threads=1, collapse_guard=True,
                      rewards="reward_fns:length=1.0"))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in rows if "rollback" in r]  # was: "entropy collapse: entropy 0.0000 < 0.1 x ..."
    assert [r["step"] for r in rows] == [1, 2, 3]
    masked = rows[1]
    assert masked["trained_tokens"] == 0 and not [k for k in TOKEN_FIGURES if k in masked]
    assert masked["beta"] == rows[2]["beta"]  # the adaptive KL coefficient had no KL to adapt to
    for row in (rows[0], rows[2]):
        assert row["trained_tokens"] > 0 and all(k in row for k in TOKEN_FIGURES) and row["entropy"] > 1.0
    assert "entropy_collapse" not in [f.code for f in diagnose_run(out)["rl"]]
