"""One process of the data-parallel equality test: the GRPO update and a DPO step on a fixed
global batch, through the trainers' own code (Run, Updater, update, preference_step), with the
gradients captured just before the optimizer step.

Run under `torchrun --standalone --nproc_per_node 2 tests/distributed_worker.py MODEL OUT ddp|fsdp`, or
called in-process (`run_checks`) for the one-process reference. Writes OUT/rank{R}.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from lmpo.algos import ADVANTAGES, PREFERENCE_LOSSES
from lmpo.models import load_model, load_tokenizer
from lmpo.trainers.harness import Run, Updater
from lmpo.trainers.preference import PreferenceConfig, encode_pair_ids, preference_step
from lmpo.trainers.rl_batch import Batch
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.rl_update import LossParts, update
from lmpo.trainers.runtime import make_optimizer, make_scheduler

GLOBAL_ROWS, PROMPT_LEN, COMPLETION_LEN, GROUP = 8, 5, 6, 4


def grpo_batch(tokenizer, aggregation: str) -> Batch:
    gen = torch.Generator().manual_seed(7)
    vocab = len(tokenizer)
    prompt_ids = torch.randint(5, vocab, (GLOBAL_ROWS, PROMPT_LEN), generator=gen)
    completion_ids = torch.randint(5, vocab, (GLOBAL_ROWS, COMPLETION_LEN), generator=gen)
    lengths = torch.randint(2, COMPLETION_LEN + 1, (GLOBAL_ROWS,), generator=gen)  # uneven: token counts differ by rank
    loss_mask = (torch.arange(COMPLETION_LEN)[None] < lengths[:, None]).float()
    rewards = torch.randint(0, 2, (GLOBAL_ROWS,), generator=gen).float()
    group_ids = torch.arange(GLOBAL_ROWS // GROUP).repeat_interleave(GROUP)
    advantages = ADVANTAGES.get("grpo")(rewards, group_ids)[:, None].expand_as(loss_mask).contiguous()
    old = -torch.rand(GLOBAL_ROWS, COMPLETION_LEN, generator=gen)  # off-policy: ratios away from 1, clipping active
    return Batch(prompt_ids, torch.ones_like(prompt_ids), completion_ids, loss_mask, old * loss_mask,
                 ref_logprobs=(old - 0.1) * loss_mask, advantages=advantages)


def start(cfg, name: str) -> tuple[Run, object, object, Updater, dict]:
    """The run, tokenizer, prepared policy, an updater, and the dict its gradients land in."""
    run = Run(cfg, name)
    tokenizer = load_tokenizer(cfg.model)
    policy = run.prepare(load_model(cfg.model, tokenizer, keep_dropout=False)).train()
    optimizer = make_optimizer(policy, cfg.lr, 0.0)
    updater = Updater(optimizer, make_scheduler(optimizer, 0, 10), cfg.grad_clip, 3, name)
    grads: dict = {}
    capture_grads(updater, grads)
    return run, tokenizer, policy, updater, grads


def capture_grads(updater: Updater, into: dict) -> None:
    apply = updater.apply

    def recording(loss_finite: bool = True):
        into.update({n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
                     for n, p in enumerate(updater.params) if p.grad is not None})
        return apply(loss_finite)

    updater.apply = recording


def grpo_check(model_dir: str, out: Path, aggregation: str, fsdp: bool = False) -> dict:
    cfg = RLConfig(model=model_dir, out=str(out / f"grpo-{aggregation}-{fsdp}"), threads=1, beta=0.04,
                   kl_placement="loss", aggregation=aggregation, micro_batch_size=1, eval_problems=0, fsdp=fsdp)
    run, tokenizer, policy, updater, grads = start(cfg, "rl")
    rows = torch.arange(GLOBAL_ROWS)
    mine = torch.tensor(run.dist.shard(rows.tolist()))
    batch = grpo_batch(tokenizer, aggregation).select(mine)
    stats = update(run.trained(policy), updater, batch, cfg, LossParts.from_config(cfg), cfg.beta, run.dist)
    run.close()
    return {"stats": stats, "grads": grads}


def dpo_check(model_dir: str, out: Path, fsdp: bool = False) -> dict:
    cfg = PreferenceConfig(model=model_dir, out=str(out / f"dpo-{fsdp}"), threads=1, fsdp=fsdp)
    run, tokenizer, policy, updater, grads = start(cfg, "dpo")
    gen = torch.Generator().manual_seed(3)
    vocab = len(tokenizer)

    def rows(n, lo, hi):
        return [torch.randint(5, vocab, (int(torch.randint(lo, hi, (1,), generator=gen)),), generator=gen).tolist()
                for _ in range(n)]

    prompts, chosen, rejected = rows(8, 3, 7), rows(8, 2, 6), rows(8, 2, 6)
    mine = run.dist.shard(list(range(8)))
    enc = encode_pair_ids([prompts[i] for i in mine], [chosen[i] for i in mine], [rejected[i] for i in mine],
                          tokenizer.pad_token_id)
    ref = (torch.full((len(mine),), -20.0), torch.full((len(mine),), -19.0))
    stats = preference_step(run, run.trained(policy), updater, enc, ref, PREFERENCE_LOSSES.get("dpo"), cfg, {})
    run.close()
    return {"stats": stats, "grads": grads}


def run_checks(model_dir: str, out: Path, fsdp: bool = False) -> dict:
    results = {f"grpo-{agg}": grpo_check(model_dir, out, agg, fsdp) for agg in ("token_mean", "seq_mean_token_mean")}
    results["dpo"] = dpo_check(model_dir, out, fsdp)
    return results


if __name__ == "__main__":
    import os

    model_dir, out, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    rank = int(os.environ.get("RANK", "0"))
    torch.save(run_checks(model_dir, out / f"runs-{rank}", fsdp=mode == "fsdp"), out / f"rank{rank}.pt")
