"""Issue 14, a hostile-user probe: resume that refuses a changed config, one run per directory,
clear errors for file-system faults, strict options, reward failures that say why.

One test (or a few) per class of the issue; each fails on the code before the fix."""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from lmpo.cli.config import ConfigError, build
from lmpo.cli.main import main

RL_RUN = ["--steps", "2", "--prompts_per_step", "2", "--group_size", "2", "--max_new_tokens", "4",
          "--eval_problems", "0", "--save_every", "1", "--threads", "1", "--reward_timeout", "0"]
SFT_RUN = ["--demonstrations", "8", "--batch_size", "4", "--epochs", "1", "--save_every", "1",
           "--eval_problems", "0", "--threads", "1"]


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("lmpo: error: "), err
    return err[-1]


# ---------------------------------------------------------------- run directories: resume options

@pytest.fixture(scope="module")
def rl_run(start_model, tmp_path_factory) -> Path:
    """A finished 2-step GRPO run with a checkpoint at step 1."""
    run = tmp_path_factory.mktemp("rl") / "run"
    assert main(["train", "grpo", "--model", start_model, "--out", str(run), *RL_RUN]) == 0
    return run


@pytest.mark.parametrize("extra,names", [
    (["--lr", "0.01"], ["lr=0.01 (was 0.0001)"]),
    (["--model", "tiny", "--beta", "0.5"], ["model='tiny'", "beta=0.5 (was 0.04)"]),
], ids=["lr", "model-and-beta"])
def test_rl_resume_refuses_changed_options_listing_them(rl_run, extra, names, capsys):
    config_before = (rl_run / "config.json").read_text()
    assert main(["train", "grpo", "--resume", str(rl_run), *extra]) == 2
    line = _error(capsys)
    assert "options differ from the interrupted run" in line and all(n in line for n in names), line
    assert (rl_run / "config.json").read_text() == config_before  # nothing rewritten


def test_rl_resume_refuses_another_preset_or_a_config_for_another_method(rl_run, tmp_path, capsys):
    assert main(["train", "dapo", "--resume", str(rl_run)]) == 2
    assert "started by `lmpo train grpo`" in _error(capsys)
    other = tmp_path / "dapo.yaml"
    other.write_text("loss: gspo\nclip_eps_low: 0.0003\nclip_eps_high: 0.0004\n")
    assert main(["train", "grpo", "--resume", str(rl_run), "--config", str(other)]) == 2
    assert "loss='gspo' (was 'ppo_clip')" in _error(capsys)
    assert main(["train", "sft", "--resume", str(rl_run)]) == 2
    assert "it is a rl run; resume it with `lmpo train grpo --resume" in _error(capsys)


def test_rl_resume_with_the_same_options_continues(rl_run, capsys):
    assert main(["train", "grpo", "--resume", str(rl_run), "--threads", "2"]) == 0  # threads may change


# ---------------------------------------------------------------- run directories: one run per directory

def _hold_in_child(run: Path) -> int:
    """A forked process that opens `run` as a run directory and waits; returns its pid."""
    ready = Path(str(run) + ".held")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            from lmpo.trainers.run_dir import open_run_dir
            from lmpo.trainers.supervised import SFTConfig

            open_run_dir(run, SFTConfig(out=str(run)), "sft")
            ready.write_text("1")
            time.sleep(120)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return pid


def test_a_second_run_on_the_same_directory_is_refused_naming_the_holder(start_model, tmp_path, capsys):
    from lmpo.trainers.run_dir import RunDirError, open_run_dir
    from lmpo.trainers.supervised import SFTConfig

    run = tmp_path / "run"
    holder = _hold_in_child(run)
    try:
        assert main(["train", "sft", "--model", start_model, "--out", str(run), *SFT_RUN]) == 2
        line = _error(capsys)
        assert f"in use by process {holder}" in line and str(run) in line
        assert not (run / "metrics.jsonl").exists()
    finally:
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
    # the holder was killed: its lock goes with it, and a resume is not blocked
    open_run_dir(run, SFTConfig(out=str(run), resume=str(run)), "sft").close()
    with pytest.raises(RunDirError, match="no such directory"):
        open_run_dir(tmp_path / "absent", SFTConfig(resume=str(tmp_path / "absent")), "sft")


# ---------------------------------------------------------------- run directories: file-system faults

def test_out_that_is_a_file_is_one_line_naming_it(start_model, tmp_path, capsys):
    f = tmp_path / "notadir"
    f.write_text("mine")
    assert main(["train", "sft", "--model", start_model, "--out", str(f), *SFT_RUN]) == 2
    assert f"--out {f}: exists and is not a directory" in _error(capsys)
    assert f.read_text() == "mine"
    assert main(["train", "sft", "--model", start_model, "--out", str(f / "sub"), *SFT_RUN]) == 2
    assert "cannot create the run directory" in _error(capsys)


@pytest.mark.parametrize("code,cause", [(errno.EROFS, "read-only file system"), (errno.EACCES, "permission denied")])
def test_a_read_only_out_is_one_line_naming_it(tmp_path, monkeypatch, code, cause):
    from lmpo.trainers import run_dir
    from lmpo.trainers.supervised import SFTConfig

    real_open = os.open

    def refuse(path, *args, **kwargs):  # what a read-only mount or directory answers (root ignores chmod)
        if str(path).startswith(str(tmp_path)):
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, *args, **kwargs)

    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setattr(run_dir.os, "open", refuse)
    with pytest.raises(run_dir.RunDirError, match=f"--out {run}: cannot write there: {cause}"):
        run_dir.open_run_dir(run, SFTConfig(out=str(run)), "sft")


class SafetensorError(Exception):
    """What safetensors raises for a full disk (its own type, not an OSError)."""


@pytest.mark.parametrize("failure", [
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4352 vs 4240"),
    OSError(errno.ENOSPC, "No space left on device"),
    SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
], ids=["torch-enforce", "ENOSPC", "safetensors"])
def test_a_full_disk_while_checkpointing_says_the_previous_checkpoint_is_intact(tiny_llama, char_tokenizer, tmp_path,
                                                                                 monkeypatch, failure):
    import copy

    import torch

    from lmpo.trainers import checkpoint
    from lmpo.trainers.run_dir import RunDirError
    from lmpo.trainers.runtime import make_optimizer, make_scheduler

    model = copy.deepcopy(tiny_llama)
    optimizer = make_optimizer(model, 1e-3, 0.0)
    scheduler = make_scheduler(optimizer, 1, 10)
    first = checkpoint.save_checkpoint(tmp_path, 1, model, char_tokenizer, optimizer, scheduler, {}, {})
    real_save = torch.save

    def full(obj, f, *args, **kwargs):
        if str(f).endswith("optimizer.pt"):
            raise failure
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", full)
    if isinstance(failure, SafetensorError):
        monkeypatch.setattr(type(model), "save_pretrained", lambda *a, **k: (_ for _ in ()).throw(failure))
    with pytest.raises(RunDirError) as info:
        checkpoint.save_checkpoint(tmp_path, 2, model, char_tokenizer, optimizer, scheduler, {}, {})
    line = str(info.value)
    assert "\n" not in line and "step_000002" in line and "no space left on the device" in line
    assert f"the previous checkpoint {first} is intact" in line and f"--resume {tmp_path}" in line
    assert checkpoint.latest_checkpoint(tmp_path) == first
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_a_full_disk_while_logging_metrics_is_one_line(tmp_path, monkeypatch):
    from lmpo.trainers.run_dir import RunDirError
    from lmpo.trainers.runtime import MetricsLog

    log = MetricsLog(tmp_path / "metrics.jsonl")

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "open", full)
    with pytest.raises(RunDirError, match=r"metrics.jsonl: no space left on the device.*--resume"):
        log.write({"step": 1})


def test_bad_options_fail_before_anything_is_written(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "grpo", "--model", "tiny", "--out", str(run), "--temperature", "0"]) == 2
    assert "temperature=0.0 must be > 0" in _error(capsys)
    assert not run.exists()
    assert main(["train", "online_dpo", "--model", "tiny", "--out", str(run), "--temperature", "-1"]) == 2
    assert not run.exists()
    assert main(["train", "grpo", "--model", "tiny", "--out", str(run), "--top_p", "0"]) == 2
    assert not run.exists()


# ---------------------------------------------------------------- options that the chosen part ignores

@pytest.mark.parametrize("loss", ["gspo", "cispo"])
def test_an_option_the_selected_loss_does_not_take_is_an_error(loss, tmp_path, capsys):
    from lmpo.trainers.rl_config import RLConfig
    from lmpo.trainers.validation import ConfigError as InvalidConfig

    with pytest.raises(InvalidConfig, match=rf"dual_clip=3.0 is not used by loss={loss} \({loss} takes: "
                                            rf"clip_eps_low, clip_eps_high\)"):
        RLConfig(loss=loss, dual_clip=3.0).validate()
    assert main(["train", loss, "--model", "tiny", "--out", str(tmp_path / "r"), "--dual_clip", "3"]) == 2
    assert "dual_clip=3.0 is not used" in _error(capsys)


@pytest.mark.parametrize("settings,match", [
    ({"advantage": "rloo", "std": "population"}, "std='population' is not used by advantage=rloo"),
    ({"aggregation": "token_mean", "max_len_norm": 8}, "max_len_norm=8 is not used by aggregation=token_mean"),
    ({"advantage": "grpo", "gae_lambda": 0.9}, "gae_lambda=0.9 is not used by advantage=grpo"),
])
def test_options_of_other_advantages_and_aggregations_are_errors(settings, match):
    from lmpo.trainers.rl_config import RLConfig

    with pytest.raises(ValueError, match=match):
        RLConfig(**settings).validate()


def test_every_preset_and_the_defaults_validate():
    from lmpo.trainers.online_dpo import OnlineDPOConfig
    from lmpo.trainers.preference import PreferenceConfig
    from lmpo.trainers.presets import RL_PRESETS
    from lmpo.trainers.rl_config import RLConfig

    for preset in RL_PRESETS.values():
        RLConfig(**preset.settings).validate()
    RLConfig(dual_clip=3.0).validate()  # ppo_clip takes it
    PreferenceConfig().validate()
    OnlineDPOConfig().validate()
    PreferenceConfig(loss="cdpo", label_smoothing=0.2).validate()
    with pytest.raises(ValueError, match=r"label_smoothing=0.2 is not used by loss=dpo"):
        PreferenceConfig(loss="dpo", label_smoothing=0.2).validate()
    with pytest.raises(ValueError, match=r"gamma=1.0 is not used by loss=ipo"):
        PreferenceConfig(loss="ipo", gamma=1.0).validate()


# ---------------------------------------------------------------- YAML

def test_a_yaml_key_given_twice_is_an_error_with_both_lines(tmp_path):
    from lmpo.trainers.rl_config import RLConfig

    f = tmp_path / "c.yaml"
    f.write_text("lr: 0.1\nsteps: 3\nlr: 0.2\n")
    with pytest.raises(ConfigError, match=r"c.yaml: line 3: lr: given twice \(first on line 1\)"):
        build(RLConfig, yaml_file=str(f))
    f.write_text("cpt:\n  steps: 1\nsft:\n  epochs: 1\ncpt:\n  seq_len: 9\n")
    from lmpo.trainers.pipeline import PipelineConfig

    with pytest.raises(ConfigError, match=r"line 5: cpt: given twice \(first on line 1\)"):
        build(PipelineConfig, yaml_file=str(f))


# ---------------------------------------------------------------- data

def _jsonl(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_exact_match_prompts_without_an_answer_are_an_error_naming_the_row(start_model, tmp_path, capsys):
    prompts = _jsonl(tmp_path / "p.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2="}])
    run = tmp_path / "run"
    assert main(["train", "grpo", "--model", start_model, "--out", str(run), "--prompts", prompts,
                 "--task", "exact_match", *RL_RUN]) == 2
    assert "p.jsonl: row 2: field 'answer': expected the answer" in _error(capsys)
    assert not run.exists()  # refused before any model loaded or anything was written
    from lmpo.envs.data import load_prompts

    assert load_prompts(prompts)[1].answer == ""  # other tasks may go without answers


def test_rl_prompts_longer_than_the_context_are_a_located_error(start_model, tmp_path):
    from lmpo.envs.data.records import DataError
    from lmpo.trainers.preflight import check_rl_inputs
    from lmpo.trainers.rl_config import RLConfig

    prompts = _jsonl(tmp_path / "p.jsonl", [{"prompt": "12345="}, {"prompt": "1" * 200}, {"prompt": "x" * 10**6}])
    cfg = RLConfig(model=start_model, prompts=prompts, max_new_tokens=8, eval_problems=0)
    with pytest.raises(DataError, match=r"p.jsonl: row 2: field 'prompt': expected a prompt of at most 120 tokens "
                                        r"\(the model's context of 128 tokens minus max_new_tokens=8\), got 200 tokens"):
        check_rl_inputs(cfg)


def test_an_overlong_row_is_rejected_from_its_length_before_tokenizing(char_tokenizer, tmp_path, monkeypatch):
    from lmpo.envs.data import chat, load_sft
    from lmpo.envs.data.preferences import load_preferences
    from lmpo.envs.data.records import DataError

    calls = []
    real = chat.encode
    monkeypatch.setattr(chat, "encode", lambda tok, text, *a, **k: calls.append(len(text)) or real(tok, text, *a, **k))
    huge = "7" * 2_000_000
    sft = _jsonl(tmp_path / "sft.jsonl", [{"prompt": "a", "completion": "b"}, {"prompt": "a", "completion": huge}])
    with pytest.raises(DataError, match=r"sft.jsonl: row 2: .*over max_length 64; rejected before tokenizing"):
        load_sft(sft, char_tokenizer, max_length=64)
    examples, report = load_sft(sft, char_tokenizer, max_length=64, overlong="skip")
    assert len(examples) == 1 and report.skipped_overlong == 1
    pairs = _jsonl(tmp_path / "pairs.jsonl", [{"prompt": huge, "chosen": "1", "rejected": "2"}])
    with pytest.raises(DataError, match=r"pairs.jsonl: row 1: .*rejected before tokenizing"):
        load_preferences(pairs, char_tokenizer, max_length=64)
    assert max(calls) < 1000  # the huge text never reached the tokenizer


def test_a_non_string_prompt_in_preference_data_is_a_type_error(char_tokenizer, tmp_path):
    from lmpo.envs.data.preferences import load_preferences
    from lmpo.envs.data.records import DataError

    path = _jsonl(tmp_path / "pairs.jsonl", [{"prompt": "1=", "chosen": "1", "rejected": "2"},
                                              {"prompt": 5, "chosen": "1", "rejected": "2"}])
    with pytest.raises(DataError, match=r"row 2: field 'prompt': expected a string or a list of messages, got int"):
        load_preferences(path, char_tokenizer, max_length=64)


# ---------------------------------------------------------------- users' reward functions

def _runner_score(fn, n=2, **kwargs):
    from lmpo.envs import make_task
    from lmpo.rollout.reward_runner import RewardRunner

    task = make_task("sort_digits")
    problems = [task.make("12345") for _ in range(n)]
    with RewardRunner({"r": (fn, 1.0)}, **kwargs) as runner:
        return runner.score(task, problems, ["1"] * n, [True] * n)


@pytest.mark.parametrize("timeout_s", [5.0, 0.0], ids=["worker", "in-process"])
def test_reward_values_that_are_not_numbers_are_unscorable_with_the_reason(timeout_s):
    from reward_fns import returns_strings

    scores = _runner_score(returns_strings, timeout_s=timeout_s)
    assert scores.valid.tolist() == [False, False]
    assert "returned True (a bool), not a number" in scores.reasons["r"]


def test_a_reward_worker_has_a_memory_limit_and_bounded_captured_output(tmp_path, capfd):
    from reward_fns import allocates, prints_a_lot

    from lmpo.envs import make_task
    from lmpo.rollout.reward_runner import RewardRunner

    task = make_task("sort_digits")
    problems = [task.make("12345")]
    log = tmp_path / "workers.log"
    with RewardRunner({"big": (allocates, 1.0), "loud": (prints_a_lot, 1.0)}, timeout_s=30.0) as runner:
        for worker in runner._workers.values():
            worker.memory_mb, worker.log_path = 512, str(log)
        scores = runner.score(task, problems, ["1"], [True])
    assert scores.valid.tolist() == [False] and scores.failures == {"big": 1}
    assert "memory" in scores.reasons["big"] and "512 MB" in scores.reasons["big"]
    assert scores.components["loud"].tolist() == [1.0]
    out, err = capfd.readouterr()
    assert "xxxxxxxx" not in out and "xxxxxxxx" not in err  # nothing reached the trainer's terminal
    assert 1 << 20 <= log.stat().st_size < (1 << 20) + 4096 and "output beyond" in log.read_text()


def test_reward_failures_are_recorded_and_a_run_that_never_scores_stops(start_model, tmp_path, capsys):
    run = tmp_path / "rl"
    assert main(["train", "grpo", "--model", start_model, "--out", str(run), *RL_RUN[:-2], "--steps", "5",
                 "--rewards", "reward_fns:raises=1.0", "--reward_timeout", "10", "--max_unscorable_steps", "2"]) == 1
    captured = capsys.readouterr().err
    assert "[reward] reward_fns:raises could not score 4 of 4 completions (exception): ValueError: the grader crashed" \
        in captured
    last = captured.strip().splitlines()[-1]
    assert last.startswith("lmpo: error: every completion was unscorable in 2 consecutive scoring rounds")
    assert "the grader crashed" in last
    records = [json.loads(line) for line in (run / "reward_failures.jsonl").read_text().splitlines()]
    assert records[0]["function"] == "reward_fns:raises" and records[0]["kind"] == "exception"
    assert "ValueError: the grader crashed" in records[0]["reason"] and "Traceback" in records[0]["reason"]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "reward_mean" in r] == [1]  # stopped in step 2, before its update


def test_the_installed_command_imports_reward_modules_from_the_current_directory(tmp_path, monkeypatch):
    """`lmpo` (a console script: sys.path starts with its bin directory) finds `mymod:fn` in the
    current directory as `python -m lmpo` does (sys.path starts with the current directory)."""
    from lmpo.envs.rewards import import_reward

    (tmp_path / "issue14_rewards.py").write_text("def fn(task, problems, completions, terminated):\n"
                                                  "    return [1.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert import_reward("issue14_rewards:fn")(None, [], ["a"], [True]) == [1.0]


# ---------------------------------------------------------------- a kill that cannot race the run

def test_a_run_pauses_at_a_fault_point_until_killed(tmp_path):
    """What `tests/test_resume.py` kills "from outside": the run waits at the point, so a
    test never depends on how fast the run is."""
    from lmpo.trainers.faults import fault_point

    paused = tmp_path / "paused"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.environ.update({"LMPO_PAUSE_AT": "step_end:3", "LMPO_PAUSE_FILE": str(paused)})
        fault_point("step_end", 2)
        fault_point("step_end", 3)
        os._exit(0)
    deadline = time.monotonic() + 30
    while not paused.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        assert paused.read_text() == str(pid)
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)  # still there, waiting
    finally:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_a_run_killed_before_its_first_checkpoint_resumes_with_its_own_options(start_model, tmp_path, capsys):
    """`--resume DIR` alone, with no checkpoint yet: the options come from `run.json`, not the
    defaults, and any option that differs from them is refused (every trainer)."""
    from lmpo.trainers.run_dir import RUN_RECORD, saved_config

    run = tmp_path / "sft"
    flags = ["--model", start_model, *SFT_RUN[:-2], "--save_every", "0", "--threads", "1"]
    assert main(["train", "sft", "--out", str(run), *flags]) == 0
    assert saved_config(run)["demonstrations"] == 8 and (run / RUN_RECORD).is_file()
    assert main(["train", "sft", "--resume", str(run), "--demonstrations", "9"]) == 2
    assert "demonstrations=9 (was 8)" in _error(capsys)
    assert main(["train", "sft", "--resume", str(run)]) == 0  # no checkpoint: starts over with the run's options
    assert "no complete checkpoint" in capsys.readouterr().out


@pytest.mark.parametrize("cls,settings,match", [
    ("SFTConfig", {"max_length": 64}, r"max_length=64 is only read with --data FILE"),
    ("SFTConfig", {"data": "x.jsonl", "demonstrations": 10}, r"demonstrations=10 is not used with --data"),
    ("CPTConfig", {"data": "x.jsonl", "corpus_documents": 10}, r"corpus_documents=10 is not used with --data"),
    ("PreferenceConfig", {"overlong": "skip"}, r"overlong='skip' is only read with --data FILE"),
    ("RewardModelConfig", {"data": "x.jsonl", "heldout_data": "y.jsonl", "heldout_pairs": 5},
     r"heldout_pairs=5 is not used with --heldout_data"),
    ("RLConfig", {"prompts": "p.jsonl", "prompt_pool": 50}, r"prompt_pool=50 is not used with --prompts"),
])
def test_an_option_of_the_other_data_source_is_an_error(cls, settings, match):
    from lmpo.trainers import preference, reward_model, rl_config, supervised

    config = {"SFTConfig": supervised.SFTConfig, "CPTConfig": supervised.CPTConfig, "RLConfig": rl_config.RLConfig,
              "PreferenceConfig": preference.PreferenceConfig, "RewardModelConfig": reward_model.RewardModelConfig}[cls]
    with pytest.raises(ValueError, match=match):
        config(**settings).validate()
    config(**{k: v for k, v in settings.items() if k in ("data", "prompts", "heldout_data")}).validate()


def test_the_reward_model_worker_gets_room_for_its_weights(start_model, tmp_path):
    from reward_fns import half

    from lmpo.models.reward_scorer import RewardModelReward
    from lmpo.rollout.reward_runner import RewardRunner
    from lmpo.trainers.reward_watch import WatchedRewards

    runner = RewardRunner({"rm": (RewardModelReward(start_model), 1.0), "mine": (half, 1.0)}, timeout_s=5.0)
    watched = WatchedRewards(runner, tmp_path, max_unscorable_steps=3, memory_mb=100)
    assert runner._workers["mine"].memory_mb == 100 and runner._workers["rm"].memory_mb >= 2048
    assert runner._workers["mine"].log_path == str(tmp_path / "reward_workers.log")
    watched.close()


def test_a_full_disk_while_saving_the_final_model_names_it(tiny_llama, char_tokenizer, tmp_path, monkeypatch):
    from lmpo.models import save_model

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(type(tiny_llama), "save_pretrained", full)
    with pytest.raises(OSError) as info:
        save_model(tiny_llama, char_tokenizer, tmp_path / "model")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / "model")
    from lmpo.cli.errors import one_line

    assert one_line(info.value) == f"cannot write {tmp_path / 'model'}: no space left on the device (the disk is full)"


def test_a_short_run_whose_every_completion_was_unscorable_does_not_exit_0(start_model, tmp_path, capsys):
    run = tmp_path / "rl"
    assert main(["train", "grpo", "--model", start_model, "--out", str(run), *RL_RUN[:-2], "--steps", "1",
                 "--rewards", "reward_fns:raises=1.0", "--reward_timeout", "0"]) == 1
    assert "every completion of all 1 scoring rounds was unscorable" in _error(capsys)
    assert not (run / "model").exists()


def test_the_error_policy_records_its_failure_too(start_model, tmp_path):
    from lmpo.rollout.reward_runner import RewardFailure
    from lmpo.trainers.rl import train_rl
    from lmpo.trainers.rl_config import RLConfig

    cfg = RLConfig(model=start_model, out=str(tmp_path / "rl"), steps=2, prompts_per_step=2, group_size=2,
                   max_new_tokens=4, eval_problems=0, save_every=0, threads=1, rewards="reward_fns:raises=1.0",
                   reward_timeout=0.0, reward_failure="error")
    with pytest.raises(RewardFailure):
        train_rl(cfg)
    record = json.loads((tmp_path / "rl" / "reward_failures.jsonl").read_text().splitlines()[0])
    assert record["function"] == "reward_fns:raises" and "the grader crashed" in record["reason"]
