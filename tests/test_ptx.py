"""PPO-ptx: γ × the NLL of pre-training/SFT data added to every RL update (InstructGPT)."""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from lmpo.algos import masked_cross_entropy
from lmpo.envs.data import DataError, TokenizedExample
from lmpo.models import completion_outputs
from lmpo.trainers.batches import SFTBatches
from lmpo.trainers.harness import Updater
from lmpo.trainers.ptx import FOREVER
from lmpo.trainers.rl import train_rl
from lmpo.trainers.rl_batch import Batch
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.rl_update import LossParts, update
from lmpo.trainers.validation import ConfigError


def _rollout_batch(model, generator) -> Batch:
    """Four random completions with their own log-probs as π_old and random advantages."""
    prompt_ids = torch.randint(4, 30, (4, 5), generator=generator)
    completion_ids = torch.randint(4, 30, (4, 6), generator=generator)
    prompt_mask, loss_mask = torch.ones(4, 5, dtype=torch.long), torch.ones(4, 6)
    loss_mask[1, 4:] = 0
    with torch.no_grad():
        old = completion_outputs(model, prompt_ids, prompt_mask, completion_ids).logprobs
    advantages = torch.randn(4, 1, generator=generator).expand(4, 6).contiguous()
    return Batch(prompt_ids, prompt_mask, completion_ids, loss_mask, old, advantages=advantages)


def _ptx_data(pad_id: int) -> SFTBatches:
    gen = torch.Generator().manual_seed(3)
    examples = [TokenizedExample(torch.randint(4, 30, (n,), generator=gen).tolist(), [0] * 3 + [1] * (n - 3))
                for n in (7, 9, 8, 6, 10, 7)]
    return SFTBatches(examples, pad_id, 3, FOREVER, seed=0)


def _sgd_update(model, cfg: RLConfig, batch: Batch, ptx=None) -> tuple[dict, dict]:
    """One update with SGD at lr 1 and no clipping: the weights move by exactly minus the gradient."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    updater = Updater(optimizer, scheduler, grad_clip=0.0, patience=3, where="rl")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stats = update(model, updater, batch, cfg, LossParts.from_config(cfg), beta=0.0, ptx=ptx)
    return stats, {k: before[k] - v for k, v in model.state_dict().items()}


def test_the_gradient_is_the_rl_gradient_plus_gamma_times_the_nll_gradient(tiny_llama, char_tokenizer):
    gamma = 0.7
    batch = _rollout_batch(tiny_llama, torch.Generator().manual_seed(0))
    _, rl_step = _sgd_update(copy.deepcopy(tiny_llama), RLConfig(), batch)
    stats, ptx_step = _sgd_update(copy.deepcopy(tiny_llama), RLConfig(ptx_coef=gamma), batch,
                                  _ptx_data(char_tokenizer.pad_token_id))

    model = copy.deepcopy(tiny_llama)
    ids, mask, attention = next(_ptx_data(char_tokenizer.pad_token_id))  # the first ptx batch
    nll = masked_cross_entropy(model(input_ids=ids, attention_mask=attention).logits[:, :-1].float(), ids[:, 1:],
                               mask[:, 1:])
    nll.backward()
    nll_grad = {name: p.grad for name, p in model.named_parameters()}
    assert stats["ptx_loss"] == pytest.approx(nll.item(), rel=1e-6)
    for name in nll_grad:
        expected = rl_step[name] + gamma * nll_grad[name]
        torch.testing.assert_close(ptx_step[name], expected, rtol=1e-4, atol=1e-6)
    assert any(nll_grad[name].abs().max() > 1e-3 for name in nll_grad)  # the ptx term does move the weights


def test_with_ptx_coef_zero_the_update_is_bit_identical(tiny_llama, char_tokenizer):
    batch = _rollout_batch(tiny_llama, torch.Generator().manual_seed(1))
    plain, plain_step = _sgd_update(copy.deepcopy(tiny_llama), RLConfig(), batch)
    ptx = _ptx_data(char_tokenizer.pad_token_id)
    before = ptx.state_dict()
    off, off_step = _sgd_update(copy.deepcopy(tiny_llama), RLConfig(ptx_coef=0.0), batch, ptx)
    assert all(torch.equal(plain_step[k], off_step[k]) for k in plain_step)
    assert plain == off and "ptx_loss" not in off
    assert ptx.state_dict() == before  # no ptx batch drawn


def test_a_bad_ptx_file_is_an_error_naming_its_row(start_model, tmp_path):
    data = tmp_path / "ptx.jsonl"
    data.write_text(json.dumps({"text": "12345"}) + "\n" + json.dumps({"text": 5}) + "\n")
    cfg = RLConfig(model=start_model, out=str(tmp_path / "rl"), steps=1, ptx_coef=0.1, ptx_data=str(data), threads=1)
    with pytest.raises(DataError, match=r"ptx\.jsonl: row 2: field 'text'"):
        train_rl(cfg)
    with pytest.raises(ConfigError, match="ptx_data only read with ptx_coef > 0"):
        RLConfig(ptx_data=str(data)).validate()


def _run(start_model, out, **options) -> RLConfig:
    cfg = RLConfig(model=start_model, out=str(out), steps=4, prompts_per_step=2, group_size=2, prompt_pool=6,
                   max_new_tokens=6, eval_problems=0, save_every=2, lr=1e-3, warmup_steps=0, threads=1,
                   rewards="reward_fns:length=1.0", reward_timeout=0, **options)
    train_rl(cfg)
    return cfg


def test_sft_rows_train_and_a_resumed_run_draws_the_same_ptx_batches(start_model, tmp_path):
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{n}:", "completion": str(n)[::-1]}) + "\n"
                            for n in range(1000, 1030)))
    full = tmp_path / "full"
    cfg = _run(start_model, full, ptx_coef=1.0, ptx_data=str(data), ptx_batch_size=4)
    rows = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    assert all(r["ptx_loss"] > 0 for r in rows if "reward_mean" in r)
    # the run again from its step-2 checkpoint: the ptx order (8 batches a pass) must go on from there
    resumed = tmp_path / "resumed"
    shutil.copytree(full, resumed, ignore=shutil.ignore_patterns("model", "result.json"))
    train_rl(replace(cfg, out=str(resumed), resume=str(resumed)))
    a, b = (load_file(str(d / "model" / "model.safetensors")) for d in (full, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_without_a_file_the_ptx_data_is_the_tasks_cpt_corpus(char_tokenizer):
    from lmpo.envs import make_task
    from lmpo.trainers.ptx import ptx_examples

    task = make_task("sort_digits")
    examples = ptx_examples(RLConfig(ptx_coef=0.1, ptx_documents=5), task, char_tokenizer)
    assert len(examples) == 5
    assert [char_tokenizer.decode(e.input_ids[:-1]) for e in examples] == task.cpt_corpus(5, 0)
    assert all(e.input_ids[-1] == char_tokenizer.eos_token_id and set(e.loss_mask) == {1} for e in examples)
