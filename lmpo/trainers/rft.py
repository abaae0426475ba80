"""Rejection-sampling fine-tuning (RAFT, Dong et al. 2023, arXiv:2304.06767; expert iteration;
best-of-n fine-tuning): rounds of

    sample `samples_per_prompt` completions per prompt with the current policy
    → keep those whose reward reaches `accept_threshold` (the verifier's correct answers; or, with
      a reward model, the `keep_top_k` best of each prompt)
    → fine-tune on the kept (prompt, completion) pairs with the SFT loss (completion tokens only)
    → repeat.

The prompts with no accepted sample go to `RUN_DIR/round_K/hard_prompts.jsonl` and, up to
`retry_hard` of the next round's prompts, are tried again there; every sample of the round, with
its reward and whether it was kept, goes to `RUN_DIR/round_K/samples.jsonl`. One row per round in
metrics.jsonl: acceptance rate (a cut-off sample is never accepted), the cut-off share, kept
samples, hard prompts, the SFT loss, held-out accuracy.
A checkpoint after each round holds everything the next one reads (prompt position, the hard
prompts, the sampler's state), so `--resume` continues exactly.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from lmpo.envs import make_task
from lmpo.envs.data import TokenizedExample
from lmpo.models import load_tokenizer
from lmpo.rollout import SamplingParams
from lmpo.rollout.agent_loop import EpisodeRunner
from lmpo.rollout.engine_select import check_engine, make_engine
from lmpo.rollout.evaluation import evaluate, grade_all
from lmpo.rollout.reward_runner import RewardRunner
from lmpo.rollout.trajectory import Trajectory
from lmpo.rollout.weight_probe import default_probe_ids
from lmpo.trainers.batches import SFTBatches
from lmpo.trainers.faults import fault_point
from lmpo.trainers.harness import Run, RunOptions, Updater, preflight_run
from lmpo.trainers.prompts import PromptFileOptions, PromptStream, heldout_prompts, training_prompts
from lmpo.trainers.result import StageResult
from lmpo.trainers.reward_options import RewardOptions
from lmpo.trainers.reward_watch import note_episodes, watch_rewards
from lmpo.trainers.rl_config import ENGINES, RLConfig
from lmpo.trainers.runtime import Schedule, make_optimizer, make_scheduler, schedule_at
from lmpo.trainers.sampler_mismatch import samples_with_trainer_forward, sync_and_probe
from lmpo.trainers.supervised import _step as sft_step
from lmpo.trainers.validation import (at_least, checkpoint_problems, data_option_problems, optimizer_problems,
                                     raise_if_any, reward_problems, sampling_problems)
from lmpo.trainers.preflight import load_prompt_files

HARD_PROMPTS = "hard_prompts.jsonl"
SAMPLES = "samples.jsonl"
PROBE_TOLERANCE = RLConfig.probe_tolerance  # vLLM: the same stale-weights check as the RL loop
ROUND_ORDER_STRIDE = 1_000_003  # each round's SFT order comes from its own seed


@dataclass
class RFTConfig(RunOptions, RewardOptions, PromptFileOptions):
    model: str = "runs/sft/model"
    """Hugging Face model directory (or preset name) of the policy to start from."""
    task: str = "sort_digits"
    """Task that supplies prompts, the verifier and the held-out evaluation."""
    out: str = "runs/rft"
    """Run directory: metrics.jsonl, round_K/hard_prompts.jsonl, checkpoints/, the final model in `model/`."""
    resume: str = ""
    """Run directory of an interrupted run to continue from its newest complete checkpoint."""
    seed: int = 0
    """Seed for prompt order, sampling and the SFT order."""
    threads: int = 2
    """Torch CPU threads (0 = one per core)."""
    rounds: int = 8
    """Sample → filter → fine-tune rounds."""
    prompts_per_round: int = 256
    """Prompts sampled each round (the previous round's hard prompts first, see retry_hard, then fresh ones)."""
    samples_per_prompt: int = 8
    """Completions sampled per prompt (the n of best-of-n)."""
    prompt_pool: int = 20_000
    """Training prompts drawn from the task's training split; iterated in a shuffled order."""
    retry_hard: float = 0.5
    """Largest share of a round's prompts taken from the previous round's hard prompts (no accepted sample), tried again; 0 = only fresh prompts."""
    temperature: float = 1.0
    """Sampling temperature."""
    max_new_tokens: int = 12
    """Token budget of one sampled episode after its prompt."""
    accept_threshold: float = 1.0
    """A sample is accepted when its reward is at least this (1.0 with `correct=1.0`: the verifier's correct answers); `-inf` accepts every scorable sample, so that keep_top_k alone selects (RAFT with a reward model)."""
    keep_top_k: int = 0
    """Per prompt, keep at most the k highest-reward accepted samples (0 = every accepted one)."""
    distinct: bool = True
    """Keep each distinct accepted completion of a prompt once (repeats of one answer would weigh easy prompts more)."""
    sft_steps_per_round: int = 16
    """SFT optimizer steps on the round's kept samples (in a shuffled order, as many passes as that takes)."""
    batch_size: int = 32
    """Kept samples per SFT step."""
    lr: float = 1e-4
    """Peak learning rate of AdamW."""
    warmup_steps: int = 0
    """SFT steps of linear learning-rate warm-up."""
    lr_schedule: Schedule = "constant"
    """Decay over all rounds' SFT steps after warm-up: cosine, linear or constant. The schedule follows rounds: round K's steps take places (K-1)·sft_steps_per_round on, so a round that keeps nothing (or skips an update) still moves it on, and the decay ends in the last round."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak (cosine/linear)."""
    weight_decay: float = 0.0
    """AdamW weight decay (matrices only)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 = off)."""
    eval_problems: int = 500
    """Held-out problems for greedy evaluation (0 = skip)."""
    eval_max_new_tokens: int = 12
    """Token limit for evaluation answers; for a multi-turn task, the budget of a whole episode (a task may set its own)."""
    eval_every: int = 1
    """Evaluate on held-out problems every this many rounds (and before the first and after the last)."""
    save_every: int = 1
    """Write a resumable checkpoint every this many rounds (0 = only the final model); checkpoints/step_K is round K."""
    keep_checkpoints: int = 2
    """Complete checkpoints to keep."""
    engine: str = "auto"
    """What samples: auto, local or vllm (see `lmpo train grpo --help`); a vLLM engine takes the new weights after every round."""
    vllm_gpu_memory_utilization: float = 0.3
    """vllm engine: fraction of GPU memory vLLM may take; the rest is left to training."""

    def validate(self) -> None:
        problems = at_least(self, 1, "rounds", "prompts_per_round", "samples_per_prompt", "prompt_pool",
                            "max_new_tokens", "sft_steps_per_round", "batch_size", "eval_every",
                            "eval_max_new_tokens", "reward_memory_mb")
        problems += at_least(self, 0, "keep_top_k", "eval_problems", "max_unscorable_steps")
        if not 0 <= self.retry_hard <= 1:
            problems.append(f"retry_hard={self.retry_hard} must be in [0, 1]")
        if math.isnan(self.accept_threshold):
            problems.append("accept_threshold must be a number (-inf accepts every scorable sample)")
        if self.engine not in ENGINES:
            problems.append(f"engine={self.engine!r} must be one of {', '.join(ENGINES)}")
        if not 0 < self.vllm_gpu_memory_utilization < 1:
            problems.append(f"vllm_gpu_memory_utilization={self.vllm_gpu_memory_utilization} must be in (0, 1)")
        problems += reward_problems(self) + sampling_problems(self) + optimizer_problems(self)
        problems += checkpoint_problems(self) + data_option_problems(self)
        raise_if_any("RFT", problems, self)


@dataclass
class RoundSamples:
    """One round's sampled episodes, `samples_per_prompt` consecutive ones per problem, judged."""

    problems: list
    trajectories: list[Trajectory]
    scores: torch.Tensor
    """Weighted reward per sample; NaN where unscorable."""
    kept: list[int]
    """The samples trained on, in sampling order."""

    @property
    def ended(self) -> torch.Tensor:
        """Which samples ended (EOS) rather than being cut off at the token limit: only those may
        be kept, since a cut-off one kept as a demonstration would teach the model not to stop,
        however a reward model scores it."""
        return torch.tensor([t.terminated for t in self.trajectories], dtype=torch.bool)


def accepted_samples(scores: torch.Tensor, completions: list[list[int]], group: int, threshold: float,
                     top_k: int = 0, distinct: bool = True) -> list[int]:
    """Indices of the samples to train on: per prompt (consecutive groups of `group`), those
    scoring at least `threshold` (an unscorable NaN never does), each distinct completion once
    when `distinct`, the `top_k` highest (ties: the earlier sample) when top_k > 0; in
    sampling order."""
    kept: list[int] = []
    for start in range(0, len(completions), group):
        rows = [i for i in range(start, min(start + group, len(completions))) if float(scores[i]) >= threshold]
        if distinct:
            seen: set[tuple[int, ...]] = set()
            rows = [i for i in rows if not (tuple(completions[i]) in seen or seen.add(tuple(completions[i])))]
        if top_k:
            rows = sorted(sorted(rows, key=lambda i: -float(scores[i]))[:top_k])
        kept += rows
    return kept


def kept_example(trajectory: Trajectory) -> TokenizedExample:
    """The prompt (no loss) and what the model wrote (loss; tool output and template tokens of a
    multi-turn episode carry none), as one SFT example."""
    prompt = trajectory.token_ids[: trajectory.prompt_length]
    return TokenizedExample(trajectory.token_ids, [0] * len(prompt) + trajectory.loss_mask)


def write_hard_prompts(path: Path, samples: RoundSamples, pool_index: dict[int, int], group: int) -> list[int]:
    """The round's prompts without an accepted sample, as JSONL (prompt, answer, best reward, the
    pool index); returns their pool indices, for the next round."""
    solved = {i // group for i in samples.kept}
    hard = [j for j in range(len(samples.problems)) if j not in solved]
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for j in hard:
        problem, scores = samples.problems[j], samples.scores[j * group:(j + 1) * group]
        scorable = scores[~scores.isnan()]
        lines.append(json.dumps({"prompt": problem.prompt, "answer": problem.answer,
                                 "best_reward": float(scorable.max()) if len(scorable) else None,
                                 "samples": group, "pool_index": pool_index[id(problem)]}))
    path.write_text("".join(f"{line}\n" for line in lines))
    return [pool_index[id(samples.problems[j])] for j in hard]


def write_samples(path: Path, samples: RoundSamples) -> None:
    """Every sample of the round: its prompt, answer text, reward (null: unscorable) and whether it was kept."""
    kept = set(samples.kept)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"prompt": t.problem.prompt, "completion": t.final_text,
                         "reward": None if math.isnan(float(score)) else float(score), "ended": t.terminated,
                         "kept": i in kept})
             for i, (t, score) in enumerate(zip(samples.trajectories, samples.scores))]
    path.write_text("".join(f"{line}\n" for line in lines))


def sample_round(runner: EpisodeRunner, task, problems: list, rewards, cfg: RFTConfig) -> RoundSamples:
    """Sample, score and select one round's completions."""
    group = cfg.samples_per_prompt
    trajectories = runner.run([p for p in problems for _ in range(group)])
    note_episodes(rewards, trajectories)
    judged = rewards.score(task, [t.problem for t in trajectories], [t.final_text for t in trajectories],
                           [t.terminated for t in trajectories], grade_all(task, trajectories))
    total = sum(w * judged.components[name].float() for name, w in rewards.weights().items())
    samples = RoundSamples(problems, trajectories, torch.where(judged.valid, total, float("nan")), [])
    samples.kept = accepted_samples(torch.where(samples.ended, samples.scores, float("nan")),
                                    [t.completion_ids for t in trajectories], group, cfg.accept_threshold,
                                    cfg.keep_top_k, cfg.distinct)
    return samples


def train_rft(cfg: RFTConfig) -> StageResult:
    cfg.validate()
    loaded = load_prompt_files(cfg, "RFT")  # the prompt files, before anything is written or loaded
    task = make_task(cfg.task)  # a bad task option, too
    check_engine(cfg.engine)  # engine=vllm where vLLM cannot run
    if preflight_run(cfg, "rft")[1].active:
        raise ValueError("rft runs in one process; start it without torchrun")
    # the prompts and reward functions before the run directory: a task without them, or a reward
    # module that does not import, says so before anything is written or loaded
    pool = training_prompts(task, loaded, cfg.prompts, cfg.prompt_pool, cfg.seed, "rft")
    heldout = heldout_prompts(task, loaded, cfg.eval_prompts, cfg.eval_problems, "rft") if cfg.eval_problems else []
    rewards = RewardRunner.from_spec(cfg.rewards, cfg.reward_model, cfg.reward_timeout, cfg.reward_failure)
    run = Run(cfg, "rft")
    rewards = watch_rewards(rewards, run.out, cfg)
    tokenizer = load_tokenizer(cfg.model, cfg.trust_remote_code, cfg.chat_template, cfg.chat_template_kwargs)
    policy = run.load_policy(tokenizer, keep_dropout=False)
    pool_index = {id(p): i for i, p in enumerate(pool)}
    stream = PromptStream(pool, cfg.seed)
    sampler = torch.Generator().manual_seed(cfg.seed)
    engine = make_engine(cfg.engine, run.plain(policy), tokenizer, cfg.model, generator=sampler, seed=cfg.seed,
                         trainer_device=str(run.device), gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                         enable_lora=run.lora is not None, log=run.say, trust_remote_code=cfg.trust_remote_code)
    external = not samples_with_trainer_forward(engine)
    sampling = SamplingParams(cfg.temperature, 1.0, 0, cfg.max_new_tokens)
    runner = EpisodeRunner.for_task(task, run.plain(policy), tokenizer, sampling, generator=sampler, engine=engine)
    optimizer = make_optimizer(policy, cfg.lr, cfg.weight_decay)
    scheduler = make_scheduler(optimizer, cfg.warmup_steps, cfg.rounds * cfg.sft_steps_per_round, cfg.lr_schedule,
                               cfg.min_lr_ratio)
    updater = Updater(optimizer, scheduler, cfg.grad_clip, cfg.max_nonfinite_steps, "rft")
    hard: list[int] = []
    start_round = updates = 0  # updates: the optimizer steps applied so far
    resumed = run.resume(policy, optimizer, scheduler, {"sampler": sampler})
    if resumed is not None:
        start_round, stream.position, hard = resumed.step, resumed.state["prompt_position"], resumed.state["hard"]
        updates = resumed.state.get("updates", scheduler.last_epoch)  # before the schedule followed rounds: the same
        updater.load_state(resumed.state)
    probe_ids = default_probe_ids(tokenizer)
    if external:
        sync_and_probe(engine, run.plain(policy), probe_ids, PROBE_TOLERANCE)
    (run.out / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
    last_eval = None
    if heldout and resumed is None:
        last_eval = evaluate(run.plain(policy), tokenizer, task, heldout, max_new_tokens=cfg.eval_max_new_tokens,
                             budget_option="--eval_max_new_tokens")
        run.write({"step": 0, **last_eval.metrics()})
    run.say(f"{cfg.rounds} rounds of {cfg.prompts_per_round} prompts x {cfg.samples_per_prompt} samples, kept "
            f"when {cfg.rewards} >= {cfg.accept_threshold:g}{f' (top {cfg.keep_top_k})' if cfg.keep_top_k else ''}, "
            f"{cfg.sft_steps_per_round} SFT steps per round; {run.describe(policy)}")
    trained = run.trained(policy)
    with run.progress(cfg.rounds, initial=start_round) as progress:
        for round_ in range(start_round + 1, cfg.rounds + 1):
            tick = time.perf_counter()
            retried = [pool[i] for i in hard[: int(cfg.retry_hard * cfg.prompts_per_round)]]
            first_prompt = stream.position
            problems = retried + stream.take(cfg.prompts_per_round - len(retried))
            samples = sample_round(runner, task, problems, rewards, cfg)
            hard = write_hard_prompts(run.out / f"round_{round_}" / HARD_PROMPTS, samples, pool_index,
                                      cfg.samples_per_prompt)
            write_samples(run.out / f"round_{round_}" / SAMPLES, samples)
            fault_point("after_rollout", round_)
            row = {"step": round_, **round_figures(samples, cfg, len(retried), len(hard)),
                   "prompts": [first_prompt, stream.position], "time_sample": time.perf_counter() - tick}
            tick = time.perf_counter()
            examples = [kept_example(samples.trajectories[i]) for i in samples.kept]
            if examples:
                figures = fine_tune(run, trained, updater, examples, tokenizer.pad_token_id, cfg, round_)
                updates += figures.pop("applied")
                row.update(figures)
                run.sync(policy)
                if external:
                    sync_and_probe(engine, run.plain(policy), probe_ids, PROBE_TOLERANCE)
            row["time_train"], row["updates"] = time.perf_counter() - tick, updates
            if heldout and (round_ % cfg.eval_every == 0 or round_ == cfg.rounds):
                last_eval = evaluate(run.plain(policy), tokenizer, task, heldout,
                                     max_new_tokens=cfg.eval_max_new_tokens,
                                     budget_option="--eval_max_new_tokens")
                policy.train()
                row.update(last_eval.metrics())
            run.write(row)
            progress.update(round_, accept=row["acceptance_rate"], kept=row["kept"],
                            **({"eval": row["eval_accuracy"]} if "eval_accuracy" in row else {}))  # this round's only
            if run.checkpoint_due(round_, cfg.rounds):
                run.checkpoint(round_, policy, tokenizer, optimizer, scheduler, {"sampler": sampler},
                               {"prompt_position": stream.position, "hard": hard, "updates": updates,
                                **updater.state()})
            fault_point("step_end", round_)
    rewards.close()
    getattr(engine, "close", lambda: None)()
    if updates == 0:
        run.say("warning: no sample was accepted in any round, so nothing was fine-tuned and the saved model is the "
                "start model; lower --accept_threshold, keep each prompt's best samples whatever their reward with "
                "--accept_threshold -inf --keep_top_k N (--keep_top_k alone keeps only accepted ones), or sample more")
    result = StageResult(name="rft", seconds=0.0, model_dir="", run_dir=str(run.out))
    if last_eval is not None:
        result.accuracy, result.format_accuracy = last_eval.accuracy, last_eval.format_accuracy
        result.tool_call_rate, result.terminations = last_eval.tool_call_rate, last_eval.terminations
        result.breakdown = last_eval.breakdown or None
    return run.finish(policy, tokenizer, result)


def fine_tune(run: Run, model, updater: Updater, examples: list[TokenizedExample], pad_id: int, cfg: RFTConfig,
              round_: int) -> dict:
    """`sft_steps_per_round` SFT steps on the kept samples, the schedule at the round's place in it
    (round K's steps from (K-1)·sft_steps_per_round); the round's mean loss, last figures and how
    many updates were `applied` (a non-finite one is skipped)."""
    batches = SFTBatches(examples, pad_id, min(cfg.batch_size, len(examples)), epochs=cfg.sft_steps_per_round,
                         seed=cfg.seed * ROUND_ORDER_STRIDE + round_)
    schedule_at(updater.scheduler, (round_ - 1) * cfg.sft_steps_per_round)
    model.train()
    losses, row, applied = [], {}, 0
    for _, batch in zip(range(cfg.sft_steps_per_round), batches):
        row, updated = sft_step(run, model, updater, batch, updater.scheduler.last_epoch + 1)
        applied += updated
        if not updated:
            updater.check(round_)
        losses.append(row["loss"])
    finite = [x for x in losses if math.isfinite(x)]
    return {"loss": sum(finite) / max(len(finite), 1), "lr": row.get("lr", updater.lr),
            "grad_norm": row.get("grad_norm", 0.0), "skipped_updates": updater.skipped, "applied": applied}


def round_figures(samples: RoundSamples, cfg: RFTConfig, retried: int, hard: int) -> dict:
    """A round's row. Accepted: what RFT may train on, a reward at least the threshold in a sample
    that ended (`sample_round`: a cut-off one is never kept); `cut_off_rate` is the share cut off."""
    n = len(samples.trajectories)
    ended = samples.ended
    accepted = (samples.scores >= cfg.accept_threshold) & ended
    scorable = samples.scores[~samples.scores.isnan()]
    return {"acceptance_rate": int(accepted.sum()) / max(n, 1), "cut_off_rate": int((~ended).sum()) / max(n, 1),
            "solved_rate": 1 - hard / max(len(samples.problems), 1),
            "kept": len(samples.kept), "hard_prompts": hard, "retried_prompts": retried,
            **({"reward_mean": float(scorable.mean())} if len(scorable) else {}), "unscorable": n - len(scorable)}
