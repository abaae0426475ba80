"""The weight-sync probe: does the engine sample from the trainer's weights?

After each `sync_weights`, the engine scores one fixed token sequence and the trainer's model
scores it teacher-forced; the two log-prob vectors must agree up to numerics. An engine that
kept sampling from old weights (a sync that never reached it, a LoRA adapter it never
loaded, a stale prefix cache) would otherwise train silently on off-policy data — the failure
TRL PR #3670, verl #7495 and OpenRLHF #1349 reported (see the agent-RL pitfalls notes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from lmpo.rollout.engines import teacher_forced_logprobs

DEFAULT_PROBE_TEXT = "The quick brown fox jumps over the lazy dog. 31415 + 27182 = 58597."
PROBE_PROMPT_TOKENS = 1
"""The first token is the context; every later token of the probe sequence is scored."""


class StaleWeightsError(RuntimeError):
    """The engine's log-probs disagree with the trainer's beyond the probe's tolerance."""


@dataclass(frozen=True)
class ProbeResult:
    max_abs_diff: float
    mean_abs_diff: float
    tokens: int

    def metrics(self) -> dict[str, float]:
        """The figures to log each step (metrics.jsonl)."""
        return {"probe_max_abs_diff": self.max_abs_diff, "probe_mean_abs_diff": self.mean_abs_diff}


def compare_logprobs(engine_logprobs: Sequence[float], trainer_logprobs: Sequence[float]) -> ProbeResult:
    if len(engine_logprobs) != len(trainer_logprobs):
        raise ValueError(f"the engine scored {len(engine_logprobs)} tokens, the trainer {len(trainer_logprobs)}")
    diff = (torch.tensor(engine_logprobs, dtype=torch.float64) - torch.tensor(trainer_logprobs, dtype=torch.float64)).abs()
    if not torch.isfinite(diff).all():
        return ProbeResult(float("inf"), float("inf"), len(diff))
    return ProbeResult(diff.max().item(), diff.mean().item(), len(diff))


def probe_engine(engine, model: torch.nn.Module, probe_ids: Sequence[int], tolerance: float) -> ProbeResult:
    """Compare the engine's log-probs of `probe_ids` (all but the first token, temperature 1)
    with `model`'s teacher-forced ones; raise `StaleWeightsError` when their mean absolute
    difference exceeds `tolerance`. The mean, not the max, is tested: a bf16 engine has rare
    outlier tokens, while stale weights shift every token."""
    if not tolerance > 0:
        raise ValueError(f"tolerance must be > 0, got {tolerance}")
    if len(probe_ids) <= PROBE_PROMPT_TOKENS:
        raise ValueError(f"the probe sequence needs more than {PROBE_PROMPT_TOKENS} token(s), got {len(probe_ids)}")
    score = getattr(engine, "score", None)
    if score is None:
        raise TypeError(f"{type(engine).__name__} has no score(prompt_ids, completion_ids) method, so its weights "
                        f"cannot be probed")
    prompt, completion = list(probe_ids[:PROBE_PROMPT_TOKENS]), list(probe_ids[PROBE_PROMPT_TOKENS:])
    result = compare_logprobs(score(prompt, completion), teacher_forced_logprobs(model, prompt, completion))
    if not result.mean_abs_diff <= tolerance:
        raise StaleWeightsError(
            f"weight-sync probe failed: the engine's log-probs of a fixed {len(probe_ids)}-token sequence differ from "
            f"the trainer's by {result.mean_abs_diff:.4g} on average (max {result.max_abs_diff:.4g}), above the "
            f"tolerance {tolerance:g} (probe_tolerance). {type(engine).__name__} is sampling from weights other than "
            f"the trainer's: check that sync_weights ran after the optimizer step and reached the engine (for a LoRA "
            f"policy, that the new adapter is the one requested), that the engine's prefix cache was reset, and that "
            f"both load the same model; if the gap is only precision (a bf16 engine, an fp32 trainer), raise "
            f"probe_tolerance.")
    return result


def default_probe_ids(tokenizer, text: str | None = None, max_tokens: int = 32) -> list[int]:
    """A fixed probe sequence: `text` (e.g. the first training prompt) or a stock sentence,
    encoded without special tokens and cut to `max_tokens`; ids spread over the vocabulary
    when the text encodes to fewer than two tokens."""
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be >= 2, got {max_tokens}")
    ids = list(tokenizer(text or DEFAULT_PROBE_TEXT, add_special_tokens=False).input_ids)[:max_tokens]
    unk = getattr(tokenizer, "unk_token_id", None)
    if sum(i != unk for i in ids) >= 2:
        return ids
    special = set(getattr(tokenizer, "all_special_ids", []))
    ordinary = [i for i in range(len(tokenizer)) if i not in special]
    step = max(1, len(ordinary) // max_tokens)
    return ordinary[::step][:max_tokens]
