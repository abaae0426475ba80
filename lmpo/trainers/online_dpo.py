"""Online (iterative) DPO: sample several completions per prompt from the current policy,
rank them with the verifier or a reward model, pair the best with the worst (ties skipped),
take DPO steps on those pairs, and repeat with fresh prompts."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch

from lmpo.algos import PREFERENCE_LOSSES
from lmpo.envs import make_task
from lmpo.rollout.agent_loop import EpisodeRunner
from lmpo.rollout.evaluation import evaluate
from lmpo.rollout.trajectory import to_rollout
from lmpo.rollout.reward_runner import RewardRunner
from lmpo.models import load_model, load_tokenizer, save_model
from lmpo.rollout import SamplingParams
from lmpo.trainers.checkpoint import resume_training, save_checkpoint
from lmpo.trainers.faults import fault_point
from lmpo.trainers.preference import (PreferenceConfig, encode_pair_ids, preference_problems, preference_step,
                                      sequence_logps)
from lmpo.trainers.progress import StageProgress
from lmpo.trainers.prompts import PromptStream
from lmpo.trainers.result import StageResult
from lmpo.trainers.reward_watch import watch_rewards
from lmpo.trainers.run_dir import open_run_dir
from lmpo.trainers.validation import at_least, raise_if_any, reward_problems, sampling_problems
from lmpo.trainers.runtime import (MetricsLog, keep_rows_through, make_optimizer, make_scheduler, options_for,
                                   setup_torch)


@dataclass
class OnlineDPOConfig(PreferenceConfig):
    out: str = "runs/online_dpo"
    """Run directory: metrics.jsonl, the final model in `model/`, result.json."""
    rounds: int = 40
    """Sample → rank → train rounds."""
    prompts_per_round: int = 64
    """Prompts sampled each round."""
    samples_per_prompt: int = 4
    """Completions per prompt; the best and the worst form a pair."""
    temperature: float = 1.0
    """Sampling temperature."""
    max_new_tokens: int = 12
    """Completion token limit."""
    rewards: str = "correct=1.0"
    """How completions are ranked: reward functions and weights, as in RL (`rm=1.0` uses `reward_model`)."""
    reward_model: str = ""
    """Directory of a trained reward model for the `rm` reward."""
    reward_timeout: float = 60.0
    """Seconds a reward function may take per call; the reward model and your own functions run in their own process, killed when it overruns (0 = in this process, no timeout)."""
    reward_failure: Literal["unscorable", "error"] = "unscorable"
    """A completion whose reward fails (raises, times out, None/NaN) is left out of the ranking, or the run stops with an error."""
    prompt_pool: int = 20_000
    """Training prompts drawn from the task's training split."""
    max_unscorable_steps: int = 3
    """Stop with an error when every completion was unscorable in this many consecutive rounds (0 = never)."""
    reward_memory_mb: int = 4096
    """Memory limit of each reward worker process in MiB."""
    eval_every: int = 10
    """Evaluate on held-out problems every this many rounds (and at the end)."""
    save_every: int = 10
    """Write a resumable checkpoint every this many rounds (0 = only the final model); checkpoints/step_N is round N."""

    def validate(self) -> None:
        problems = preference_problems(self) + at_least(self, 1, "rounds", "prompts_per_round", "eval_every",
                                                        "max_new_tokens")
        if self.samples_per_prompt < 2:
            problems.append(f"samples_per_prompt={self.samples_per_prompt}: a pair is the best and the worst of a "
                            f"prompt's samples, so at least 2 are needed")
        if self.data:
            problems.append("online DPO samples its own pairs; --data is for `lmpo train dpo`")
        problems += reward_problems(self) + sampling_problems(self)
        raise_if_any("online DPO", problems)


def train_online_dpo(cfg: OnlineDPOConfig) -> StageResult:
    cfg.validate()
    started = time.perf_counter()
    threads = setup_torch(cfg.threads, cfg.seed)
    loss_fn = PREFERENCE_LOSSES.get(cfg.loss)
    task = make_task(cfg.task)
    out = Path(cfg.resume or cfg.out)
    run = open_run_dir(out, cfg, "online_dpo")
    rank_by = watch_rewards(RewardRunner.from_spec(cfg.rewards, cfg.reward_model, cfg.reward_timeout,
                                                   cfg.reward_failure), out, cfg)
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(cfg.model, tokenizer, seed=cfg.seed, keep_dropout=cfg.keep_dropout)
    reference = None if cfg.loss == "simpo" else load_model(cfg.model, tokenizer, seed=cfg.seed).eval().requires_grad_(False)
    stream = PromptStream(task.train_problems(cfg.prompt_pool, cfg.seed), cfg.seed)
    sampler = torch.Generator().manual_seed(cfg.seed)
    sampling = SamplingParams(cfg.temperature, 1.0, 0, cfg.max_new_tokens)
    runner = EpisodeRunner.for_task(task, policy, tokenizer, sampling, generator=sampler)
    if runner.limits.max_turns > 1:
        raise ValueError(f"online DPO pairs whole completions; task {task.name!r} is multi-turn (tool output "
                         "inside the completion would be trained as the model's); use an RL preset for it")
    max_steps = cfg.rounds * cfg.epochs * -(-cfg.prompts_per_round // cfg.batch_size)
    optimizer = make_optimizer(policy, cfg.lr, cfg.weight_decay)
    scheduler = make_scheduler(optimizer, cfg.warmup_steps, max_steps, cfg.lr_schedule, cfg.min_lr_ratio)
    options = options_for(loss_fn, {"label_smoothing": cfg.label_smoothing, "gamma": cfg.gamma})
    heldout = task.heldout_problems(cfg.eval_problems) if cfg.eval_problems else []
    resumed = resume_training(cfg, out, "online_dpo", policy, optimizer, scheduler, {"sampler": sampler})
    start_round, step = (resumed.step, resumed.state["updates"]) if resumed else (0, 0)
    if resumed:
        stream.position = resumed.state["prompt_position"]
        drop_rounds_after(out / "metrics.jsonl", start_round)
    log = MetricsLog(out / "metrics.jsonl", resume_from_step=step if resumed else None)
    last_eval = None
    if heldout and not resumed:
        last_eval = evaluate(policy, tokenizer, task, heldout, max_new_tokens=cfg.max_new_tokens)
        log.write({"step": 0, "eval_accuracy": last_eval.accuracy, "eval_format_accuracy": last_eval.format_accuracy})
    print(f"[online_{cfg.loss}] {cfg.rounds} rounds of {cfg.prompts_per_round} prompts x {cfg.samples_per_prompt} "
          f"samples, ranked by {cfg.rewards}, {threads} threads, run dir {out}")
    with StageProgress(f"online_{cfg.loss}", cfg.rounds, initial=start_round) as progress:
        for round_ in range(start_round + 1, cfg.rounds + 1):
            first_prompt = stream.position
            problems = [p for p in stream.take(cfg.prompts_per_round) for _ in range(cfg.samples_per_prompt)]
            trajectories = runner.run(problems)
            rollout = to_rollout(trajectories, tokenizer.pad_token_id)
            texts, terminated = [t.final_text for t in trajectories], [t.terminated for t in trajectories]
            ranked = rank_by.score(task, problems, texts, terminated)
            scores = sum(w * ranked.components[name].float() for name, w in rank_by.weights().items())
            scores = torch.where(ranked.valid, scores, float("nan"))  # unscorable: never chosen nor rejected
            prompts, chosen, rejected = best_vs_worst(rollout, scores, cfg.samples_per_prompt)
            fault_point("after_rollout", round_)
            row = {"step": step, "round": round_, "reward_mean": scores[ranked.valid].mean().item() if ranked.valid.any() else 0.0,
                   "pairs": len(prompts), "tie_frac": 1 - len(prompts) / cfg.prompts_per_round,
                   "unscorable": int((~ranked.valid).sum()), "prompts": [first_prompt, stream.position]}
            if prompts:
                policy.train()
                for _ in range(cfg.epochs):
                    for start in range(0, len(prompts), cfg.batch_size):
                        sl = slice(start, start + cfg.batch_size)
                        enc = encode_pair_ids(prompts[sl], chosen[sl], rejected[sl], tokenizer.pad_token_id)
                        ref = None
                        if reference is not None:
                            with torch.no_grad():
                                ref = sequence_logps(reference, enc)
                        row.update(preference_step(policy, optimizer, scheduler, enc, ref, loss_fn, cfg, options))
                        step += 1
                row["step"] = step
            if heldout and (round_ % cfg.eval_every == 0 or round_ == cfg.rounds):
                last_eval = evaluate(policy, tokenizer, task, heldout, max_new_tokens=cfg.max_new_tokens)
                row["eval_accuracy"], row["eval_format_accuracy"] = last_eval.accuracy, last_eval.format_accuracy
            log.write(row)
            progress.update(round_, reward=row["reward_mean"], pairs=row["pairs"],
                            **({"eval": last_eval.accuracy} if last_eval else {}))
            if cfg.save_every and round_ % cfg.save_every == 0 and round_ < cfg.rounds:
                save_checkpoint(out, round_, policy, tokenizer, optimizer, scheduler, {"sampler": sampler},
                                {"config": asdict(cfg), "updates": step, "prompt_position": stream.position},
                                cfg.keep_checkpoints)
            fault_point("step_end", round_)
    rank_by.close()
    save_model(policy, tokenizer, out / "model")
    result = StageResult(name="online_dpo", seconds=time.perf_counter() - started, model_dir=str(out / "model"),
                         run_dir=str(out))
    if last_eval:
        result.accuracy, result.format_accuracy = last_eval.accuracy, last_eval.format_accuracy
    result.write(out / "result.json", config=asdict(cfg),
                 models_held={"policy": 1, "reference": int(reference is not None)})
    run.close()
    return result


def drop_rounds_after(path: Path, round_: int) -> None:
    """Metrics rows of rounds after a checkpoint's: a round without pairs repeats the step count,
    so dropping rows by step alone would keep some."""
    keep_rows_through(path, "round", round_)


def best_vs_worst(rollout, scores: torch.Tensor, group: int) -> tuple[list, list, list]:
    """Per prompt (consecutive groups of `group` samples): the highest- and lowest-scored
    completions as (prompt ids, chosen ids, rejected ids); prompts whose scores all tie give none.
    A NaN score (unscorable) takes no part."""
    tokens = rollout.completion_token_lists()
    prompts, chosen, rejected = [], [], []
    for start in range(0, len(tokens), group):
        s = scores[start:start + group]
        scorable = ~s.isnan()
        if scorable.sum() < 2 or s[scorable].max() == s[scorable].min():
            continue
        best = start + int(torch.where(scorable, s, -math.inf).argmax())
        worst = start + int(torch.where(scorable, s, math.inf).argmin())
        prompts.append(rollout.prompt_ids[best])
        chosen.append(tokens[best])
        rejected.append(tokens[worst])
    return prompts, chosen, rejected
