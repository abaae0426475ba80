"""The run harness every trainer shares: the non-finite guard in the one update path (DPO and
the reward model included), the device and precision record, memory options that must not
change the update (token-budget micro-batches, chunked log-probs)."""

from __future__ import annotations

import json

import pytest
import torch

from lmpo.models import enable_gradient_checkpointing, load_model, load_tokenizer
from lmpo.trainers.harness import Updater
from lmpo.trainers.preference import PreferenceConfig, train_preference
from lmpo.trainers.reward_model import RewardModelConfig, train_reward_model
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.rl_update import LossParts, micro_batch_rows, update
from lmpo.trainers.runtime import make_optimizer, make_scheduler


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _nan_on_call(monkeypatch, registry, name: str, calls_with_nan: set[int]):
    real = registry.get(name)
    count = {"n": 0}

    def sometimes_nan(*args, **kwargs):
        count["n"] += 1
        loss, info = real(*args, **kwargs)
        return (loss * float("nan") if count["n"] in calls_with_nan else loss), info

    monkeypatch.setitem(registry._entries, name, sometimes_nan)


def test_dpo_skips_a_nonfinite_step_and_stops_after_repeated_ones(start_model, tmp_path, monkeypatch):
    from lmpo.algos import PREFERENCE_LOSSES

    _nan_on_call(monkeypatch, PREFERENCE_LOSSES, "dpo", {2})
    cfg = PreferenceConfig(model=start_model, out=str(tmp_path / "once"), pairs=96, batch_size=32, eval_problems=0,
                           log_every=1, threads=1)
    train_preference(cfg)
    assert [r.get("skipped_updates") for r in _rows(tmp_path / "once")] == [None, 1, None]
    _nan_on_call(monkeypatch, PREFERENCE_LOSSES, "dpo", set(range(100)))
    with pytest.raises(RuntimeError, match="not finite in 3 consecutive steps"):
        train_preference(PreferenceConfig(model=start_model, out=str(tmp_path / "always"), pairs=160, batch_size=32,
                                          eval_problems=0, threads=1))


def test_the_reward_model_skips_a_nonfinite_step(start_model, tmp_path, monkeypatch):
    import lmpo.trainers.reward_model as rm

    real = rm.bradley_terry_loss
    count = {"n": 0}

    def nan_second(*args, **kwargs):
        count["n"] += 1
        loss, info = real(*args, **kwargs)
        return (loss * float("nan") if count["n"] == 2 else loss), info

    monkeypatch.setattr(rm, "bradley_terry_loss", nan_second)
    train_reward_model(RewardModelConfig(model=start_model, out=str(tmp_path / "rm"), pairs=96, heldout_pairs=16,
                                         batch_size=32, log_every=1, threads=1))
    rows = [r for r in _rows(tmp_path / "rm") if "loss" in r]  # after step 0's held-out row
    assert [r.get("skipped_updates") for r in rows[:3]] == [None, 1, None]


def test_the_result_records_device_precision_and_memory(start_model, tmp_path):
    train_preference(PreferenceConfig(model=start_model, out=str(tmp_path / "d"), pairs=32, batch_size=32,
                                      eval_problems=0, threads=1, device="cpu", precision="fp32"))
    result = json.loads((tmp_path / "d" / "result.json").read_text())
    assert (result["device"], result["precision"], result["processes"]) == ("cpu", "fp32", 1)
    assert result["peak_rss_mb"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_a_gpu_is_a_clear_error_before_any_model_loads(tmp_path):
    with pytest.raises(ValueError, match="no CUDA GPU"):
        train_preference(PreferenceConfig(model=str(tmp_path / "missing"), out=str(tmp_path / "x"), device="cuda"))


def _update_grads(start_model, **options) -> tuple[dict, list[torch.Tensor]]:
    """One GRPO update on a fixed batch whose rows differ in length; the gradients before the step."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from distributed_worker import grpo_batch

    cfg = RLConfig(model=start_model, beta=0.04, kl_placement="loss", **options)
    tokenizer = load_tokenizer(start_model)
    policy = load_model(start_model, tokenizer, keep_dropout=False).train()
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(policy)
    optimizer = make_optimizer(policy, cfg.lr, 0.0)
    updater = Updater(optimizer, make_scheduler(optimizer, 0, 10), cfg.grad_clip, 3, "rl")
    grads: list[torch.Tensor] = []
    apply = updater.apply

    def recording(loss_finite=True):
        grads.extend(p.grad.clone() for p in updater.params if p.grad is not None)
        return apply(loss_finite)

    updater.apply = recording
    batch = grpo_batch(tokenizer, cfg.aggregation)
    batch.prompt_mask[:4, :2] = 0  # left padding in some rows, so trimming has columns to drop
    stats = update(policy, updater, batch, cfg, LossParts.from_config(cfg), cfg.beta)
    return stats, grads


@pytest.mark.parametrize("options", [{"micro_batch_tokens": 24}, {"micro_batch_size": 2},
                                     {"logprob_chunk_tokens": 5}, {"gradient_checkpointing": True}])
def test_memory_options_leave_the_update_unchanged(start_model, options):
    whole_stats, whole = _update_grads(start_model)
    stats, grads = _update_grads(start_model, **options)
    for key in ("loss", "policy_loss", "kl", "clip_frac", "entropy"):
        assert stats[key] == pytest.approx(whole_stats[key], rel=1e-6, abs=1e-6), key
    for a, b in zip(grads, whole):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def test_token_budget_micro_batches_pack_rows_under_the_budget(start_model):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from distributed_worker import grpo_batch

    batch = grpo_batch(load_tokenizer(start_model), "token_mean")
    groups = micro_batch_rows(batch, RLConfig(micro_batch_tokens=24))
    assert sorted(i for g in groups for i in g) == list(range(8))
    assert len(groups) > 1
    for rows in groups:
        part = batch.select(torch.tensor(rows)).trimmed()
        assert part.prompt_ids.numel() + part.completion_ids.numel() <= 24 or len(rows) == 1


def test_fsdp_without_torchrun_is_refused_before_the_run_directory_exists(start_model, tmp_path):
    with pytest.raises(ValueError, match="torchrun"):
        train_preference(PreferenceConfig(model=start_model, out=str(tmp_path / "f"), fsdp=True))
    assert not (tmp_path / "f").exists()


def test_the_command_line_stops_on_repeated_nonfinite_steps_with_one_line_naming_the_learning_rate(
        start_model, tmp_path, capsys):
    from lmpo.cli.main import main

    code = main(["train", "sft", "--model", start_model, "--out", str(tmp_path / "run"), "--lr", "1e6",
                 "--demonstrations", "320", "--batch_size", "32", "--eval_problems", "0", "--threads", "1"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("lmpo: error:")]
    assert "not finite in 3 consecutive steps" in line and "(--lr 1e+06): a lower --lr is the usual remedy" in line
