"""Runs that factcheck claims share by name are trained with the seed their name carries."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from lmpo.teach.factcheck import clipping, runs
from lmpo.teach.factcheck.context import Context
from lmpo.teach.factcheck.kl import BETAS


def _fake_training(monkeypatch) -> dict[str, int]:
    """train_rl replaced by one that writes a run whose entropy encodes its seed; no model is trained."""
    trained: dict[str, int] = {}

    def train_rl(cfg):
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        trained[out.name] = cfg.seed
        rows = [{"step": s, "reward_mean": 0.5, "entropy": 1.0 + cfg.seed, "clip_frac": 0.1}
                for s in range(1, runs.RL_STEPS + 1)] + [{"step": runs.RL_STEPS, "eval_accuracy": 0.5}]
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (out / "result.json").write_text("{}")

    monkeypatch.setattr("lmpo.trainers.rl.train_rl", train_rl)
    monkeypatch.setattr(Context, "start", lambda self: SimpleNamespace(model_dir="sft-start"))
    monkeypatch.setattr(clipping, "_sampler_ratio_gap", lambda ctx: 0.0)
    return trained


def test_claims_5_and_11_read_runs_of_the_seeds_they_name(tmp_path, monkeypatch):
    trained = _fake_training(monkeypatch)
    ctx = Context(out=tmp_path, threads=1, seed=3)
    clipping._on_policy(ctx)  # claim 5 trains its off-policy control first
    values = clipping._clip_higher(ctx).values
    for name, seed in trained.items():
        assert name.endswith(f"_seed{seed}"), (name, seed)
    assert (values["seed_1"], values["seed_2"]) == (3, 4)  # the seeds follow --seed
    assert (values["entropy_base_1"], values["entropy_base_2"]) == (4.0, 5.0)
    assert sorted(trained) == sorted(["clip_eps0.2_seed3", "clip_eps0.2_seed4", "clip_eps0.28_seed3",
                                      "clip_eps0.28_seed4", f"grpo_beta{BETAS[0]:g}_seed3"])


def test_a_run_name_carries_the_seed_given_to_it(tmp_path, monkeypatch):
    trained = _fake_training(monkeypatch)
    ctx = Context(out=tmp_path, threads=1, seed=0)
    first = runs.rl_run(ctx, "same", seed=1)
    second = runs.rl_run(ctx, "same")
    assert first is not second and trained == {"same_seed1": 1, "same_seed0": 0}


def test_a_run_is_read_without_the_steps_a_rollback_abandoned(tmp_path, monkeypatch):
    """Claims read every row, the steps a collapse-guard rollback abandoned too: a series had
    the abandoned step 3 and its retrained step 3 both, an evaluation the abandoned model's."""
    def train_rl(cfg):
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        rows = [{"step": s, "reward_mean": 0.5, "entropy": 1.0} for s in (1, 2, 3)]
        rows += [{"step": 3, "eval_accuracy": 0.0}, {"step": 3, "rollback": "KL runaway", "to_step": 2}]
        rows += [{"step": 3, "reward_mean": 0.5, "entropy": 2.0}, {"step": 3, "eval_accuracy": 0.5}]
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (out / "result.json").write_text("{}")

    monkeypatch.setattr("lmpo.trainers.rl.train_rl", train_rl)
    monkeypatch.setattr(Context, "start", lambda self: SimpleNamespace(model_dir="sft-start"))
    run = runs.rl_run(Context(out=tmp_path, threads=1), "guarded")
    assert run.series("entropy") == [1.0, 1.0, 2.0] and run.evals() == [0.5]
