"""Writes trl_golden.json: losses, gradients and advantages computed by TRL's own trainer code.

Run in the TRL environment (``bash scripts/setup-trl-venv.sh``), from the repository root:

    .venv-trl/bin/python tests/golden/trl_generate.py

Every value comes from a method of a real TRL trainer (``GRPOTrainer``, ``RLOOTrainer``,
``DPOTrainer``) built on a tiny random model made here (no download). Only the model forward is
replaced: the method that returns per-token log-probs is patched to return fixed float64 tensors
(a leaf whose gradient is recorded), so the loss code itself is TRL's, line for line. Advantages
come from ``_generate_and_score_completions``, which really generates with the tiny model; the
rewards are read from a dataset column by a reward function, so they are the fixed values below.
Nothing of TRL's arithmetic is copied here. lmpo is not imported: tests/golden/test_trl_parity.py
maps each case to lmpo's options and compares.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch

os.environ.setdefault("TQDM_DISABLE", "1")  # TRL's dataset passes print progress bars
OUT = Path(__file__).with_name("trl_golden.json")
B, T = 4, 5  # sequences (pairs for DPO) and completion tokens in the loss cases
LENGTHS = [5, 3, 4, 2]  # loss tokens per row


def tiny_model_dir() -> str:
    """A tiny random Llama and its tokenizer, saved once: TRL loads its reference model from the path."""
    global _MODEL_DIR
    if _MODEL_DIR is None:
        model, tokenizer = tiny_model_and_tokenizer()
        _MODEL_DIR = tempfile.mkdtemp(prefix="trl-golden-model-")
        model.save_pretrained(_MODEL_DIR)
        tokenizer.save_pretrained(_MODEL_DIR)
    return _MODEL_DIR


_MODEL_DIR = None


def tiny_model_and_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{str(i): 3 + i for i in range(10)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, pad_token_id=0, eos_token_id=1,
                         bos_token_id=1)
    return LlamaForCausalLM(config), tokenizer


def column_reward(completions, reward, **kwargs):
    """The reward of each completion is its example's `reward` column (None = unscorable)."""
    return list(reward)


def common_args() -> dict:
    return {"output_dir": tempfile.mkdtemp(prefix="trl-golden-"), "report_to": [], "use_cpu": True,
            "save_strategy": "no", "logging_steps": 1}


def trainer(kind: str, **config):
    """A real TRL trainer of `kind` (grpo, rloo, dpo) with the given config fields."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    from transformers import AutoTokenizer

    model = tiny_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model)
    if kind == "dpo":
        data = Dataset.from_dict({"prompt": ["1 2"] * 2, "chosen": ["3"] * 2, "rejected": ["4"] * 2})
        args = DPOConfig(**common_args(), per_device_train_batch_size=2, **config)
        built = DPOTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    else:
        cls_config, cls = (GRPOConfig, GRPOTrainer) if kind == "grpo" else (RLOOConfig, RLOOTrainer)
        data = Dataset.from_dict({"prompt": ["1 2", "3 4"], "reward": [0.0, 1.0]})
        config.setdefault("num_generations", 4)
        config.setdefault("per_device_train_batch_size", config["num_generations"])
        config.setdefault("max_completion_length", 8)
        args = cls_config(**common_args(), **config)
        built = cls(model=model, reward_funcs=[column_reward], args=args, train_dataset=data,
                    processing_class=tokenizer)
    built.model.train()
    built.current_gradient_accumulation_steps = 1  # set by Trainer's training loop
    return built


def rows(t: torch.Tensor) -> list:
    return t.detach().to(torch.float64).tolist()


# ----------------------------------------------------------------------------------------------
# GRPO / RLOO losses: GRPOTrainer._compute_loss, RLOOTrainer._compute_loss


def loss_inputs(seed: int, log_ratio_scale: float, masked_row: bool = False) -> dict:
    """Fixed per-token log-probs (current, old, reference), mask and advantages, float64."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T, dtype=torch.float64)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1.0
    if masked_row:  # a truncated completion under mask_truncated_completions
        mask[1] = 0.0
    logps = -(torch.rand(B, T, generator=g, dtype=torch.float64) * 2.0 + 0.05)
    old = logps + log_ratio_scale * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = logps + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    advantages = torch.tensor([1.2, -0.7, 0.45, -1.5], dtype=torch.float64)
    return {"logps": logps * mask, "old_logps": old * mask, "ref_logps": ref * mask, "mask": mask,
            "advantages": advantages}


def patched_logps(built, logps: torch.Tensor) -> torch.Tensor:
    """Make `built` score every completion with `logps` (a leaf with grad); return the leaf."""
    leaf = logps.clone().requires_grad_(True)

    def forward(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        return leaf, torch.zeros_like(leaf.detach()), None

    built._get_per_token_logps_and_entropies = forward
    return leaf


def grpo_loss_case(config: dict, inputs: dict, note: str = "", expected_difference: str = "") -> dict:
    built = trainer("grpo", **config)
    leaf = patched_logps(built, inputs["logps"])
    mask = inputs["mask"]
    batch = {"prompt_ids": torch.ones(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
             "completion_ids": torch.full((B, T), 3, dtype=torch.long), "completion_mask": mask.long(),
             "advantages": inputs["advantages"], "old_per_token_logps": inputs["old_logps"],
             "num_items_in_batch": mask.sum()}
    if config.get("beta", 0.0) != 0.0:
        batch["ref_per_token_logps"] = inputs["ref_logps"]
    loss = built._compute_loss(built.model, batch)
    loss.backward()
    case = {"kind": "grpo_loss", "produced_by": "trl.GRPOTrainer._compute_loss", "config": config,
            "effective": grpo_effective(built),
            "inputs": {k: rows(v) for k, v in inputs.items()},
            "outputs": {"loss": loss.item(), "grad_logps": rows(leaf.grad * mask)}}
    return finish(case, note, expected_difference)


def grpo_effective(built) -> dict:
    """The settings `_compute_loss` read, as the trainer resolved them from the config."""
    return {"loss_type": built.loss_type, "beta": built.beta, "epsilon_low": built.epsilon_low,
            "epsilon_high": built.epsilon_high, "delta": built.args.delta,
            "importance_sampling_level": built.importance_sampling_level,
            "use_bias_correction_kl": built.args.use_bias_correction_kl,
            "max_completion_length": built.max_completion_length}


def finish(case: dict, note: str, expected_difference: str) -> dict:
    if note:
        case["note"] = note
    if expected_difference:
        case["expected_difference"] = expected_difference
    return case


def rloo_loss_case(config: dict, inputs: dict, expected_difference: str = "", note: str = "") -> dict:
    built = trainer("rloo", **config)
    leaf = patched_logps(built, inputs["logps"])
    mask = inputs["mask"]
    batch = {"prompt_ids": torch.ones(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
             "completion_ids": torch.full((B, T), 3, dtype=torch.long), "completion_mask": mask.long(),
             "advantages": inputs["advantages"], "old_logps": (inputs["old_logps"] * mask).sum(1)}
    loss = built._compute_loss(built.model, batch)
    loss.backward()
    case = {"kind": "rloo_loss", "produced_by": "trl.RLOOTrainer._compute_loss", "config": config,
            "inputs": {k: rows(v) for k, v in inputs.items()},
            "outputs": {"loss": loss.item(), "grad_logps": rows(leaf.grad * mask)}}
    return finish(case, note, expected_difference)


SEQ_RATIO_KL = ("with importance_sampling_level='sequence', TRL's use_bias_correction_kl multiplies k3 by the "
                "sequence ratio; lmpo's k3_ratio always uses the token ratio (docs/porting.md)")
MASKED_ROW = ("TRL's {} loss counts a fully masked (truncated) completion in its number of sequences; lmpo "
              "counts only rows with a loss token, so TRL's loss is lmpo's x kept/all (docs/porting.md)")
RLOO_RATIO = ("TRL's RLOO loss clips the sequence ratio exp(sum_t log pi/pi_old), one value per sequence, and "
              "averages over sequences; no lmpo loss computes that ratio. On-policy the gradients agree with "
              "aggregation=seq_mean_token_sum_norm max_len_norm=1, the values do not (docs/porting.md)")


def grpo_loss_cases() -> dict:
    off = loss_inputs(seed=1, log_ratio_scale=0.25)  # ratios spread over [~0.5, ~1.8]
    near = loss_inputs(seed=2, log_ratio_scale=3e-4)  # GSPO's clip range is ~3e-4
    wide = loss_inputs(seed=3, log_ratio_scale=0.6)  # ratios beyond delta
    masked = loss_inputs(seed=4, log_ratio_scale=0.25, masked_row=True)
    cases = {
        "grpo_loss_grpo": grpo_loss_case({"loss_type": "grpo", "beta": 0.0}, off),
        "grpo_loss_bnpo": grpo_loss_case({"loss_type": "bnpo", "beta": 0.0}, off),
        "grpo_loss_dapo": grpo_loss_case({"loss_type": "dapo", "beta": 0.0}, off),
        "grpo_loss_dr_grpo": grpo_loss_case({"loss_type": "dr_grpo", "beta": 0.0, "max_completion_length": 8}, off),
        "grpo_loss_clip_higher": grpo_loss_case(
            {"loss_type": "dapo", "beta": 0.0, "epsilon": 0.2, "epsilon_high": 0.28}, off),
        "grpo_loss_cispo": grpo_loss_case({"loss_type": "cispo", "beta": 0.0, "epsilon_high": 1.1}, off),
        "grpo_loss_cispo_default_cap": grpo_loss_case(
            {"loss_type": "cispo", "beta": 0.0, "epsilon": 0.2}, off,
            note="epsilon_high unset: TRL caps the weight at epsilon (0.2)"),
        "grpo_loss_cispo_sequence": grpo_loss_case(
            {"loss_type": "cispo", "beta": 0.0, "epsilon_high": 1.1, "importance_sampling_level": "sequence"}, off),
        "grpo_loss_gspo": grpo_loss_case(
            {"loss_type": "grpo", "beta": 0.0, "importance_sampling_level": "sequence", "epsilon": 3e-4,
             "epsilon_high": 4e-4}, near),
        "grpo_loss_delta": grpo_loss_case(
            {"loss_type": "grpo", "beta": 0.0, "epsilon": 0.2, "epsilon_high": 0.28, "delta": 1.5}, wide),
        "grpo_loss_beta": grpo_loss_case({"loss_type": "grpo", "beta": 0.04, "use_bias_correction_kl": False}, off),
        "grpo_loss_beta_dapo": grpo_loss_case(
            {"loss_type": "dapo", "beta": 0.1, "use_bias_correction_kl": False}, off),
        "grpo_loss_beta_default": grpo_loss_case(
            {"loss_type": "grpo", "beta": 0.04}, off, note="use_bias_correction_kl left at TRL's default"),
        "grpo_loss_bias_correction_kl": grpo_loss_case(
            {"loss_type": "grpo", "beta": 0.1, "use_bias_correction_kl": True}, off),
        "grpo_loss_gspo_beta": grpo_loss_case(
            {"loss_type": "grpo", "beta": 0.1, "use_bias_correction_kl": False,
             "importance_sampling_level": "sequence"}, off),
        "grpo_loss_gspo_bias_correction_kl": grpo_loss_case(
            {"loss_type": "grpo", "beta": 0.1, "use_bias_correction_kl": True,
             "importance_sampling_level": "sequence"}, off, expected_difference=SEQ_RATIO_KL),
        "grpo_loss_masked_row_dapo": grpo_loss_case({"loss_type": "dapo", "beta": 0.0}, masked),
        "grpo_loss_masked_row_grpo": grpo_loss_case({"loss_type": "grpo", "beta": 0.0}, masked,
                                                    expected_difference=MASKED_ROW.format("grpo")),
        "grpo_loss_masked_row_dr_grpo": grpo_loss_case(
            {"loss_type": "dr_grpo", "beta": 0.0, "max_completion_length": 8}, masked,
            expected_difference=MASKED_ROW.format("dr_grpo")),
    }
    if "sapo" in _grpo_loss_types():
        cases["grpo_loss_sapo"] = grpo_loss_case(
            {"loss_type": "sapo", "beta": 0.0}, off,
            expected_difference="lmpo has no SAPO loss (docs/porting.md: not expressible)")
    on_policy = dict(off, old_logps=off["logps"].clone())
    cases["rloo_loss_on_policy"] = rloo_loss_case({"beta": 0.0}, on_policy, expected_difference=RLOO_RATIO)
    cases["rloo_loss_off_policy"] = rloo_loss_case({"beta": 0.0}, off, expected_difference=RLOO_RATIO)
    return cases


def _grpo_loss_types() -> set[str]:
    import inspect

    from trl import GRPOTrainer

    source = inspect.getsource(GRPOTrainer._compute_loss)
    return {name for name in ("sapo", "vespo", "luspo") if f'"{name}"' in source}


# ----------------------------------------------------------------------------------------------
# Advantages: GRPOTrainer / RLOOTrainer._generate_and_score_completions

GROUPS = [  # num_generations = 4; the third group has no signal (all rewards equal)
    [1.0, 0.0, 0.5, 0.25],
    [0.3, 0.9, 0.7, 0.1],
    [0.5, 0.5, 0.5, 0.5],
]


def advantage_case(kind: str, config: dict, rewards: list, seed: int, expected_difference: str = "") -> dict:
    built = trainer(kind, **config)
    g = torch.Generator().manual_seed(seed)
    scored = {}
    if kind == "rloo" and config.get("beta", 0.0) != 0.0:
        # the policy's and the reference's log-probs of the sampled tokens, fixed (TRL would run the models)
        def forward(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
            which = "ref" if model is built.ref_model else "old"
            scored[which] = -torch.rand(input_ids.size(0), logits_to_keep, generator=g, dtype=torch.float64) * 2.0
            return scored[which], None, None

        built._get_per_token_logps_and_entropies = forward
    flat = [r for group in rewards for r in group]
    prompts = [p for p in ["1 2", "3 4", "5 6", "7 8"][:len(rewards)] for _ in range(len(rewards[0]))]
    torch.manual_seed(seed)
    out = built._generate_and_score_completions([{"prompt": p, "reward": r} for p, r in zip(prompts, flat)])
    fn = f"trl.{'GRPOTrainer' if kind == 'grpo' else 'RLOOTrainer'}._generate_and_score_completions"
    case = {"kind": f"{kind}_advantages", "produced_by": fn, "config": config,
            "inputs": {"rewards": flat, "group_size": len(rewards[0]),
                       "completion_mask": rows(out["completion_mask"])},
            "outputs": {"advantages": rows(out["advantages"])}}
    for which in ("old", "ref"):
        if which in scored:
            case["inputs"][f"{which}_logps"] = rows(scored[which])
    return finish(case, "", expected_difference)


def advantage_cases() -> dict:
    unscorable = [[1.0, None, 0.0, 0.5], GROUPS[1]]
    return {
        "grpo_advantages_group": advantage_case("grpo", {"scale_rewards": "group"}, GROUPS, 10),
        "grpo_advantages_batch": advantage_case("grpo", {"scale_rewards": "batch"}, GROUPS, 11),
        "grpo_advantages_none": advantage_case("grpo", {"scale_rewards": "none"}, GROUPS, 12),
        "grpo_advantages_unscorable": advantage_case("grpo", {"scale_rewards": "group"}, unscorable, 13),
        "rloo_advantages": advantage_case("rloo", {"beta": 0.0}, GROUPS, 14),
        "rloo_advantages_normalized": advantage_case("rloo", {"beta": 0.0, "normalize_advantages": True}, GROUPS, 15),
        "rloo_advantages_kl": advantage_case("rloo", {"beta": 0.05}, GROUPS, 16),
        "rloo_advantages_unscorable": advantage_case("rloo", {"beta": 0.0}, unscorable, 17),
    }


# ----------------------------------------------------------------------------------------------
# DPO: DPOTrainer._compute_loss

DPO_LENGTHS = {"chosen": [5, 2, 4, 3], "rejected": [3, 5, 1, 4]}


def dpo_inputs(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    inputs = {}
    for side in ("chosen", "rejected"):
        mask = torch.zeros(B, T, dtype=torch.float64)
        for i, n in enumerate(DPO_LENGTHS[side]):
            mask[i, :n] = 1.0
        logps = -(torch.rand(B, T, generator=g, dtype=torch.float64) * 1.5 + 0.05) * mask
        inputs[f"{side}_logps"], inputs[f"{side}_mask"] = logps, mask
        ref = logps - 2.0 * torch.randn(B, T, generator=g, dtype=torch.float64) * mask
        inputs[f"ref_{side}_logps"] = ref.sum(1)  # the reference's summed log-probs [B]
    check_sorting_matters(inputs)
    return inputs


def check_sorting_matters(x: dict) -> None:
    """AOT sorts over the batch: inputs whose orders all agree would not tell it from DPO."""
    def order(t: torch.Tensor) -> list:
        return torch.argsort(t).tolist()

    chosen, rejected = x["chosen_logps"].sum(1), x["rejected_logps"].sum(1)
    if order(chosen - rejected) == order(x["ref_chosen_logps"] - x["ref_rejected_logps"]):
        raise ValueError("aot: policy and reference margins sort alike; pick another seed")
    if order(chosen - x["ref_chosen_logps"]) == order(rejected - x["ref_rejected_logps"]):
        raise ValueError("aot_unpaired: chosen and rejected log-ratios sort alike; pick another seed")


def dpo_case(config: dict, inputs: dict, note: str = "", expected_difference: str = "") -> dict:
    built = trainer("dpo", precompute_ref_log_probs=True, **config)
    leaf = torch.cat([inputs["chosen_logps"], inputs["rejected_logps"]]).clone().requires_grad_(True)
    token_mask = torch.cat([inputs["chosen_mask"], inputs["rejected_mask"]])
    outputs = SimpleNamespace(log_probs=leaf, entropy=torch.zeros_like(token_mask),
                              mean_logits=torch.zeros_like(token_mask), is_top1=torch.zeros_like(token_mask).bool(),
                              aux_loss=None)
    # one prompt token, then the completion: completion_mask[:, 1:] is the loss mask of the log-probs
    completion_mask = torch.cat([torch.zeros(2 * B, 1, dtype=torch.long), token_mask.long()], dim=1)
    batch = {"input_ids": torch.full((2 * B, T + 1), 3, dtype=torch.long),
             "attention_mask": torch.ones(2 * B, T + 1, dtype=torch.long), "completion_mask": completion_mask,
             "ref_chosen_logps": inputs["ref_chosen_logps"], "ref_rejected_logps": inputs["ref_rejected_logps"]}
    loss = built._compute_loss(lambda **kwargs: outputs, batch, False)
    loss.backward()
    grad = leaf.grad * token_mask
    case = {"kind": "dpo_loss", "produced_by": "trl.DPOTrainer._compute_loss", "config": config,
            "inputs": {k: rows(v) for k, v in inputs.items()},
            "outputs": {"loss": loss.item(), "grad_chosen_logps": rows(grad[:B]),
                        "grad_rejected_logps": rows(grad[B:])}}
    return finish(case, note, expected_difference)


BCO_SHIFT = ("TRL 1.16's bco_pair has no reward shift (delta = 0); lmpo's bco_pair subtracts the batch mean of "
             "the implicit rewards (the BCO paper's delta). lmpo's bco_pair(delta=0) is TRL's (docs/porting.md)")
SFT_MEAN = ("TRL's sft averages all chosen tokens of the batch; lmpo's sft averages each answer's tokens, "
            "then the pairs (docs/porting.md)")


def dpo_cases() -> dict:
    x = dpo_inputs(seed=22)
    return {
        "dpo_sigmoid": dpo_case({"loss_type": "sigmoid", "beta": 0.1}, x),
        "dpo_sigmoid_beta": dpo_case({"loss_type": "sigmoid", "beta": 0.5}, x),
        "dpo_sigmoid_label_smoothing": dpo_case(
            {"loss_type": "sigmoid", "beta": 0.5, "label_smoothing": 0.1}, x,
            note="TRL 1.16's sigmoid ignores label_smoothing"),
        "dpo_hinge": dpo_case({"loss_type": "hinge", "beta": 0.5}, x),
        "dpo_ipo": dpo_case({"loss_type": "ipo", "beta": 0.5}, x),
        "dpo_robust": dpo_case({"loss_type": "robust", "beta": 0.5, "label_smoothing": 0.1}, x),
        "dpo_robust_no_smoothing": dpo_case({"loss_type": "robust", "beta": 0.5, "label_smoothing": 0.0}, x),
        "dpo_exo_pair": dpo_case({"loss_type": "exo_pair", "beta": 0.5, "label_smoothing": 1e-3}, x),
        "dpo_exo_pair_smoothing": dpo_case({"loss_type": "exo_pair", "beta": 0.5, "label_smoothing": 0.2}, x),
        "dpo_nca_pair": dpo_case({"loss_type": "nca_pair", "beta": 0.5}, x),
        "dpo_bco_pair": dpo_case({"loss_type": "bco_pair", "beta": 0.5}, x, expected_difference=BCO_SHIFT),
        "dpo_sppo_hard": dpo_case({"loss_type": "sppo_hard", "beta": 0.5}, x),
        "dpo_aot": dpo_case({"loss_type": "aot", "beta": 0.5}, x),
        "dpo_aot_smoothing": dpo_case({"loss_type": "aot", "beta": 0.5, "label_smoothing": 0.1}, x),
        "dpo_aot_unpaired": dpo_case({"loss_type": "aot_unpaired", "beta": 0.5}, x),
        "dpo_aot_unpaired_smoothing": dpo_case({"loss_type": "aot_unpaired", "beta": 0.5, "label_smoothing": 0.1}, x),
        "dpo_apo_zero": dpo_case({"loss_type": "apo_zero", "beta": 0.5}, x),
        "dpo_apo_down": dpo_case({"loss_type": "apo_down", "beta": 0.5}, x),
        "dpo_discopop": dpo_case({"loss_type": "discopop", "beta": 0.5}, x),
        "dpo_discopop_tau": dpo_case({"loss_type": "discopop", "beta": 0.5, "discopop_tau": 0.2}, x),
        "dpo_sft": dpo_case({"loss_type": "sft", "beta": 0.5}, x, expected_difference=SFT_MEAN),
        "dpo_weighted": dpo_case({"loss_type": ["sigmoid", "nca_pair", "apo_zero"], "loss_weights": [0.6, 0.3, 0.1],
                                  "beta": 0.5}, x),
        "dpo_mpo": dpo_case({"loss_type": ["sigmoid", "bco_pair", "sft"], "loss_weights": [0.8, 0.2, 1.0],
                             "beta": 0.5}, x, expected_difference=f"{BCO_SHIFT}; {SFT_MEAN}"),
    }


def main() -> None:
    import accelerate
    import datasets
    import transformers
    import trl

    warnings.filterwarnings("ignore")
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    cases = {**grpo_loss_cases(), **advantage_cases(), **dpo_cases()}
    golden = {"trl_version": trl.__version__, "transformers_version": transformers.__version__,
              "accelerate_version": accelerate.__version__, "torch_version": torch.__version__,
              "python_version": platform.python_version(),
              "generated_by": "tests/golden/trl_generate.py", "cases": cases}
    OUT.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {OUT} (TRL {trl.__version__})", file=sys.stderr)


if __name__ == "__main__":
    main()
