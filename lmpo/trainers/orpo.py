"""ORPO (Hong, Lee & Thorne 2024, "ORPO: Monolithic Preference Optimization without Reference
Model", arXiv:2403.07691): SFT and preference alignment in one loss, without a reference model.

Per pair, ``loss = NLL(y_w) + lambda * -log sigma(log odds(y_w) - log odds(y_l))`` with the NLL
and the odds taken on the completions' average token log-probs (`lmpo.algos.orpo`). The pairs,
batches and loop are DPO's (`train_pairs`); no reference log-probs are computed.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmpo.algos import orpo
from lmpo.trainers.offline import OfflineConfig, offline_problems
from lmpo.trainers.pairs import PairColumns
from lmpo.trainers.preference import train_pairs
from lmpo.trainers.result import StageResult
from lmpo.trainers.validation import raise_if_any


@dataclass
class ORPOConfig(PairColumns, OfflineConfig):
    model: str = "runs/sft/model"
    """Hugging Face model directory of the policy to start from (ORPO needs no reference)."""
    out: str = "runs/orpo"
    """Run directory: metrics.jsonl, checkpoints/, the final model in `model/`, result.json."""
    beta: float = 0.1
    """ORPO's lambda (TRL's `beta`): weight of the odds-ratio term beside the chosen reply's NLL."""

    def validate(self) -> None:
        raise_if_any("orpo", offline_problems(self), self)


def train_orpo(cfg: ORPOConfig) -> StageResult:
    cfg.validate()
    return train_pairs(cfg, orpo, "orpo", "orpo", {})
