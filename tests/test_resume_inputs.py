"""A resume continues on the same inputs, and a run stopped by memory says how to go on.

- `--resume` compares the data files and model directories the run read with what is there now
  (`lmpo.trainers.inputs`): an edited data file or a rewritten model is refused, naming it.
- Out of memory, `lmpo train` names what the allocator said, the options that make a step need
  less (those a resume accepts first) and the newest checkpoint; the resume with them ends where
  an uninterrupted run ends, to float tolerance.

Each test fails on the code before the change."""

from __future__ import annotations

import os

import pytest

from lmpo.cli.main import main

from hardening_common import RL_RUN, SFT_RUN, error_line as _error


def _as_interrupted(run) -> None:
    """A finished run is not resumed ("nothing to resume"): its result.json removed, it reads as
    killed after its last checkpoint, which is what these tests resume."""
    (run / "result.json").unlink(missing_ok=True)


def test_resume_refuses_a_data_file_changed_since_the_run_started(start_model, tmp_path, capsys):
    """The checkpoint keeps its place in the data as a position in the file's rows: resumed over
    an edited file it would train on other examples, silently. The file's size and SHA-256 are
    kept in every checkpoint and compared; restored, the run resumes."""
    from lmpo.trainers.inputs import check_same_inputs

    data = tmp_path / "demos.jsonl"
    original = "".join(f'{{"prompt": "{i}=", "completion": "{i}"}}\n' for i in range(12))
    data.write_text(original)
    run = tmp_path / "sft"
    flags = ["--model", start_model, "--data", str(data), "--batch_size", "4", "--epochs", "1", "--save_every", "1",
             "--eval_problems", "0", "--threads", "1"]
    assert main(["train", "sft", "--out", str(run), *flags]) == 0
    data.write_text(original.replace('"5"', '"6"'))  # one answer edited: same size, other bytes
    _as_interrupted(run)
    import lmpo.trainers.supervised as supervised

    loads = []
    with pytest.MonkeyPatch.context() as patch:  # said before the data loads, not after (a DPO reference pass, QA T)
        patch.setattr(supervised, "load_sft", lambda *a, **k: loads.append(1) or [])
        assert main(["train", "sft", "--resume", str(run), *flags]) == 2
    assert not loads
    line = _error(capsys)
    assert f"--resume {run}: the run's data changed since it started (--data {data}: 436 bytes, sha256 " in line
    assert line.endswith(f"Restore the data, or start afresh on it with `--out {run} --overwrite true` instead of "
                         "--resume")
    data.write_text(original)
    _as_interrupted(run)
    assert main(["train", "sft", "--resume", str(run), *flags]) == 0
    check_same_inputs(None, {"data": {"path": "x", "bytes": 1, "sha256": "0"}}, run)  # checkpoints of older lmpo


def test_out_of_memory_is_one_line_naming_what_needs_less_and_resume_accepts_it(start_model, tmp_path,
                                                                                 monkeypatch, capsys):
    """CUDA's out-of-memory error was a long traceback; now one line: what the allocator said,
    the options that make a step need less, and the resume that accepts them (they change how a
    step is computed, not what it trains). The resumed run ends where an uninterrupted run with
    the same options ends, to float tolerance."""
    import torch
    from safetensors.torch import load_file

    import lmpo.trainers.rl as rl

    said = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
            "1.06 GiB is free. Including non-PyTorch memory, this process has 78.1 GiB memory in use.")
    real_fault_point = rl.fault_point

    def fault_point(name, step):
        if name == "after_rollout" and step == 2:
            raise torch.OutOfMemoryError(said)

    monkeypatch.setattr(rl, "fault_point", fault_point)
    run = tmp_path / "oom"
    assert main(["train", "grpo", "--model", start_model, "--out", str(run), *RL_RUN]) == 1
    assert _error(capsys) == (
        "lmpo: error: out of memory (CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.19 GiB of which 1.06 GiB is free); a step needs less with --gradient_checkpointing true, "
        "--logprob_chunk_tokens 4096, --micro_batch_tokens N (or a smaller --micro_batch_size), which "
        f"`lmpo train grpo --resume {run}` accepts (its newest complete checkpoint: step_000001); or, in a new run, "
        "with --lora_r 16")
    monkeypatch.setattr(rl, "fault_point", real_fault_point)
    memory = ["--gradient_checkpointing", "true", "--logprob_chunk_tokens", "2", "--micro_batch_size", "2"]
    assert main(["train", "grpo", "--resume", str(run), *memory]) == 0
    whole = tmp_path / "whole"
    assert main(["train", "grpo", "--model", start_model, "--out", str(whole), *RL_RUN]) == 0
    resumed, uninterrupted = (load_file(str(d / "model" / "model.safetensors")) for d in (run, whole))
    # chunking rounds the head's sums differently, and AdamW divides by a gradient's running RMS, so
    # a near-zero gradient's rounding can move its weight by a few percent of one step (lr 1e-4)
    for name, tensor in uninterrupted.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=0, atol=1e-5)

    def other_fault(name, step):
        if name == "after_rollout":
            raise RuntimeError("an unrelated bug")

    monkeypatch.setattr(rl, "fault_point", other_fault)
    with pytest.raises(RuntimeError, match="an unrelated bug"):  # anything else keeps its traceback
        main(["train", "grpo", "--model", start_model, "--out", str(tmp_path / "bug"), *RL_RUN])


def test_resume_refuses_a_model_rewritten_since_the_run_started(start_model, tmp_path, monkeypatch, capsys):
    """A resumed run takes its reference (and a LoRA run its base) from --model: rewritten since
    (an SFT run repeated into the same directory), the run would go on from other weights. Weights
    are known by size and modification time, small files by their bytes; a copy that lost its
    times is told how to give them back."""
    import shlex
    import shutil
    import subprocess

    import lmpo.trainers.inputs as inputs

    monkeypatch.setattr(inputs, "SMALL_FILE", 100_000)  # the test model's weights (357 KB) count as large
    model = tmp_path / "model"
    shutil.copytree(start_model, model)
    weights = model / "model.safetensors"
    run = tmp_path / "sft"
    flags = ["--model", str(model), *SFT_RUN[:-2], "--threads", "1"]
    assert main(["train", "sft", "--out", str(run), *flags]) == 0
    stamp = weights.stat().st_mtime_ns
    os.utime(weights, ns=(stamp + 10**9, stamp + 10**9))  # as a copy without its times, or a new save
    _as_interrupted(run)
    assert main(["train", "sft", "--resume", str(run), *flags]) == 2
    line = _error(capsys)
    assert line.startswith(f"lmpo: error: --resume {run}: --model {model} changed since the run started "
                           "(model.safetensors was rewritten (another modification time)); the run would go on from "
                           "other weights than its own (its reference model, a LoRA run's base). Restore that model; "
                           "if the weights are the same (copied without their times), give them their times back: "
                           "touch -d @")
    subprocess.run(["touch", *shlex.split(line.split("give them their times back: touch ")[1])], check=True)
    assert weights.stat().st_mtime_ns == stamp
    _as_interrupted(run)
    assert main(["train", "sft", "--resume", str(run), *flags]) == 0
    (model / "config.json").write_text((model / "config.json").read_text() + "\n")
    _as_interrupted(run)
    assert main(["train", "sft", "--resume", str(run), *flags]) == 2
    assert "(config.json has " in _error(capsys)


def test_resume_refuses_a_changed_base_under_an_adapter_given_as_the_model(start_model, tmp_path, capsys):
    """An adapter directory as --model is read on top of the base model it names: a base
    rewritten since the run started is refused too, named as the adapter's base."""
    import shutil

    base = tmp_path / "base"
    shutil.copytree(start_model, base)
    assert main(["train", "sft", "--model", str(base), "--out", str(tmp_path / "lora"), "--lora_r", "4",
                 *SFT_RUN]) == 0
    adapter = tmp_path / "lora" / "model"
    assert (adapter / "adapter_config.json").is_file()
    run = tmp_path / "sft"
    flags = ["--model", str(adapter), *SFT_RUN]
    assert main(["train", "sft", "--out", str(run), *flags]) == 0
    (base / "config.json").write_text((base / "config.json").read_text() + "\n")
    _as_interrupted(run)
    assert main(["train", "sft", "--resume", str(run), *flags]) == 2
    assert _error(capsys).startswith(f"lmpo: error: --resume {run}: the base model {base} of the adapter given as "
                                     f"--model changed since the run started (config.json has ")


def test_resume_refuses_a_chat_template_file_changed_since_the_run_started(start_model, tmp_path, capsys):
    """The template decides which tokens each row becomes; resumed under an edited one, the rest of
    the run would train on other tokens than its first steps."""
    from lmpo.models import build_char_tokenizer

    template = tmp_path / "chat.jinja"
    template.write_text(build_char_tokenizer().chat_template)
    data = tmp_path / "chat.jsonl"
    data.write_text("".join('{"messages": [{"role": "user", "content": "%d="}, {"role": "assistant", "content": "%d"}]}\n'
                            % (i, i) for i in range(12)))
    run = tmp_path / "sft"
    flags = ["--model", start_model, "--data", str(data), "--chat_template", str(template), "--batch_size", "4",
             "--epochs", "1", "--save_every", "1", "--eval_problems", "0", "--threads", "1"]
    assert main(["train", "sft", "--out", str(run), *flags]) == 0
    template.write_text(template.read_text().replace("<|", "[").replace("|>", "]"))  # other role markers
    _as_interrupted(run)
    assert main(["train", "sft", "--resume", str(run), *flags]) == 2
    assert f"the run's data changed since it started (--chat_template {template}: " in _error(capsys)


def test_a_run_given_relative_paths_resumes_from_another_directory(start_model, tmp_path, monkeypatch, capsys):
    """run.json kept `--data demos.jsonl` as typed: resumed from another directory the run looked
    for the file there, and the same file given by its absolute path (or `./demos.jsonl`) was
    refused as another option (QA T). The run records where it started; each side's relative paths
    are read from its own directory."""
    import json

    from lmpo.trainers.option_paths import absolute_paths

    start = tmp_path / "project"
    start.mkdir()
    (start / "demos.jsonl").write_text("".join(f'{{"prompt": "{i}=", "completion": "{i}"}}\n' for i in range(12)))
    monkeypatch.chdir(start)
    assert main(["train", "sft", "--out", "runs/sft", "--model", start_model, "--data", "demos.jsonl", "--batch_size",
                 "4", "--epochs", "1", "--save_every", "1", "--eval_problems", "0", "--threads", "1"]) == 0
    run = start / "runs" / "sft"
    assert json.loads((run / "run.json").read_text())["cwd"] == str(start)
    _as_interrupted(run)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "sft", "--resume", str(run), "--data", str(start / "demos.jsonl")]) == 0, _error(capsys)
    _as_interrupted(run)
    monkeypatch.chdir(start)
    assert main(["train", "sft", "--resume", "runs/sft", "--data", "./demos.jsonl"]) == 0, _error(capsys)
    (start / "other.jsonl").write_text((start / "demos.jsonl").read_text())
    _as_interrupted(run)
    assert main(["train", "sft", "--resume", "runs/sft", "--data", "other.jsonl"]) == 2  # another file is another option
    assert "data='other.jsonl' (was 'demos.jsonl')" in _error(capsys)
    # a preset or Hub name, a module reward and an inline template stay as they are
    options = {"model": "tiny", "rewards": "correct=1.0,demos.jsonl:x,my_mod:fn=0.5", "chat_template": "{{ x }}",
               "task": "nope.py:Task", "rl_stage": {"data": "demos.jsonl"}}
    assert absolute_paths(options, start) == {**options, "rl_stage": {"data": str(start / "demos.jsonl")}}
    (start / "r.py").write_text("")
    assert absolute_paths({"rewards": "correct=1.0, r.py:fn=0.5"}, start) == {"rewards": f"correct=1.0, {start}/r.py:fn=0.5"}


def test_a_resume_may_name_what_auto_picked_on_this_machine(tmp_path):
    """`--resume RUN --device cpu` (or `--precision fp32`) of a run started with the defaults on a
    CPU-only machine was refused as `device='cpu' (was 'auto')` (QA T): the same choice."""
    import torch

    from lmpo.models import cpu_has_native_bf16
    from lmpo.trainers.checkpoint import check_same_config

    if torch.cuda.is_available():
        pytest.skip("auto picks a GPU here")
    check_same_config({"device": "auto", "precision": "auto"}, {"device": "cpu", "precision": "fp32"}, tmp_path)
    check_same_config({"rl_stage": {"device": "auto"}}, {"rl_stage": {"device": "cpu"}}, tmp_path)
    with pytest.raises(ValueError, match=r"seed=1 \(was 0\)"):  # anything else still differs
        check_same_config({"device": "auto", "seed": 0}, {"device": "cpu", "seed": 1}, tmp_path)
    if cpu_has_native_bf16():  # bf16 autocast is another computation than auto's fp32 on a CPU
        with pytest.raises(ValueError, match=r"precision='bf16' \(was 'auto'\)"):
            check_same_config({"precision": "auto"}, {"precision": "bf16"}, tmp_path)
    else:  # asked for where it would be emulated, bf16 runs fp32
        check_same_config({"precision": "auto"}, {"precision": "bf16"}, tmp_path)


def test_a_resume_naming_the_tasks_own_turn_limit_is_told_to_leave_it_out(tmp_path):
    """`--resume RUN --max_turns 3` of a calculator run (3 turns, the task's own) was refused as
    `max_turns=3 (was 0)` (QA V): the run recorded 0, "the task's own", which the message now says."""
    from lmpo.trainers.checkpoint import check_same_config

    with pytest.raises(ValueError, match=r"max_turns=3 \(was 0, the task's own: leave --max_turns out\)"):
        check_same_config({"max_turns": 0}, {"max_turns": 3}, tmp_path)
    with pytest.raises(ValueError, match=r"max_turns=4 \(was 3\)"):
        check_same_config({"max_turns": 3}, {"max_turns": 4}, tmp_path)


def test_a_reward_file_given_relative_keeps_its_metric_name_across_a_resume(start_model, tmp_path, monkeypatch):
    """A reward's name, its file included, names its metric (`reward_r.py:fn`): made absolute on
    resume, the rows after the checkpoint were `reward_/abs/r.py:fn`, a second series."""
    import json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.py").write_text("def fn(task, problems, completions, terminated):\n"
                                   "    return [float(len(c) % 3) for c in completions]\n")
    (tmp_path / "p.jsonl").write_text("".join(f'{{"prompt": "{i}{i + 1}=", "answer": "{i + 1}{i}"}}\n' for i in range(4)))
    assert main(["train", "grpo", "--model", start_model, "--prompts", "p.jsonl", "--task", "exact_match",
                 "--rewards", "correct=1.0,r.py:fn=0.5", "--out", "run", *RL_RUN]) == 0
    run = tmp_path / "run"
    _as_interrupted(run)  # its newest checkpoint is step 1's: the resume redoes step 2
    assert main(["train", "grpo", "--resume", "run"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [sorted(k for k in r if k.startswith("reward_") and k != "reward_mean" and k != "reward_std") for r in rows
            if "reward_mean" in r] == [["reward_correct", "reward_r.py:fn"]] * 2
