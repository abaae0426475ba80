"""What a user's own directories meet: a model saved without its tokenizer, an adapter trained on a
base given by a relative path and used from elsewhere, a LoRA target name that matches nothing,
`--out` beside `--resume`, and a new run in a directory an earlier run used (its metrics,
trajectories and kept best model must not pass for the new run's, and no file of its model may
outlive the new model in model/)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from lmpo.cli.main import main

from hardening_common import RL_RUN, SFT_RUN, error_line


def test_a_model_saved_without_its_tokenizer_is_refused(start_model, tmp_path, capsys):
    """transformers builds an empty tokenizer for such a directory: every text became no tokens
    and SFT trained on nothing (loss 0 at every step)."""
    from lmpo.models import load_tokenizer

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(Path(start_model) / name, bare / name)
    with pytest.raises(FileNotFoundError, match=rf"{bare} has no tokenizer \(none of tokenizer.json, "):
        load_tokenizer(str(bare))
    assert main(["train", "sft", "--model", str(bare), "--out", str(tmp_path / "run"), *SFT_RUN]) in (1, 2)
    assert f"{bare} has no tokenizer" in error_line(capsys)


def test_a_models_file_given_for_its_directory_says_so(start_model, tmp_path, capsys):
    """`--model DIR/config.json` said "DIR/config.json is not a Hugging Face model directory: it
    has no config.json"."""
    config = Path(start_model) / "config.json"
    assert main(["eval", "--model", str(config), "--eval_problems", "2"]) == 2
    assert error_line(capsys) == (f"lmpo: error: {config} is a file; a model is given as its directory "
                                  f"({start_model})")


def test_a_run_directorys_config_given_for_a_model_points_at_the_runs_model(start_model, tmp_path, capsys):
    """`--model RUN/config.json` suggested RUN, which was then refused as a run directory."""
    from lmpo.models.loading import check_model_source

    run = tmp_path / "run"
    shutil.copytree(start_model, run / "model")
    (run / "run.json").write_text("{}")
    (run / "config.json").write_text(json.dumps({"steps": 2}))
    assert main(["eval", "--model", str(run / "config.json"), "--eval_problems", "2"]) == 2
    assert error_line(capsys) == (f"lmpo: error: {run / 'config.json'} is a file; a model is given as its directory "
                                  f"({run / 'model'}: {run} is a run directory, and its model is there)")
    check_model_source(str(run / "model"))


def test_an_adapter_names_its_base_by_absolute_path_and_a_lost_base_is_named(start_model, tmp_path, monkeypatch,
                                                                              capsys):
    shutil.copytree(start_model, tmp_path / "base")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "sft", "--model", "base", "--out", "lora", *SFT_RUN, "--save_every", "0",
                 "--lora_r", "2"]) == 0
    config = json.loads((tmp_path / "lora/model/adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((tmp_path / "base").resolve())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # an adapter from before, naming its base relative to where it was trained
    config["base_model_name_or_path"] = "base"
    (tmp_path / "lora/model/adapter_config.json").write_text(json.dumps(config))
    assert main(["train", "sft", "--model", str(tmp_path / "lora/model"), "--out", "next", *SFT_RUN]) == 2
    line = error_line(capsys)
    assert f"the adapter in {tmp_path / 'lora/model'} names its base model 'base' (base_model_name_or_path in its " \
           f"adapter_config.json; a relative path is read from the current directory, {elsewhere})" in line, line
    assert not (elsewhere / "next").exists()


def test_a_lora_target_that_matches_no_layer_is_refused_naming_the_layers(start_model, tmp_path, capsys):
    assert main(["train", "sft", "--model", start_model, "--out", str(tmp_path / "run"), *SFT_RUN,
                 "--lora_r", "2", "--lora_target_modules", "q_proj,foo_proj"]) in (1, 2)
    line = error_line(capsys)
    assert "LoRA target module(s) foo_proj match no layer of this LlamaForCausalLM" in line, line
    assert "its linear layers are named down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj" in line


@pytest.fixture(scope="module")
def rl_run(start_model, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("rl") / "run"
    assert main(["train", "grpo", "--model", start_model, "--out", str(run), *RL_RUN, "--save_trajectories", "4"]) == 0
    return run


def test_out_that_names_another_directory_than_resume_is_refused(rl_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(rl_run, run)
    (run / "result.json").unlink()  # as if killed after its last checkpoint (a finished run is not resumed)
    rl_run = run
    other = tmp_path / "other"
    assert main(["train", "grpo", "--resume", str(rl_run), "--out", str(other)]) == 2
    assert error_line(capsys) == (f"lmpo: error: --resume {rl_run} continues the run in that directory, and --out "
                                  f"{other} names another: a resumed run writes where it started; give --resume alone")
    assert not other.exists()
    assert main(["train", "grpo", "--resume", str(rl_run), "--out", str(rl_run)]) == 0  # the same one: as --resume alone
    moved = tmp_path / "moved"  # its saved options name where it was: --resume alone still continues it
    shutil.copytree(rl_run, moved)
    (moved / "result.json").unlink()
    assert main(["train", "grpo", "--resume", str(moved)]) == 0


def test_a_new_run_in_an_earlier_runs_directory_leaves_nothing_of_it(rl_run, start_model, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(rl_run, run)
    (run / "best").mkdir()  # as a stopping rule keeps it: a later restore must never load it
    (run / "best" / "model.safetensors").write_bytes(b"stale")
    (run / "model" / "model-00002-of-00002.safetensors").write_bytes(b"a shard of an earlier model")
    assert {"trajectories.jsonl", "config.json", "metrics.jsonl"} <= {p.name for p in run.iterdir()}
    assert main(["train", "sft", "--model", start_model, "--out", str(run), *SFT_RUN, "--lora_r", "2"]) == 0
    assert "replacing the finished run there (its 1 checkpoint(s) and its files deleted" in capsys.readouterr().out
    left = {p.name for p in run.iterdir()}
    assert not left & {"trajectories.jsonl", "config.json", "best"}, left
    assert all("reward_mean" not in line for line in (run / "metrics.jsonl").read_text().splitlines())
    # the adapter alone in model/: before, the earlier full model's config.json stayed and it loaded as that model
    assert {p.name for p in (run / "model").iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
    assert not {"config.json", "model.safetensors", "model-00002-of-00002.safetensors"} & {
        p.name for p in (run / "model").iterdir()}
    assert not [p for p in run.iterdir() if p.name.startswith((".model-", ".old-"))]


def test_a_lora_run_whose_base_is_the_model_it_would_replace_is_refused(rl_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(rl_run, run)
    before = sorted(os.listdir(run / "model"))
    assert main(["train", "sft", "--model", str(run / "model"), "--out", str(run), *SFT_RUN, "--lora_r", "2"]) == 2
    assert "its model/ is this run's --model, the base its LoRA adapter is trained on" in error_line(capsys)
    assert sorted(os.listdir(run / "model")) == before and (run / "result.json").is_file()


def test_a_directory_named_like_a_preset_hides_it_only_when_it_holds_a_model(start_model, tmp_path, monkeypatch,
                                                                             capsys):
    """An empty ./tiny made the default model (`tiny`) fail: "tiny is not a Hugging Face model
    directory: it has no config.json"; now the preset is used, and either choice is said once."""
    from lmpo.models import is_preset
    from lmpo.models import presets
    from lmpo.trainers.inputs import input_fingerprints

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").mkdir()
    if hasattr(presets, "_say_which"):  # said once per process
        presets._say_which.cache_clear()
    assert main(["train", "sft", "--out", "run", *SFT_RUN, "--save_every", "0"]) == 0
    assert capsys.readouterr().err.count(
        "[model] tiny: the embedded preset (./tiny is a directory but not a model)\n") == 1
    assert input_fingerprints(SimpleNamespace(model="tiny")) == {}  # a resume is not refused for files put in ./tiny
    shutil.copytree(start_model, tmp_path / "small")
    assert not is_preset("small") and not is_preset("small")
    assert capsys.readouterr().err == ("[model] small: the model in ./small (a directory here named like the preset; "
                                       "give another name to use the preset)\n")
    # a run directory named like the preset means that run: its model/ is named, not the preset used
    shutil.copytree(tmp_path / "run", tmp_path / "tiny", dirs_exist_ok=True)
    presets._say_which.cache_clear()
    assert not is_preset("tiny")
    assert main(["train", "sft", "--out", "run2", *SFT_RUN, "--save_every", "0"]) == 2
    assert "tiny/model" in capsys.readouterr().err
