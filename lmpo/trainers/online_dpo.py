"""Online (iterative) DPO: sample several completions per prompt from the current policy,
rank them with the verifier or a reward model, pair the best with the worst (ties skipped),
take DPO steps on those pairs, and repeat with fresh prompts."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lmpo.algos import PREFERENCE_LOSSES
from lmpo.envs import make_task
from lmpo.rollout.agent_loop import EpisodeRunner
from lmpo.rollout.evaluation import evaluate, grade_all
from lmpo.rollout.trajectory import to_rollout
from lmpo.rollout.reward_runner import RewardRunner
from lmpo.models import load_model, load_tokenizer
from lmpo.rollout import SamplingParams
from lmpo.trainers.checkpoint import resume_training
from lmpo.trainers.distributed import launched_rank
from lmpo.trainers.faults import fault_point
from lmpo.trainers.harness import Run, Updater, preflight_run
from lmpo.trainers.preference import (EncodedPairs, PreferenceLoss, encode_pair_ids, preference_options,
                                      preference_problems, preference_step, sequence_logps)
from lmpo.trainers.prompts import PromptFileOptions, PromptStream, heldout_prompts, training_prompts
from lmpo.trainers.resume_changes import CAP_STOP, cap_record, stops_at_once
from lmpo.trainers.result import StageResult
from lmpo.trainers.reward_options import RewardOptions
from lmpo.trainers.reward_watch import note_episodes, watch_rewards
from lmpo.trainers.validation import at_least, raise_if_any, reward_problems, sampling_problems
from lmpo.trainers.runtime import make_optimizer, make_scheduler, options_for, schedule_at
from lmpo.trainers.preflight import load_prompt_files

SAMPLER_STRIDE = 1_000_003  # each data-parallel process samples from its own stream


@dataclass
class OnlineDPOConfig(PreferenceLoss, RewardOptions, PromptFileOptions):
    out: str = "runs/online_dpo"
    """Run directory: metrics.jsonl, the final model in `model/`, result.json."""
    rounds: int = 40
    """Sample → rank → train rounds."""
    prompts_per_round: int = 64
    """Prompts sampled each round."""
    samples_per_prompt: int = 4
    """Completions per prompt; the best and the worst form a pair."""
    warmup_steps: int = 5
    """Rounds of linear learning-rate warm-up. The schedule counts rounds, not updates: every update of a round takes the rate of the round's place in it, so the decay reaches min_lr_ratio in the last round however many pairs the rounds form."""
    temperature: float = 1.0
    """Sampling temperature."""
    max_new_tokens: int = 12
    """Completion token limit."""
    prompt_pool: int = 20_000
    """Training prompts drawn from the task's training split."""
    eval_every: int = 10
    """Evaluate on held-out problems every this many rounds (and at the end)."""
    save_every: int = 10
    """Write a resumable checkpoint every this many rounds (0 = only the final model); checkpoints/step_N is round N."""

    def validate(self) -> None:
        unread = tuple(f"{name}=" for name in UNREAD)  # said below, with online DPO's reason
        problems = [p for p in preference_problems(self) if not p.startswith(unread)] + at_least(self, 1, "rounds", "prompts_per_round", "eval_every",
                                                        "max_new_tokens")
        if self.samples_per_prompt < 2:
            problems.append(f"samples_per_prompt={self.samples_per_prompt}: a pair is the best and the worst of a "
                            f"prompt's samples, so at least 2 are needed")
        if self.data:
            problems.append("online DPO samples its own pairs; --data is for `lmpo train dpo`")
        defaults = type(self)()
        problems += [f"{name}={getattr(self, name)} is not read by online DPO: {why}" for name, why in UNREAD.items()
                     if getattr(self, name) != getattr(defaults, name)]
        problems += reward_problems(self) + sampling_problems(self)
        raise_if_any("online DPO", problems, self)


UNREAD = {"pairs": "the pairs are the policy's own samples, --prompts_per_round of them a round",
          "eval_max_new_tokens": "its held-out evaluation samples --max_new_tokens, as its rounds do",
          "log_every": "a metrics row is written every round",
          "max_length": "its pairs are the policy's own samples, cut at --max_new_tokens",
          "overlong": "its pairs are the policy's own samples, cut at --max_new_tokens"}
"""Options online DPO shares with offline DPO's config but does not read: refused, and not listed in its --help."""


def unlisted(name: str) -> bool:
    """An option kept out of online DPO's --help (and the pipeline's `--online_dpo.*`): one it does
    not read, or `--data` and its rows' options (refused: online DPO samples its own pairs)."""
    return name in UNREAD or name == "data"


def round_means(updates: list[tuple[int, dict]]) -> dict:
    """A round's figures from its updates: each figure's mean weighted by the update's pairs (the
    learning rate, the last update's), so the row speaks for every pair the round trained on."""
    if not updates:
        return {}
    total = sum(n for n, _ in updates)
    means = {key: sum(n * float(figures[key]) for n, figures in updates) / total
             for key in updates[0][1] if key != "lr" and all(figures.get(key) is not None for _, figures in updates)}
    return {**means, "lr": updates[-1][1]["lr"], "updates": len(updates)}


def train_online_dpo(cfg: OnlineDPOConfig) -> StageResult:
    cfg.validate()
    loaded = load_prompt_files(cfg, "online DPO")  # the prompt files, before anything is written or loaded
    loss_fn = PREFERENCE_LOSSES.get(cfg.loss)
    task = make_task(cfg.task)
    preflight_run(cfg, "online_dpo")
    # the prompts and reward functions before the run directory: a task without them, or a reward
    # module that does not import, says so before anything is written or loaded
    stream = PromptStream(training_prompts(task, loaded, cfg.prompts, cfg.prompt_pool, cfg.seed, "online_dpo"),
                          cfg.seed)
    heldout = (heldout_prompts(task, loaded, cfg.eval_prompts, cfg.eval_problems, "online_dpo")
               if cfg.eval_problems and launched_rank() == 0 else [])
    rank_by = RewardRunner.from_spec(cfg.rewards, cfg.reward_model, cfg.reward_timeout, cfg.reward_failure)
    run = Run(cfg, "online_dpo")
    rank_by = watch_rewards(rank_by, run.out, cfg, run.dist)
    tokenizer = load_tokenizer(cfg.model, cfg.trust_remote_code, cfg.chat_template, cfg.chat_template_kwargs)
    policy = run.load_policy(tokenizer, keep_dropout=cfg.keep_dropout)
    reference = None if cfg.loss == "simpo" else run.reference(policy, lambda: load_model(
        cfg.model, tokenizer, seed=cfg.seed, trust_remote_code=cfg.trust_remote_code))
    sampler = torch.Generator().manual_seed(cfg.seed + SAMPLER_STRIDE * run.dist.rank)
    sampling = SamplingParams(cfg.temperature, 1.0, 0, cfg.max_new_tokens)
    runner = EpisodeRunner.for_task(task, run.plain(policy), tokenizer, sampling, generator=sampler)
    if runner.limits.max_turns > 1:
        raise ValueError(f"online DPO pairs whole completions; task {task.name!r} is multi-turn (tool output "
                         "inside the completion would be trained as the model's); use an RL preset for it")
    optimizer = make_optimizer(policy, cfg.lr, cfg.weight_decay)
    # indexed by rounds (round r at position r - 1, the last at the end of the decay): a round forms
    # anywhere from no pair to one per prompt, so a count of updates cannot be planned
    scheduler = make_scheduler(optimizer, cfg.warmup_steps, cfg.rounds - 1, cfg.lr_schedule, cfg.min_lr_ratio)
    updater = Updater(optimizer, scheduler, cfg.grad_clip, cfg.max_nonfinite_steps, f"online_{cfg.loss}",
                      step_schedule=False)
    options = options_for(loss_fn, preference_options(cfg))
    resumed = resume_training(cfg, run.out, "online_dpo", policy, optimizer, scheduler, {"sampler": sampler},
                              rank=run.dist.rank)
    start_round, step = (resumed.step, resumed.state["updates"]) if resumed else (0, 0)
    run.clock.resume(resumed)  # --max_minutes counts the time trained before
    run.say_budget(resumed)
    if resumed:
        run.sync(policy)
        stream.position = resumed.state["prompt_position"]
        updater.load_state(resumed.state)
    run.open_log(start_round if resumed else None, key="round")  # rows by round: a round without pairs updates nothing
    last_eval = None
    no_pair = {"unended": 0, "prompts": 0}  # why rounds formed no pair, for the warning at the end
    capped = {}  # result.json's note of a stop at the wall-time cap
    if heldout and not resumed:
        last_eval = evaluate(run.plain(policy), tokenizer, task, heldout, max_new_tokens=cfg.max_new_tokens)
        run.write({"step": 0, "eval_accuracy": last_eval.accuracy, "eval_format_accuracy": last_eval.format_accuracy,
                   "elapsed_s": run.elapsed()})
    run.say(f"{cfg.rounds} rounds of {cfg.prompts_per_round} prompts x {cfg.samples_per_prompt} samples, ranked by "
            f"{cfg.rewards}; {run.describe(policy)}")
    trained = run.trained(policy)
    at_once = stops_at_once(run, resumed, cfg.max_minutes)  # killed after its stop at the cap: it ends there
    with run.progress(cfg.rounds, initial=start_round, label=f"online_{cfg.loss}") as progress:
        for round_ in range(start_round + 1, cfg.rounds + 1) if not at_once else ():
            schedule_at(scheduler, round_ - 1)
            first_prompt = stream.position
            mine = run.dist.shard(stream.take(cfg.prompts_per_round), "prompts per round")
            problems = [p for p in mine for _ in range(cfg.samples_per_prompt)]
            trajectories = runner.run(problems)
            note_episodes(rank_by, trajectories)
            rollout = to_rollout(trajectories, tokenizer.pad_token_id)
            texts, terminated = [t.final_text for t in trajectories], [t.terminated for t in trajectories]
            ranked = rank_by.score(task, problems, texts, terminated, grade_all(task, trajectories))
            scores = sum(w * ranked.components[name].float() for name, w in rank_by.weights().items())
            scores = torch.where(ranked.valid, scores, float("nan"))  # unscorable: never chosen nor rejected
            # every process sees every process's pairs, and trains on its share of each batch
            ended = torch.tensor(terminated)
            pairs = [pair for part in run.dist.gather(best_vs_worst(rollout, scores, cfg.samples_per_prompt, ended))
                     for pair in zip(*part)]
            # prompts none of whose samples ended: no pair, since a cut-off sample is never chosen (not a tie)
            unended = int(run.dist.all_sum(float(sum(not bool(ended[i:i + cfg.samples_per_prompt].any())
                                                     for i in range(0, len(problems), cfg.samples_per_prompt)))))
            no_pair["unended"] += unended
            no_pair["prompts"] += cfg.prompts_per_round
            reward_sum = run.dist.all_sum(float(scores[ranked.valid].sum())) if ranked.valid.any() else run.dist.all_sum(0.0)
            scorable = run.dist.all_sum(float(ranked.valid.sum()))
            fault_point("after_rollout", round_)
            row = {"step": round_, "round": round_, **({"reward_mean": reward_sum / scorable} if scorable else {}),
                   "pairs": len(pairs), "tie_frac": 1 - (len(pairs) + unended) / cfg.prompts_per_round,
                   "unended_frac": unended / cfg.prompts_per_round,
                   "lr": updater.lr,
                   "samples": len(problems) * run.dist.world,
                   "completion_tokens": int(run.dist.all_sum(float(rollout.lengths.sum()))),
                   "unscorable": int(len(problems) * run.dist.world - scorable), "prompts": [first_prompt, stream.position]}
            if pairs:
                policy.train()
                updates: list[tuple[int, dict]] = []  # (pairs, figures) of each update of the round
                for _ in range(cfg.epochs):
                    for start in range(0, len(pairs), cfg.batch_size):
                        batch = pairs[start:start + cfg.batch_size]
                        batch = run.dist.shard(batch[:len(batch) - len(batch) % run.dist.world], "pairs")
                        if not batch:
                            continue
                        enc = encode_pair_ids(*map(list, zip(*batch)), tokenizer.pad_token_id)
                        enc = EncodedPairs(*run.to_device(*vars(enc).values()))
                        ref = None
                        if reference is not None:
                            with torch.no_grad(), run.autocast():
                                ref = sequence_logps(reference, enc)
                        updates.append((len(batch), preference_step(run, trained, updater, enc, ref, loss_fn, cfg,
                                                                     options)))
                        step += 1
                        updater.check(step)
                row.update(round_means(updates))
                run.sync(policy)
            row["optimizer_steps"] = step
            if updater.skipped:
                row["skipped_updates"] = updater.skipped
            out_of_time = run.out_of_time(cfg.max_minutes) and round_ < cfg.rounds
            if heldout and (round_ % cfg.eval_every == 0 or round_ == cfg.rounds or out_of_time):
                last_eval = evaluate(run.plain(policy), tokenizer, task, heldout, max_new_tokens=cfg.max_new_tokens)
                row["eval_accuracy"], row["eval_format_accuracy"] = last_eval.accuracy, last_eval.format_accuracy
                row["elapsed_s"] = run.elapsed()
            run.write(row)
            progress.update(round_, reward=row.get("reward_mean"), pairs=row["pairs"],
                            **({"eval": row["eval_accuracy"]} if "eval_accuracy" in row else {}))  # this round's only
            # capped: it finishes (SIGTERM too), with a checkpoint there that `--resume --max_minutes` goes on from
            if run.checkpoint_due(round_, cfg.rounds) or (out_of_time and cfg.save_every):
                run.checkpoint(round_, policy, tokenizer, optimizer, scheduler, {"sampler": sampler},
                               {"updates": step, "prompt_position": stream.position, **updater.state(),
                                **({CAP_STOP: True} if out_of_time else {})},
                               stopping=out_of_time)
            fault_point("step_end", round_)
            if out_of_time:
                capped = _stop_at_cap(run, cfg, round_)
                break
    if at_once:
        capped = _stop_at_cap(run, cfg, start_round)
        if heldout:  # the evaluation of the stop, for result.json (its row was written before the kill)
            last_eval = evaluate(run.plain(policy), tokenizer, task, heldout, max_new_tokens=cfg.max_new_tokens)
    rank_by.close()
    if step == 0 and no_pair["unended"] * 2 >= no_pair["prompts"] > 0:
        run.say(f"warning: no round formed a pair: for {no_pair['unended']} of {no_pair['prompts']} prompts no sample "
                f"ended before --max_new_tokens {cfg.max_new_tokens}, and a cut-off sample is never chosen, so "
                "nothing was trained and the saved model is the start model; raise --max_new_tokens")
    elif step == 0:
        run.say("warning: no round formed a pair (every round's samples scored alike), so nothing was trained and "
                "the saved model is the start model; sample more per prompt, raise --temperature, or rank with "
                "rewards that tell samples apart")
    result = StageResult(name="online_dpo", seconds=0.0, model_dir="", run_dir=str(run.out))
    if last_eval:
        result.accuracy, result.format_accuracy = last_eval.accuracy, last_eval.format_accuracy
    held = {"policy": 1, "reference": int(reference is not None and run.lora is None)}
    return run.finish(policy, tokenizer, result, models_held=held, **capped)


def _stop_at_cap(run, cfg: OnlineDPOConfig, round_: int) -> dict:
    """Say and log the stop at the wall-time cap after `round_`; result.json's record of it."""
    reason = f"the wall-time cap of {cfg.max_minutes:g} minutes"
    goes_on = f"; --resume {run.out} with a larger --max_minutes (or 0) trains the rest" if cfg.save_every else ""
    run.say(f"stopping after round {round_} of {cfg.rounds}: {reason}{goes_on}")
    run.write({"step": round_, "round": round_, "stopped": reason})  # its own row: a resume drops it
    return cap_record(round_, cfg.rounds, cfg.max_minutes, bool(cfg.save_every))


def best_vs_worst(rollout, scores: torch.Tensor, group: int,
                  ended: torch.Tensor | None = None) -> tuple[list, list, list]:
    """Per prompt (consecutive groups of `group` samples): the highest-scored completion that
    `ended` (None: all did) and the lowest-scored one as (prompt ids, chosen ids, rejected ids);
    none where the chosen would not score above the rejected. A NaN score (unscorable) takes no
    part. A sample cut off at the token limit is never chosen: a reward model may score one
    well, and DPO would then teach the model not to stop."""
    tokens = rollout.completion_token_lists()
    ended = torch.ones(len(tokens), dtype=torch.bool) if ended is None else ended
    prompts, chosen, rejected = [], [], []
    for start in range(0, len(tokens), group):
        s = scores[start:start + group]
        scorable = ~s.isnan()
        can_choose = scorable & ended[start:start + group]
        if not can_choose.any() or scorable.sum() < 2:
            continue
        best = start + int(torch.where(can_choose, s, -math.inf).argmax())
        worst = start + int(torch.where(scorable, s, math.inf).argmin())
        if not scores[best] > scores[worst]:
            continue
        prompts.append(rollout.prompt_ids[best])
        chosen.append(tokens[best])
        rejected.append(tokens[worst])
    return prompts, chosen, rejected
