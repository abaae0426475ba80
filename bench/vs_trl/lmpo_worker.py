"""The lmpo side of the bench: lmpo's own trainer loop (`train_rl`, `train_preference`,
`train_reward_model`), run for as many steps as the driver asks, one at a time.

    python bench/vs_trl/lmpo_worker.py WORKLOAD_JSON OUT_DIR

Hooks at the start and end of each step (no change to the loop): the loop's first call of the
step waits for the driver's `step` line, and its `step_end` fault point reports the timings."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import StepClock, emit, pin_threads, wait_for_step  # noqa: E402


class Steps:
    """Step boundaries: the first step is the warm-up, reported as READY without waiting. With
    `profile` set to a path, a step the driver asks for as `step profile` (one more, after the
    measured pairs, so the profiler's cost and memory stay out of them) runs under
    torch.profiler and its operator table goes there."""

    def __init__(self, profile: str = ""):
        self.clock: StepClock | None = None
        self.done = 0
        self.profile = profile
        self.profiler = None

    def begin(self) -> StepClock:
        if self.done and wait_for_step() == "step profile" and self.profile:
            from torch.profiler import ProfilerActivity, profile

            self.profiler = profile(activities=[ProfilerActivity.CPU])
            self.profiler.__enter__()
        self.clock = StepClock()
        return self.clock

    def end(self, **extra) -> None:
        result = self.clock.result(**extra)
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            table = self.profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
            Path(self.profile).write_text(f"step {self.done}, {result['step_s']:.3f} s under the profiler "
                                          f"(run after the measured pairs)\n{table}")
            self.profiler = None
        emit({"ready": True, **result} if self.done == 0 else result)
        self.done += 1


def vowels(task, problems, completions, terminated) -> list[float]:
    return [sum(c in "aeiou" for c in text) / max(len(text), 1) for text in completions]


def run_grpo(w: dict, out: Path) -> None:
    import lmpo.trainers.rl as rl
    from lmpo.trainers.presets import RL_PRESETS

    steps = Steps(w.get("profile", ""))
    real_collect = rl.collect

    def collect(runner, task, stream, rewards, endings, cfg, times, ctx):
        clock = steps.begin()
        clock.times = times
        scored = real_collect(runner, task, stream, rewards, endings, cfg, times, ctx)
        clock.tokens = {"prompt_tokens": int(sum(len(p) for p in scored.rollout.prompt_ids)),
                        "completion_tokens": int(scored.rollout.lengths.sum()), "sequences": len(scored.rewards)}
        return scored

    def fault_point(name, step):
        if name == "step_end":
            t = steps.clock.times
            steps.clock.phases.update({"generate": t.get("time_generate", 0.0), "score": t.get("time_score", 0.0),
                                       "logprobs": t.get("time_logprobs", 0.0) + t.get("time_advantages", 0.0),
                                       "update": t.get("time_update", 0.0)})
            steps.end()

    rl.collect, rl.fault_point = collect, fault_point
    reward = "correct=1.0" if w["reward"] == "exact" else "lmpo_worker:vowels=1.0"
    settings = dict(RL_PRESETS["grpo"].settings, beta=w["beta"], precision=w["precision"], model=w["model"],
                    task="sort_digits", out=str(out), seed=w["seed"], threads=w["threads"], steps=100_000, prompts_per_step=w["prompts_per_step"],
                    group_size=w["group_size"], prompts=w["data"], max_new_tokens=w["max_new_tokens"],
                    rewards=reward, reward_timeout=0.0, eval_problems=0, save_every=0, save_trajectories=0,
                    lr=w["lr"], warmup_steps=0, lr_schedule="constant", device="cpu")
    cfg = rl.RLConfig(**{**settings, **w["options"]})
    rl.train_rl(cfg)


def run_dpo(w: dict, out: Path) -> None:
    import lmpo.trainers.preference as pref

    steps = Steps(w.get("profile", ""))
    real_step = pref.preference_step

    def preference_step(run, policy, updater, enc, ref, loss_fn, cfg, options):
        clock = steps.begin()
        clock.tokens = {"tokens": int(enc.prompt_mask.sum() * 2 + enc.chosen_mask.sum() + enc.rejected_mask.sum()),
                        "sequences": 2 * enc.prompt_ids.size(0)}
        row = real_step(run, policy, updater, enc, ref, loss_fn, cfg, options)
        clock.add("update", time.perf_counter() - clock.start)
        steps.end()
        return row

    pref.preference_step = preference_step
    settings = dict(model=w["model"], out=str(out), seed=w["seed"], threads=w["threads"], precision=w["precision"],
                    loss="dpo", beta=0.1, data=w["data"], batch_size=w["batch_size"], lr=w["lr"], warmup_steps=0, lr_schedule="constant",
                    eval_problems=0, save_every=0, log_every=1, device="cpu")
    cfg = pref.PreferenceConfig(**{**settings, **w["options"]})
    pref.train_preference(cfg)


def run_rm(w: dict, out: Path) -> None:
    import lmpo.trainers.reward_model as rm

    steps = Steps(w.get("profile", ""))
    real_scores = rm.pair_scores

    def pair_scores(model, chunk, pad_id, device):
        clock = steps.begin()
        clock.tokens = {"tokens": sum(2 * len(p.prompt_ids) + len(p.chosen_ids) + len(p.rejected_ids) for p in chunk),
                        "sequences": 2 * len(chunk)}
        return real_scores(model, chunk, pad_id, device)

    def fault_point(name, step):
        if name == "step_end":
            steps.clock.add("update", time.perf_counter() - steps.clock.start)
            steps.end()

    rm.pair_scores, rm.fault_point = pair_scores, fault_point
    settings = dict(model=w["model"], out=str(out), seed=w["seed"], threads=w["threads"], precision=w["precision"],
                    data=w["data"], heldout_data=w["data"], epochs=1000, batch_size=w["batch_size"], lr=w["lr"], warmup_steps=0,
                    lr_schedule="constant", save_every=0, log_every=1, device="cpu")
    cfg = rm.RewardModelConfig(**{**settings, **w["options"]})
    rm.train_reward_model(cfg)


def main() -> None:
    workload, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    pin_threads(workload["threads"])
    {"grpo": run_grpo, "dpo": run_dpo, "rm": run_rm}[workload["kind"]](workload, out)
    emit({"error": "the trainer ran out of steps"})


if __name__ == "__main__":
    main()
