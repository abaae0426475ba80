"""PPO-ptx (InstructGPT, Ouyang et al. 2022, arXiv:2203.02155): the RL objective plus γ times the
log-likelihood of pre-training data, so that RL does not forget what pre-training taught:

    loss = RL loss + ptx_coef · NLL(ptx batch)

Each optimizer update of the RL loop draws the next ptx batch. The data: `ptx_data` read like
`lmpo train cpt/sft --data` (`text` rows carry loss on every token, as CPT; `prompt`/`completion`
or `messages` rows on the completion, as SFT), or the task's own CPT corpus. The batch order is
an `SFTBatches` (an `EpochOrder`): its state goes into every checkpoint, so a resumed run (or a
collapse-guard rollback) draws exactly the batches the uninterrupted run would have.
"""

from __future__ import annotations

import sys

from lmpo.algos import masked_cross_entropy
from lmpo.envs.data import TokenizedExample, load_sft
from lmpo.trainers.batches import SFTBatches, task_document_ids
from lmpo.trainers.distributed import Distributed
from lmpo.trainers.preflight import example_limit

FOREVER = sys.maxsize  # passes over the ptx data: the RL loop stops drawing, never the data


def ptx_examples(cfg, task, tokenizer) -> list[TokenizedExample]:
    """The ptx data as examples with their loss masks; errors name the file, row and field."""
    if cfg.ptx_data:
        max_length, limit_name = example_limit(cfg.model, tokenizer, cfg.ptx_max_length, "ptx_max_length")
        examples, report = load_sft(cfg.ptx_data, tokenizer, max_length=max_length,
                                    limit_name=limit_name or f"ptx_max_length {max_length}")
        print(f"[ptx] {report.summary()}")
        if not examples:
            raise ValueError(f"ptx_data {cfg.ptx_data}: no examples to train on")
        return examples
    return [TokenizedExample(ids, [1] * len(ids)) for ids in task_document_ids(task, tokenizer, cfg.ptx_documents, cfg.seed)]


def ptx_batches(cfg, task, tokenizer) -> SFTBatches | None:
    """Endless batches of (ids, loss mask, attention mask) when `ptx_coef` > 0, else None."""
    if not cfg.ptx_coef:
        return None
    return SFTBatches(ptx_examples(cfg, task, tokenizer), tokenizer.pad_token_id, cfg.ptx_batch_size, FOREVER,
                      cfg.seed)


def ptx_backward(policy, batch: tuple, coef: float, ctx: Distributed = Distributed()) -> float:
    """Backward of `coef` × the batch's mean token NLL (this process's rows; the token count is
    global, as in the SFT step); returns the NLL (the mean over every process's rows)."""
    device = next(policy.parameters()).device
    ids, mask, attention = (t.to(device) for t in ctx.shard_batch(batch))
    global_tokens = ctx.all_sum(mask[:, 1:].sum().item())
    logits = policy(input_ids=ids, attention_mask=attention).logits
    nll = masked_cross_entropy(logits[:, :-1].float(), ids[:, 1:], mask[:, 1:], num_tokens=global_tokens / ctx.world)
    (coef * nll).backward()
    return ctx.all_sum(nll.item()) / ctx.world


def ptx_state(batches: SFTBatches | None) -> dict | None:
    """The data state a checkpoint keeps (None without ptx)."""
    return {"ptx": batches.state_dict()} if batches is not None else None


def restore_ptx(batches: SFTBatches | None, data: dict | None) -> None:
    if batches is not None and data and "ptx" in data:
        batches.load_state_dict(data["ptx"])


__all__ = ["ptx_backward", "ptx_batches", "ptx_examples", "ptx_state", "restore_ptx"]
