"""A trainer refuses bad inputs before its run directory exists: a wrong --out is not left holding
a `run.json` of a run that never started, and a model, data file, task or reward function that
is wrong says so before anything is written or loaded."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmpo.cli.main import main

NO_PAIRS = "task 'exact_match' has no embedded preference pairs; give a file with --data"
NO_PROMPTS = "task exact_match has no embedded prompts: give a prompt file (--prompts FILE)"
NO_HELDOUT = "task exact_match has no embedded held-out prompts"


@pytest.mark.parametrize("command,message", [("dpo", NO_PAIRS), ("orpo", NO_PAIRS), ("kto", NO_PAIRS), ("rm", NO_PAIRS),
                                             ("online_dpo", NO_PROMPTS), ("rft", NO_PROMPTS), ("grpo", NO_HELDOUT),
                                             ("ppo", NO_HELDOUT)])
def test_a_task_without_the_data_a_trainer_needs_leaves_no_run_directory(command, message, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", command, "--task", "exact_match", "--model", "tiny", "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("command,flag", [("sft", "--data"), ("cpt", "--data"), ("dpo", "--data"), ("orpo", "--data"),
                                          ("kto", "--data"), ("rm", "--data"), ("grpo", "--prompts"),
                                          ("rft", "--prompts"), ("online_dpo", "--prompts")])
def test_a_missing_data_file_leaves_no_run_directory(command, flag, tmp_path, capsys):
    out, missing = tmp_path / "run", tmp_path / "missing.jsonl"
    assert main(["train", command, "--model", "tiny", flag, str(missing), "--out", str(out)]) == 2
    assert f"{missing}: no such file or directory" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("extra,message", [
    (["--rewards", "no_such_module:fn=1"], "reward function 'no_such_module:fn': cannot import module"),
    (["--rewards", "rm=1", "--reward_model", "no/such/rm"], "reward_model 'no/such/rm' is not a model directory"),
    (["--model", "runs/absent/model"], "model directory runs/absent/model does not exist")])
@pytest.mark.parametrize("command", ["grpo", "rft", "online_dpo"])
def test_a_wrong_reward_or_model_leaves_no_run_directory(command, extra, message, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", command, "--model", "tiny", *extra, "--out", str(out)]
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_hub_id_the_offline_cache_lacks_is_refused_at_once(tmp_path, monkeypatch, capsys):
    """No network: the Hub id is looked up in the cache only, and refused naming it and the cache,
    with no retries and nothing written (it took ~50 s of retries per load, then a message that
    did not name the model)."""
    from huggingface_hub import constants

    import lmpo.models.hub as hub

    monkeypatch.setattr(hub, "hub_unreachable", lambda endpoint: "huggingface.co:443: Connection refused")
    monkeypatch.setattr(hub, "went_offline", "")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # restored after the test: the check sets it for the process
    for command in (["train", "sft"], ["train", "grpo"], ["pipeline"], ["eval"]):
        out = tmp_path / command[-1]
        assert main([*command, "--model", "someone/absent-model", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "model 'someone/absent-model' is not a local directory or a preset" in err
        assert f"not in this machine's cache ({tmp_path / 'hub'}) while the Hub cannot be reached " \
               "(huggingface.co:443: Connection refused)" in err
        assert not out.exists()
    assert constants.HF_HUB_OFFLINE  # later loads in this process go to the cache directly


def test_a_cached_hub_model_trains_without_network_and_without_retries(start_model, tmp_path):
    """A model in the Hugging Face cache, the Hub unreachable (HF_ENDPOINT at a closed port): the
    run loads it from the cache, with none of huggingface_hub's retry messages."""
    snapshot = tmp_path / "hf" / "hub" / "models--someone--tiny-llama" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abcd")
    for item in Path(start_model).iterdir():
        (snapshot / item.name).write_bytes(item.read_bytes())
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9"}
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
                 "ALL_PROXY", "all_proxy"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "lmpo.cli.main", "train", "sft", "--model", "someone/tiny-llama",
                           "--epochs", "1", "--demonstrations", "16", "--eval_problems", "0",
                           "--out", str(tmp_path / "run")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Retrying" not in done.stderr and "thrown while requesting" not in done.stderr
    assert (tmp_path / "run" / "model" / "config.json").is_file()


@pytest.mark.parametrize("raised,kept", [(ValueError("a check made after the directory opened"), False),
                                         (KeyboardInterrupt(), True)])
def test_a_fresh_run_that_fails_before_writing_leaves_no_directory_but_ctrl_c_keeps_it(raised, kept, monkeypatch,
                                                                                      tmp_path, capsys):
    """A failure before the run wrote anything of its own removes the directory it opened; after
    Ctrl-C the directory stays, for `--resume` to start it over with its options (the hint says so)."""
    import lmpo.trainers.rl as rl

    def fail(name, step):
        raise raised

    monkeypatch.setattr(rl, "fault_point", fail)
    out = tmp_path / "run"
    args = ["train", "grpo", "--model", "tiny", "--out", str(out), "--steps", "2", "--prompts_per_step", "2",
            "--group_size", "2", "--eval_problems", "0", "--save_every", "0", "--threads", "1"]
    assert main(args) == (130 if kept else 2)
    assert out.exists() == kept
    if kept:
        assert f"--resume {out}" in capsys.readouterr().err
