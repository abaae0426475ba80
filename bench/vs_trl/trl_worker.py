"""The TRL side of the bench, run with TRL's own interpreter (nothing of lmpo is imported):
GRPOTrainer, DPOTrainer or RewardTrainer without gradient checkpointing, in the workload's
precision (fp32, or `bf16=True`: CPU bf16 autocast), one step per `step` line from the driver.

    TRL_PYTHON bench/vs_trl/trl_worker.py WORKLOAD_JSON OUT_DIR

Step boundaries come from a TrainerCallback (`on_step_begin` waits for the driver, `on_step_end`
reports); phases from wrappers around the trainer's own methods."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import StepClock, emit, pin_threads, timed, wait_for_step  # noqa: E402


def vowels(completions, **kwargs) -> list[float]:
    return [sum(c in "aeiou" for c in text) / max(len(text), 1) for text in completions]


def exact(completions, answer, **kwargs) -> list[float]:
    return [float(text.strip() == a) for text, a in zip(completions, answer)]


def common_args(w: dict, out: Path, steps: int) -> dict:
    """The TrainingArguments both sides share, then the bench's `--trl-option`s (e.g. torch_compile)."""
    return {**dict(output_dir=str(out), learning_rate=w["lr"], lr_scheduler_type="constant", warmup_steps=0,
                max_steps=steps, logging_steps=10**6, save_strategy="no", report_to="none",
                bf16=w["precision"] == "bf16", fp16=False,
                gradient_checkpointing=False, use_cpu=True, seed=w["seed"], dataloader_num_workers=0,
                disable_tqdm=True, max_grad_norm=1.0, weight_decay=0.0), **w.get("trl_options", {})}


def callback(clock_ref: list):
    from transformers import TrainerCallback

    class Steps(TrainerCallback):
        done = 0

        def on_step_begin(self, args, state, control, **kwargs):
            if self.done:
                wait_for_step()
            clock_ref[0] = StepClock()

        def on_step_end(self, args, state, control, **kwargs):
            clock = clock_ref[0]
            result = clock.result()
            if "generate_s" in result:  # GRPO: what is not sampling, scoring or log-probs is the update
                result["update_s"] = result["step_s"] - result.pop("prepare_s")
                result["score_s"] = result.get("score_s", 0.0)
            else:
                result["update_s"] = result["step_s"]
            emit({"ready": True, **result} if self.done == 0 else result)
            self.done += 1

    return Steps()


def run_grpo(w: dict, out: Path, steps: int) -> None:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in open(w["data"])]
    batch = w["prompts_per_step"] * w["group_size"]
    args = GRPOConfig(**common_args(w, out, steps), per_device_train_batch_size=batch, gradient_accumulation_steps=1,
                      num_generations=w["group_size"], max_completion_length=w["max_new_tokens"], temperature=1.0,
                      top_p=1.0, beta=w["beta"], epsilon=0.2, loss_type="grpo", scale_rewards="group",
                      num_iterations=1, steps_per_generation=1, shuffle_dataset=False, log_completions=False)
    reward = exact if w["reward"] == "exact" else vowels
    trainer = GRPOTrainer(model=w["model"], reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows))
    clock_ref: list = [None]
    trainer._generate = timed(clock_ref, "generate", trainer._generate)
    trainer._calculate_rewards = timed(clock_ref, "score", trainer._calculate_rewards)
    real_logps, real_prepare = trainer._get_per_token_logps_and_entropies, trainer._generate_and_score_completions

    def logps(*a, **k):
        if torch.is_grad_enabled():
            return real_logps(*a, **k)
        return timed(clock_ref, "logprobs", real_logps)(*a, **k)

    def prepare(inputs):
        start = time.perf_counter()
        output = real_prepare(inputs)
        clock = clock_ref[0]
        clock.add("prepare", time.perf_counter() - start)
        clock.tokens = {"prompt_tokens": int(output["prompt_mask"].sum()),
                        "completion_tokens": int(output["completion_mask"].sum()),
                        "sequences": int(output["completion_mask"].size(0))}
        return output

    trainer._get_per_token_logps_and_entropies, trainer._generate_and_score_completions = logps, prepare
    trainer.add_callback(callback(clock_ref))
    trainer.train()


def count_tokens(trainer, clock_ref: list) -> None:
    """Record each step's real tokens (the batch's attention mask) for the FLOP count."""
    real = trainer.compute_loss

    def compute_loss(model, inputs, *args, **kwargs):
        mask = inputs.get("attention_mask")
        if mask is not None and clock_ref[0] is not None:
            clock_ref[0].tokens = {"tokens": int(mask.sum()), "sequences": int(mask.size(0))}
        return real(model, inputs, *args, **kwargs)

    trainer.compute_loss = compute_loss


def run_dpo(w: dict, out: Path, steps: int) -> None:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    rows = [json.loads(line) for line in open(w["data"])]
    args = DPOConfig(**common_args(w, out, steps), per_device_train_batch_size=w["batch_size"],
                     gradient_accumulation_steps=1, beta=0.1, loss_type=["sigmoid"], precompute_ref_log_probs=True,
                     max_length=None)
    trainer = DPOTrainer(model=w["model"], args=args, train_dataset=Dataset.from_list(rows))
    clock_ref: list = [None]
    count_tokens(trainer, clock_ref)
    trainer.add_callback(callback(clock_ref))
    trainer.train()


def run_rm(w: dict, out: Path, steps: int) -> None:
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    rows = [json.loads(line) for line in open(w["data"])]
    rows = [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]} for r in rows]
    tokenizer = AutoTokenizer.from_pretrained(w["model"])
    model = AutoModelForSequenceClassification.from_pretrained(w["model"], num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    args = RewardConfig(**common_args(w, out, steps), per_device_train_batch_size=w["batch_size"],
                        gradient_accumulation_steps=1, max_length=None)
    trainer = RewardTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    clock_ref: list = [None]
    count_tokens(trainer, clock_ref)
    trainer.add_callback(callback(clock_ref))
    trainer.train()


def main() -> None:
    workload, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    pin_threads(workload["threads"])
    {"grpo": run_grpo, "dpo": run_dpo, "rm": run_rm}[workload["kind"]](workload, out, 100_000)
    emit({"error": "the trainer ran out of steps"})


if __name__ == "__main__":
    main()
