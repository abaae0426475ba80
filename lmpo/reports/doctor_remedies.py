"""What a finding tells the user to change, by the trainer that made the run (run.json's `trainer`).

Each check writes its remedy for `lmpo train` RL (trainer "rl"); the other trainers take other
flags (`lmpo train online_dpo` has no --collapse_guard, `lmpo train dpo` no --group_size), so a
finding of theirs takes its remedy from this table. A remedy names the flags of the run's own
command (`--epochs`, not `--sft.epochs`): `lmpo pipeline` and `lmpo doctor PIPELINE_DIR` rewrite
them as the pipeline's (`lmpo.trainers.pipeline_config.as_pipeline_flags`)."""

from __future__ import annotations

from dataclasses import replace

from .doctor_base import Finding


PAIR_TRAINERS = ("dpo", "kto", "orpo", "rm")
"""Offline trainers on preference pairs (or KTO's labelled completions) that log no reward_mean."""

_REFERENCE_HELD = ("lower --lr, raise --beta (holds the policy nearer its reference), or train fewer --epochs; "
                   "keep a checkpoint from before the fall (--save_every N)")
_ENDS_IN_DATA = "; check that the {which} completions in the training data end with EOS"

REMEDIES: dict[str, dict[str, str]] = {
    "decline": {
        "online_dpo": "lower --lr, raise --beta (holds the policy nearer its reference), or run fewer --rounds",
        "rft": "lower --lr, fewer --sft_steps_per_round, or fewer --rounds; raise --accept_threshold if low-reward "
               "samples were kept",
        "dpo": _REFERENCE_HELD,
        "kto": _REFERENCE_HELD,
        "orpo": "lower --lr or train fewer --epochs; keep a checkpoint from before the fall (--save_every N)",
        "rm": "lower --lr or train fewer --epochs; train on more --pairs",
    },
    "eos_loss": {
        "online_dpo": "rank samples with a format reward (--rewards correct=1.0,format=0.1), raise --beta, lower "
                      "--lr; if a reward model ranks them (--reward_model), it likely prefers unterminated text",
        "rft": "raise --accept_threshold (every kept sample is trained on, its form too), lower --lr",
        "dpo": "raise --beta, lower --lr, train fewer --epochs" + _ENDS_IN_DATA.format(which="chosen"),
        "kto": "raise --beta, lower --lr, train fewer --epochs" + _ENDS_IN_DATA.format(which="desirable"),
        "orpo": "lower --lr, train fewer --epochs" + _ENDS_IN_DATA.format(which="chosen"),
    },
    "heldout_fell": {
        "dpo": _REFERENCE_HELD,
        "kto": _REFERENCE_HELD,
        "orpo": "lower --lr or train fewer --epochs; check that the data's chosen side is the one the task grades "
                "right",
        "rm": "lower --lr or train fewer --epochs; check that the data's chosen and rejected sides are not swapped "
              "(--chosen_field, --rejected_field)",
    },
    "reward_hacking": {
        "online_dpo": "rank with the verifier (--rewards correct=1.0), keep the reward model's output bounded, "
                      "raise --beta, run fewer --rounds",
        "rft": "accept by the verifier (--rewards correct=1.0 --accept_threshold 1.0), run fewer --rounds",
    },
    "kind_lost": {
        "rft": "read its failures (`lmpo eval --model RUN_DIR/model --task TASK --out DIR`, then `lmpo trajectories "
               "DIR --failed`); lower --lr, fewer --sft_steps_per_round, or teach the kind before RFT (its "
               "demonstrations in SFT)",
    },
}


def for_trainer(findings: list[Finding], trainer: str) -> list[Finding]:
    """The findings with the remedies of `trainer`'s flags, where its differ from RL's."""
    return [replace(f, remedy=REMEDIES.get(f.code, {}).get(trainer, f.remedy)) for f in findings]
