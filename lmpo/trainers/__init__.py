"""Training stages: one run harness, and one loop body per family of methods (layer 5).

`harness.Run` does what every run does besides its loop body: the run directory (and
``--resume``), torchrun's process group, threads and seeds, device and precision, the reference
model, metrics and trackers, progress, checkpoints and the final result; `updater.Updater` is
the one place where a loss becomes an optimizer step. Each family keeps only its loop body:

- `supervised`: continued pre-training and SFT (``train_cpt``, ``train_sft``);
- `rl`: the RL loop (generate, score, log-probs, advantages, update) of which GRPO, Dr. GRPO,
  DAPO, GSPO, RLOO, REINFORCE++, CISPO and PPO are presets (`presets`, `rl_config`,
  `rl_batch`, `rl_update`);
- `preference`, `orpo`, `kto`: offline preference optimisation on pairs (sharing `offline`);
- `online_dpo`, `rft`, `reward_model`: online DPO, rejection-sampling fine-tuning and
  Bradley–Terry reward models;
- `pipeline`: CPT → SFT → RL on one task, with held-out accuracy after each stage.

Each trainer is imported from its own module (``from lmpo.trainers.rl import train_rl``); this
package imports nothing, so importing one trainer loads no other and no import cycle can form.
"""
