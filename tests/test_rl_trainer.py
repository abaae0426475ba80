import json

import pytest
import torch
from safetensors.torch import load_file

from lmpo.trainers import rl as rl_module
from lmpo.trainers.rl import Batch, train_rl
from lmpo.trainers.rl_update import LossParts, micro_step
from lmpo.trainers.rl_config import RLConfig


def _cfg(model, out, **kw):
    base = dict(model=model, out=str(out), steps=4, prompts_per_step=2, group_size=4, prompt_pool=64,
                max_new_tokens=6, eval_problems=16, eval_every=2, save_every=2, lr=1e-3, warmup_steps=1,
                lr_schedule="cosine", beta=0.04, threads=1)
    base.update(kw)
    return RLConfig(**base)


EXPECTED_KEYS = {"step", "reward_mean", "reward_std", "accuracy", "format_accuracy", "kl", "entropy", "clip_frac",
                 "completion_len_mean", "completion_len_max", "truncated_frac", "zero_var_frac", "grad_norm", "lr",
                 "time_generate", "time_score", "time_logprobs", "time_advantages", "time_update"}


def test_rl_run_writes_metrics_model_and_checkpoints(start_model, tmp_path):
    result = train_rl(_cfg(start_model, tmp_path / "run"))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]  # step 0: the starting model's held-out accuracy
    assert EXPECTED_KEYS <= set(rows[1])
    assert "eval_accuracy" in rows[0] and "eval_accuracy" in rows[2] and "eval_accuracy" not in rows[1]
    assert result.accuracy == rows[-1]["eval_accuracy"]
    assert (tmp_path / "run" / "model" / "model.safetensors").exists()
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "COMPLETE").exists()


def _weights(run_dir):
    return load_file(str(run_dir / "model" / "model.safetensors"))


def test_resume_after_a_crash_gives_bit_identical_weights(start_model, tmp_path, monkeypatch):
    from lmpo.trainers.prompts import PromptStream

    seen: list[str] = []
    real_take = PromptStream.take
    monkeypatch.setattr(PromptStream, "take", lambda self, n: _record(seen, real_take(self, n)))
    train_rl(_cfg(start_model, tmp_path / "whole"))
    whole_prompts, seen[:] = list(seen), []

    real_update = rl_module.update
    calls = {"n": 0}

    def crashing_update(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash between rollout and update")
        return real_update(*args, **kwargs)

    monkeypatch.setattr(rl_module, "update", crashing_update)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_rl(_cfg(start_model, tmp_path / "crashed"))
    monkeypatch.setattr(rl_module, "update", real_update)
    crashed_prompts, seen[:] = seen[: 2 * 2], []  # steps 1-2 reached the checkpoint
    train_rl(_cfg(start_model, tmp_path / "other", resume=str(tmp_path / "crashed")))
    assert crashed_prompts + seen == whole_prompts  # same prompts, no duplicates or gaps
    whole, resumed = _weights(tmp_path / "whole"), _weights(tmp_path / "crashed")
    assert whole.keys() == resumed.keys()
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    rows = [json.loads(line) for line in (tmp_path / "crashed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]


def _record(seen, problems):
    seen.extend(p.prompt for p in problems)
    return problems


def test_same_seed_same_run(start_model, tmp_path):
    a = train_rl(_cfg(start_model, tmp_path / "a", steps=2, save_every=0))
    b = train_rl(_cfg(start_model, tmp_path / "b", steps=2, save_every=0))
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert a.accuracy == b.accuracy and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_micro_batches_accumulate_to_the_whole_batch_gradient(tiny_llama, aggregation):
    torch.manual_seed(0)
    n, width = 8, 5
    lengths = torch.tensor([5, 3, 1, 4, 5, 2, 2, 5])
    mask = (torch.arange(width)[None] < lengths[:, None]).float()
    batch = Batch(prompt_ids=torch.randint(10, 60, (n, 4)), prompt_mask=torch.ones(n, 4, dtype=torch.long),
                  completion_ids=torch.randint(10, 60, (n, width)), loss_mask=mask,
                  old_logprobs=-torch.rand(n, width) * 3, ref_logprobs=-torch.rand(n, width) * 3,
                  advantages=torch.randn(n, 1).expand(n, width).contiguous())
    grads = []
    for micro in (0, 2, 1):
        cfg = RLConfig(micro_batch_size=micro, prompts_per_step=2, group_size=4, beta=0.1, lr=0.0,
                       aggregation=aggregation, max_new_tokens=width)
        parts = LossParts.from_config(cfg)
        model = tiny_llama.train()
        model.zero_grad(set_to_none=True)
        counts = {"num_sequences": n, "num_tokens": mask.sum().item(), "max_len": width}
        step = micro or n
        for start in range(0, n, step):
            part = batch.select(torch.arange(start, start + step))
            micro_step(model, part, cfg, parts, counts, beta=0.1)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).clone())
    tiny_llama.eval()
    assert torch.allclose(grads[0], grads[1], atol=1e-6) and torch.allclose(grads[0], grads[2], atol=1e-6)
    assert grads[0].abs().sum() > 0


def test_config_arithmetic_is_checked_before_any_model_loads(tmp_path):
    with pytest.raises(ValueError, match="num_minibatches=3 must divide"):
        train_rl(RLConfig(model=str(tmp_path / "missing"), num_minibatches=3))
    with pytest.raises(ValueError, match="micro_batch_size=5 must divide"):
        RLConfig(micro_batch_size=5).validate()


def test_nonfinite_loss_skips_the_update_and_repeated_ones_stop_the_run(start_model, tmp_path, monkeypatch):
    from lmpo.algos import POLICY_LOSSES

    real = POLICY_LOSSES.get("ppo_clip")
    calls = {"n": 0}

    def nan_first_call(*args, **kwargs):
        calls["n"] += 1
        loss, info = real(*args, **kwargs)
        return (loss * float("nan") if calls["n"] == 1 else loss), info

    monkeypatch.setitem(POLICY_LOSSES._entries, "ppo_clip", nan_first_call)
    train_rl(_cfg(start_model, tmp_path / "once", steps=2, save_every=0, beta=0.0))
    rows = [json.loads(line) for line in (tmp_path / "once" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("skipped_updates") for r in rows[1:]] == [1, 0]
    weights = _weights(tmp_path / "once")
    assert all(torch.isfinite(w).all() for w in weights.values())

    monkeypatch.setitem(POLICY_LOSSES._entries, "ppo_clip", lambda *a, **k: (real(*a, **k)[0] * float("nan"), real(*a, **k)[1]))
    with pytest.raises(RuntimeError, match="not finite in 3 consecutive steps"):
        train_rl(_cfg(start_model, tmp_path / "always", steps=5, save_every=0, beta=0.0))


def test_sft_skips_a_nonfinite_step(tmp_path, monkeypatch, start_model):
    from lmpo.trainers import supervised

    real = supervised.masked_cross_entropy
    calls = {"n": 0}

    def nan_second(*args, **kwargs):
        calls["n"] += 1
        loss = real(*args, **kwargs)
        return loss * float("nan") if calls["n"] == 2 else loss

    monkeypatch.setattr(supervised, "masked_cross_entropy", nan_second)
    cfg = supervised.SFTConfig(model=start_model, out=str(tmp_path / "sft"), epochs=1, demonstrations=96,
                               eval_problems=0, log_every=1, threads=1)
    supervised.train_sft(cfg)
    rows = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("skipped_updates") for r in rows] == [None, 1, None]  # 96 demonstrations, batch 32
