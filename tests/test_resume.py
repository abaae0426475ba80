"""Exact resume after SIGKILL: a run killed at any moment and continued with `--resume RUN_DIR`
ends with the same weights, bit for bit, as an uninterrupted run; sees the same prompts; and
logs every step once.

Each run is the `lmpo` command's `main()` in its own process, killed by `LMPO_KILL_AT` (it
SIGKILLs itself at a named point) or from outside. The processes are forked from a server that
has imported torch and transformers once: a fresh interpreter costs 5-8 s on the shared CPUs,
a forked one well under a second. The slow test runs the command itself, as a user would.
"""

from __future__ import annotations

import copy
import io
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lmpo.trainers.batches import CPTBatches, EpochOrder

# The same run in every test of a trainer: tiny budgets, no evaluation, a checkpoint every few steps.
COMMON = ["--threads", "1"]
RUNS = {
    "grpo": ["train", "grpo", "--steps", "6", "--prompts_per_step", "2", "--group_size", "4", "--prompt_pool", "5",
             "--max_new_tokens", "6", "--eval_problems", "0", "--save_every", "2", "--lr", "1e-3",
             "--rewards", "rm=1.0", "--reward_model", "{scorer}",  # a random scorer: rewards always differ
             "--reward_timeout", "0"],  # scored in this process: no reward worker to start per attempt
    # multi-turn episodes with tool calls (the start model is a char-level model, as the task wants)
    "grpo_vault": ["train", "grpo", "--task", "vault", "--steps", "6", "--prompts_per_step", "2", "--group_size", "4",
                   "--prompt_pool", "5", "--max_new_tokens", "40", "--max_turn_tokens", "12", "--eval_problems", "0",
                   "--save_every", "2", "--lr", "1e-3", "--rewards", "rm=1.0", "--reward_model", "{scorer}",
                   "--reward_timeout", "0"],
    "sft": ["train", "sft", "--log_every", "1", "--demonstrations", "24", "--batch_size", "8", "--epochs", "2",
            "--warmup_steps", "1", "--eval_problems", "0", "--save_every", "2"],  # 3 steps per epoch
    "cpt": ["train", "cpt", "--log_every", "1", "--corpus_documents", "40", "--seq_len", "15", "--batch_size", "8",
            "--steps", "6", "--warmup_steps", "1", "--eval_problems", "0", "--save_every", "2"],  # 3 steps per pass
    "dpo": ["train", "dpo", "--log_every", "1", "--pairs", "16", "--batch_size", "8", "--epochs", "2", "--lr", "1e-3",
            "--eval_problems", "0", "--save_every", "1"],  # 2 steps per epoch
    "rm": ["train", "rm", "--log_every", "1", "--pairs", "16", "--heldout_pairs", "8", "--batch_size", "8",
           "--epochs", "2", "--save_every", "1"],
    "online_dpo": ["train", "online_dpo", "--rounds", "4", "--prompts_per_round", "4", "--samples_per_prompt", "3",
                   "--max_new_tokens", "6", "--batch_size", "4", "--eval_problems", "0", "--save_every", "1",
                   "--lr", "1e-3", "--rewards", "rm=1.0", "--reward_model", "{scorer}", "--reward_timeout", "0"],
}
STEPS = {"grpo": 6, "grpo_vault": 6, "sft": 6, "cpt": 6, "dpo": 4, "rm": 4, "online_dpo": 4}

# (trainer, one kill per attempt, extra options): each attempt resumes the one before; a last
# attempt without a kill finishes the run. "outside": SIGKILL from this process once the first
# checkpoint is complete.
CASES = [
    ("grpo", ["after_rollout:1", "after_rollout:3", "checkpoint_write:4"], []),  # no checkpoint yet, then from 2
    ("grpo", ["outside"], []),
    ("grpo_vault", ["after_rollout:3", "checkpoint_write:4"], []),
    ("sft", ["epoch_end:3", "checkpoint_write:4"], []),
    ("sft", ["step_end:4"], ["--save_every", "3"]),  # the checkpoint is at the epoch boundary
    ("sft", ["outside"], []),
    ("cpt", ["epoch_end:3", "checkpoint_write:4"], []),
    ("dpo", ["epoch_end:2", "checkpoint_write:3"], []),
    ("rm", ["epoch_end:2", "checkpoint_write:3"], []),
    ("online_dpo", ["after_rollout:3"], []),
]


def _child(argv: list[str], env: dict[str, str], log: str) -> None:
    os.environ.update(env)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    from lmpo.cli.main import main

    sys.exit(main(argv))


@pytest.fixture(scope="module")
def launcher():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["lmpo.cli.main", "lmpo.trainers.pipeline"])
    return ctx


@pytest.fixture(scope="module")
def scorer(start_model, tmp_path_factory) -> str:
    """A randomly initialised reward model: RL rewards that differ between completions."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("scorer")
    AutoModelForSequenceClassification.from_pretrained(start_model, num_labels=1).save_pretrained(path)
    AutoTokenizer.from_pretrained(start_model).save_pretrained(path)
    return str(path)


def _argv(trainer: str, start_model: str, scorer: str, extra: list[str]) -> list[str]:
    return [a.format(scorer=scorer) for a in RUNS[trainer]] + ["--model", start_model, *COMMON, *extra]


# "outside": the run stops at the end of step 3 (after the first checkpoint, at step 2) and waits
# there until this process SIGKILLs it, so the kill never depends on how fast the run is.
OUTSIDE_PAUSE = "step_end:3"


def _run(launcher, argv: list[str], run_dir: Path, kill: str | None = None) -> int:
    """One attempt in a forked process; returns its exit code (-9: killed)."""
    env = {"LMPO_KILL_AT": kill} if kill and kill != "outside" else {}
    if kill == "outside":
        env = _pause_env(run_dir)
    proc = launcher.Process(target=_child, args=(argv, env, str(run_dir) + ".log"))
    proc.start()
    if kill == "outside":
        _kill_when_paused(proc.pid, run_dir, proc.is_alive)
    proc.join(timeout=120)
    return proc.exitcode


def _pause_env(run_dir: Path) -> dict[str, str]:
    return {"LMPO_PAUSE_AT": OUTSIDE_PAUSE, "LMPO_PAUSE_FILE": str(run_dir) + ".paused"}


def _kill_when_paused(pid: int, run_dir: Path, alive, timeout_s: float = 120) -> None:
    """SIGKILL the run once it waits at its pause point (it cannot pass it)."""
    paused, deadline = Path(str(run_dir) + ".paused"), time.monotonic() + timeout_s
    while alive() and not paused.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    paused.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def reference(launcher, start_model, scorer, tmp_path_factory):
    """The uninterrupted run of a trainer, made once per module on first use."""
    made: dict[str, Path] = {}

    def get(trainer: str) -> Path:
        if trainer not in made:
            out = tmp_path_factory.mktemp(f"reference_{trainer}") / "run"
            assert _run(launcher, _argv(trainer, start_model, scorer, ["--out", str(out)]), out) == 0, _tail(out)
            made[trainer] = out
        return made[trainer]

    return get


@pytest.mark.parametrize("trainer,kills,extra", CASES, ids=[f"{t}-{'+'.join(k)}{'-'.join(e)}" for t, k, e in CASES])
def test_killed_and_resumed_run_equals_the_uninterrupted_one(trainer, kills, extra, launcher, reference, start_model,
                                                             scorer, tmp_path):
    ref = reference(trainer)
    run = tmp_path / "run"
    argv = _argv(trainer, start_model, scorer, extra)
    for attempt, kill in enumerate(kills):
        flags = ["--out", str(run)] if attempt == 0 else ["--resume", str(run)]
        assert _run(launcher, argv + flags, run, kill) == -signal.SIGKILL, f"{kill} did not kill the run\n{_tail(run)}"
        assert not (run / "model").exists()
        if kill.startswith("checkpoint_write"):  # weights written, the checkpoint incomplete
            assert list(run.glob("checkpoints/.tmp-step_*/model.safetensors"))
        _plant_incomplete_checkpoint(run)
    assert _run(launcher, argv + ["--resume", str(run)], run) == 0, _tail(run)

    _assert_same_weights(ref / "model", run / "model")
    assert not [p.name for p in (run / "checkpoints").iterdir() if not (p / "COMPLETE").exists()]
    rows, ref_rows = _training_rows(run, trainer), _training_rows(ref, trainer)
    key = "round" if trainer == "online_dpo" else "step"
    assert [r[key] for r in rows] == list(range(1, STEPS[trainer] + 1))  # no step twice, none missing
    if trainer in ("grpo", "grpo_vault", "online_dpo"):
        assert [r["prompts"] for r in rows] == [r["prompts"] for r in ref_rows]
        assert all(a["prompts"][1] == b["prompts"][0] for a, b in zip(rows, rows[1:]))  # no prompt twice, none skipped
    if trainer in ("grpo", "grpo_vault"):
        assert [r["prompt_digest"] for r in rows] == [r["prompt_digest"] for r in ref_rows]
    if trainer == "grpo_vault":  # the saved trajectories of a resumed run are the uninterrupted run's
        saved, ref_saved = ((d / "trajectories.jsonl").read_text() for d in (run, ref))
        assert saved == ref_saved


# (trainer, where SIGTERM lands, extra options, the step whose checkpoint it writes): off the
# `save_every` schedule, so the checkpoint is there only because of the signal
TERMS = [("grpo", "after_rollout:3", [], 3), ("sft", "step_end:1", ["--save_every", "5"], 2),
         ("dpo", "step_end:1", ["--save_every", "3"], 2), ("online_dpo", "after_rollout:1", ["--save_every", "3"], 1)]


@pytest.mark.parametrize("trainer,term,extra,step", TERMS, ids=[f"{t[0]}-{t[1]}" for t in TERMS])
def test_sigterm_stops_after_the_step_with_a_checkpoint_and_resumes_exactly(trainer, term, extra, step, launcher,
                                                                           reference, start_model, scorer, tmp_path):
    """A scheduler's SIGTERM mid-step: the step finishes, a checkpoint is written after it, the
    run exits with 143 naming it; `--resume` ends where the uninterrupted run does."""
    run = tmp_path / "run"
    argv = _argv(trainer, start_model, scorer, extra)
    proc = launcher.Process(target=_child, args=(argv + ["--out", str(run)], {"LMPO_TERM_AT": term}, str(run) + ".log"))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 143, _tail(run)
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if (p / "COMPLETE").exists())[-1] == f"step_{step:06d}"
    command = "grpo" if trainer == "grpo" else trainer
    assert f"stopped by SIGTERM after step {step}; checkpoint {run}/checkpoints/step_{step:06d} written; " \
           f"continue with `lmpo train {command} --resume {run}`" in _tail(run)
    assert _run(launcher, argv + ["--resume", str(run)], run) == 0, _tail(run)
    _assert_same_weights(reference(trainer) / "model", run / "model")
    key = "round" if trainer == "online_dpo" else "step"
    assert [r[key] for r in _training_rows(run, trainer)] == list(range(1, STEPS[trainer] + 1))


def test_the_reference_runs_train(reference, start_model):
    """Weights that did not move would match after any resume."""
    start = load_file(str(Path(start_model) / "model.safetensors"))
    for trainer in ("grpo", "grpo_vault", "sft", "cpt", "dpo", "online_dpo"):
        final = load_file(str(reference(trainer) / "model" / "model.safetensors"))
        assert any(not torch.equal(start[k], final[k]) for k in start)


@pytest.mark.slow
def test_the_lmpo_command_resumes_after_sigkill(reference, start_model, scorer, tmp_path):
    """The installed command, a fresh interpreter per attempt, killed from outside."""
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "lmpo", *_argv("grpo", start_model, scorer, [])]
    with open(tmp_path / "log", "w") as log:
        proc = subprocess.Popen([*argv, "--out", str(run)], stdout=log, stderr=log, env={**os.environ, **_pause_env(run)})
        _kill_when_paused(proc.pid, run, lambda: proc.poll() is None, timeout_s=600)
        assert proc.wait() == -signal.SIGKILL
        assert subprocess.run([*argv, "--resume", str(run)], stdout=log, stderr=log).returncode == 0
    _assert_same_weights(reference("grpo") / "model", run / "model")


def _plant_incomplete_checkpoint(run: Path) -> None:
    """What a crash mid-write looks like: a checkpoint directory without its marker, newer than any complete one."""
    fake = run / "checkpoints" / "step_000099"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "state.json").write_text("{not json")


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), [k for k in wa if not torch.equal(wa[k], wb[k])]


def _training_rows(run: Path, trainer: str) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    if trainer == "online_dpo":
        return [r for r in rows if "round" in r]
    return [r for r in rows if "loss" in r or "reward_mean" in r]


def _tail(run: Path) -> str:
    log = Path(str(run) + ".log")
    return log.read_text()[-3000:] if log.exists() else "(no log)"


# The data order's state, restored at every position, continues exactly (cheap, no model).

@pytest.mark.parametrize("stop", range(10))
def test_epoch_order_resumes_at_every_position(stop):
    whole = list(EpochOrder(10, 4, 3, "seed"))  # 3 batches per epoch, the last one short
    first = EpochOrder(10, 4, 3, "seed")
    taken = [next(first) for _ in range(stop)]
    resumed = EpochOrder(10, 4, 3, "seed")
    resumed.load_state_dict(torch_roundtrip(first.state_dict()))
    assert taken + list(resumed) == whole


@pytest.mark.parametrize("stop", range(8))
def test_cpt_batches_resume_at_every_position(stop):
    stream = list(range(200))
    whole = [b[0] for b in CPTBatches(stream, 9, 4, 7, seed=3)]  # 20 rows: 5 batches per pass
    first = CPTBatches(stream, 9, 4, 7, seed=3)
    taken = [next(first)[0] for _ in range(stop)]
    resumed = CPTBatches(stream, 9, 4, 7, seed=3)
    resumed.load_state_dict(torch_roundtrip(first.state_dict()))
    rest = [b[0] for b in resumed]
    assert len(taken + rest) == len(whole) and all(torch.equal(a, b) for a, b in zip(taken + rest, whole))


def torch_roundtrip(state: dict) -> dict:
    """Through a file and back, as a checkpoint's `data.pt` is read (`weights_only=True`)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_non_finite_weights_never_reach_a_checkpoint(tiny_llama, char_tokenizer, tmp_path):
    from lmpo.trainers.checkpoint import latest_checkpoint, save_checkpoint
    from lmpo.trainers.runtime import make_optimizer, make_scheduler

    model = copy.deepcopy(tiny_llama)
    optimizer = make_optimizer(model, 1e-3, 0.0)
    scheduler = make_scheduler(optimizer, 1, 10)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="not finite"):
        save_checkpoint(tmp_path, 1, model, char_tokenizer, optimizer, scheduler, {}, {})
    assert latest_checkpoint(tmp_path) is None


def test_resuming_with_other_options_is_an_error_naming_them():
    from lmpo.trainers.checkpoint import check_same_config

    with pytest.raises(ValueError, match=r"lr=0\.1 \(was 0\.2\)"):
        check_same_config({"lr": 0.2, "threads": 1}, {"lr": 0.1, "threads": 1}, "run")
    check_same_config({"lr": 0.2, "threads": 1, "save_every": 5}, {"lr": 0.2, "threads": 2, "save_every": 3}, "run")


def test_resuming_a_finished_run_with_more_steps_says_how_to_train_it_further(tmp_path):
    """`--resume DIR --steps 80` on a run that finished its 60 steps was told to repeat 'the
    interrupted run's' options; a resume repeats a run, and a finished one's model starts a new run."""
    from lmpo.trainers.checkpoint import check_same_config

    (tmp_path / "result.json").write_text("{}")
    with pytest.raises(ValueError, match=r"steps=80 \(was 60\): the cosine learning-rate schedule decays.*that run "
                                         r"finished.*--model " + str(tmp_path / "model")):
        check_same_config({"steps": 60, "lr_schedule": "cosine"}, {"steps": 80, "lr_schedule": "cosine"}, tmp_path)
    with pytest.raises(ValueError, match=r"lr=0.1 \(was 0.2\); that run finished.*--model " + str(tmp_path / "model")):
        check_same_config({"steps": 60, "lr": 0.2}, {"steps": 60, "lr": 0.1}, tmp_path)


def test_resume_alone_reuses_the_interrupted_runs_options(tmp_path, start_model):
    """`lmpo train sft --resume DIR` with no other option continues with the run's own options
    (read from its checkpoint) and reproduces its final weights."""
    from safetensors.torch import load_file

    from lmpo.cli.main import main

    run = tmp_path / "sft"
    assert main(["train", "sft", "--model", start_model, "--out", str(run), "--demonstrations", "24",
                 "--batch_size", "8", "--epochs", "2", "--save_every", "2", "--eval_problems", "0",
                 "--threads", "1"]) == 0
    first = load_file(run / "model" / "model.safetensors")
    (run / "result.json").unlink()  # as if killed after its last checkpoint (a finished run is not resumed)
    assert main(["train", "sft", "--resume", str(run)]) == 0  # from step 4 of 6, same options
    second = load_file(run / "model" / "model.safetensors")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_a_trajectory_log_without_a_path_leaves_the_file_to_rank_0(tmp_path, char_tokenizer):
    """Ranks other than 0 get no path: on resume they must not rewrite the file rank 0 tidies
    (two processes renaming the same temporary file failed one of them), nor delete it on a fresh start."""
    from lmpo.trainers.agent_metrics import TrajectoryLog

    path = tmp_path / "trajectories.jsonl"
    rows = "".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3))
    path.write_text(rows)
    for resume_from_step in (2, None):
        other_rank = TrajectoryLog(None, char_tokenizer, per_step=4, resume_from_step=resume_from_step)
        other_rank.write(3, "train", [object()], task=None)  # writes nothing: never reaches the trajectory
        assert path.read_text() == rows and not list(tmp_path.glob("*.tmp"))
    TrajectoryLog(path, char_tokenizer, per_step=4, resume_from_step=2)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
    TrajectoryLog(path, char_tokenizer, per_step=4)
    assert not path.exists()
