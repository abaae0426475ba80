"""`reward_env` is in every step's row once the environment has given a reward: it was logged
only on steps where some episode's environment reward was nonzero, so its curve had gaps (an
aftersales run had it at steps 1, 5 and 6, not 2 to 4)."""

from __future__ import annotations

import json

from lmpo.trainers import rl_batch
from lmpo.trainers.rl import train_rl
from lmpo.trainers.rl_config import RLConfig


def test_reward_env_is_logged_on_every_step_after_the_first_env_reward(start_model, tmp_path, monkeypatch):
    real_score, steps = rl_batch.score, []
    turn_rewards = {1: None, 2: 0.5, 3: None, 4: 0.0}  # the first episode's, per step; None: the env gave none

    def with_env_rewards(trajectories, *args, **kwargs):
        steps.append(1)
        trajectories[0].turn_rewards = [turn_rewards[len(steps)]]
        return real_score(trajectories, *args, **kwargs)

    monkeypatch.setattr(rl_batch, "score", with_env_rewards)
    out = tmp_path / "rl"
    train_rl(RLConfig(model=start_model, out=str(out), steps=4, prompts_per_step=2, group_size=4, max_new_tokens=6,
                      eval_problems=0, beta=0.0, save_every=0, threads=1, rewards="reward_fns:length=1.0"))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("reward_env") for r in rows] == [None, 0.5 / 8, 0.0, 0.0]  # was [None, 0.0625, None, None]
