"""LoRA through the command line on a locally saved Qwen2: GRPO and DPO train an adapter, the
reference is the base with the adapter disabled (one model loaded, never two), the saved
adapter loads with plain PEFT, a later stage starts from it, and a LoRA run resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from safetensors.torch import load_file

from lmpo.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory, char_tokenizer):
    torch.manual_seed(11)
    config = Qwen2Config(vocab_size=len(char_tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False, pad_token_id=char_tokenizer.pad_token_id,
                         eos_token_id=char_tokenizer.eos_token_id)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.bias.normal_(0, 0.5)
    path = tmp_path_factory.mktemp("qwen2-cli")
    model.save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture
def loads(monkeypatch):
    """Counts the causal LMs the trainers load (the reference copy would be a second one)."""
    import lmpo.trainers.harness as harness
    import lmpo.trainers.rl as rl

    calls = []
    for module in (harness, rl):
        real = module.load_model

        def counting(*args, _real=real, **kwargs):
            calls.append(args[0])
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, "load_model", counting)
    return calls


GRPO = ["--steps", "2", "--prompts_per_step", "2", "--group_size", "4", "--eval_problems", "8",
        "--eval_every", "2", "--threads", "1", "--lora_r", "4", "--lora_alpha", "8", "--rewards",
        "reward_fns:length=1.0", "--lr", "1e-2"]


def _adapter_loads_with_peft(base_dir: str, adapter_dir) -> torch.Tensor:
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(base_dir)
    model = PeftModel.from_pretrained(base, str(adapter_dir))
    b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert b, "no LoRA weights were loaded"
    return torch.cat([p.flatten() for p in b])


def test_lora_grpo_through_the_cli_trains_an_adapter_with_one_model_loaded(qwen2_dir, tmp_path, loads):
    out = tmp_path / "grpo"
    assert main(["train", "grpo", "--model", qwen2_dir, "--out", str(out), "--beta", "0.04", *GRPO]) == 0
    assert loads == [qwen2_dir]  # the policy only: the reference is the same model with its adapter disabled
    result = json.loads((out / "result.json").read_text())
    assert result["models_held"]["reference"] == 0
    assert (out / "model" / "adapter_config.json").exists()
    assert _adapter_loads_with_peft(qwen2_dir, out / "model").abs().sum() > 0  # B moved off 0: it trained
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "kl" in r] == [1, 2]
    assert rows[1]["kl"] == pytest.approx(0.0, abs=1e-6)  # step 1: the adapter starts at B = 0, policy = base


def test_lora_dpo_through_the_cli_and_a_merged_model(qwen2_dir, tmp_path, loads):
    out = tmp_path / "dpo"
    assert main(["train", "dpo", "--model", qwen2_dir, "--out", str(out), "--pairs", "64", "--batch_size", "16",
                 "--eval_problems", "0", "--threads", "1", "--lora_r", "4", "--lora_merge", "true", "--lr", "1e-2",
                 "--log_every", "1"]) == 0
    assert loads == [qwen2_dir]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["loss"] == pytest.approx(0.6931472, abs=1e-6)  # ln 2: the reference is exactly the start
    assert rows[-1]["loss"] < rows[0]["loss"]
    _adapter_loads_with_peft(qwen2_dir, out / "model")
    merged = AutoModelForCausalLM.from_pretrained(out / "model" / "merged")
    assert isinstance(merged, Qwen2ForCausalLM)


def test_a_later_stage_starts_from_a_lora_stage_and_a_lora_run_resumes(qwen2_dir, tmp_path):
    first = tmp_path / "first"
    assert main(["train", "grpo", "--model", qwen2_dir, "--out", str(first), *GRPO, "--eval_problems", "0"]) == 0
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    args = ["train", "grpo", "--model", str(first / "model"), *GRPO, "--eval_problems", "0", "--steps", "4",
            "--save_every", "2"]
    assert main([*args, "--out", str(whole)]) == 0
    killed = subprocess.run([sys.executable, "-m", "lmpo", *args, "--out", str(cut)], cwd=ROOT,
                            env={**os.environ, "LMPO_KILL_AT": "after_rollout:3",
                                 "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])},
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode != 0 and not (cut / "model").exists()
    assert main([*args, "--resume", str(cut)]) == 0  # restores the adapter and optimizer of step 2
    a, b = load_file(whole / "model" / "adapter_model.safetensors"), load_file(cut / "model" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-6, rtol=0), key


@pytest.mark.parametrize("kind", ["sft", "rm", "online_dpo"])
def test_every_other_trainer_trains_an_adapter(qwen2_dir, tmp_path, kind):
    budget = {"sft": ["--demonstrations", "32", "--epochs", "1"],
              "rm": ["--pairs", "32", "--heldout_pairs", "8", "--batch_size", "16"],
              "online_dpo": ["--rounds", "1", "--prompts_per_round", "8", "--batch_size", "8",
                             "--rewards", "reward_fns:length=1.0"]}[kind]
    out = tmp_path / kind
    assert main(["train", kind, "--model", qwen2_dir, "--out", str(out), "--threads", "1", "--lora_r", "4",
                 *(["--eval_problems", "0"] if kind != "rm" else []), *budget]) == 0
    config = json.loads((out / "model" / "adapter_config.json").read_text())
    assert config["r"] == 4
    if kind == "rm":  # the score head trains in full beside the adapter
        assert config["modules_to_save"] and "score" in config["modules_to_save"]


@pytest.mark.parametrize("flags", [["--lora_target_modules", "lm_head,q_proj"], ["--lora_target_modules", "embed_tokens"]])
def test_lora_on_the_tied_head_or_embeddings_is_refused_and_leaves_no_run_directory(flags, char_tokenizer, tmp_path,
                                                                                  capsys):
    """Merging an adapter on a tied lm_head rewrote the input embeddings too: the merged model (and
    the adapter as lmpo loads it, by merging) was not the model trained (logits 20 apart)."""
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(char_tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         pad_token_id=char_tokenizer.pad_token_id, eos_token_id=char_tokenizer.eos_token_id)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "tied")
    char_tokenizer.save_pretrained(tmp_path / "tied")
    out = tmp_path / "run"
    assert main(["train", "sft", "--model", str(tmp_path / "tied"), "--out", str(out), "--threads", "1",
                 "--demonstrations", "8", "--epochs", "1", "--eval_problems", "0", "--lora_r", "2", *flags]) == 2
    assert "ties its output head to its input embeddings" in capsys.readouterr().err
    assert not out.exists()  # refused once the model was loaded: the directory it opened is gone again


def test_ppo_under_lora_trains_its_separate_critic_through_an_adapter(qwen2_dir, tmp_path):
    """PPO's separate critic was a full copy trained in full under --lora_r: gradients and Adam
    state for every weight of a second model, undoing what LoRA saves. Now its trunk carries its
    own adapter: the frozen weights stay those of the start model; the adapter and head train."""
    out = tmp_path / "ppo"
    assert main(["train", "ppo", "--model", qwen2_dir, "--out", str(out), *GRPO, "--eval_problems", "0"]) == 0
    critic = load_file(out / "critic.safetensors")
    start = load_file(Path(qwen2_dir) / "model.safetensors")
    frozen = {k: v for k, v in critic.items() if ".base_layer." in k or (k.startswith("trunk.") and "lora_" not in k)}
    assert any("lora_B" in k for k in critic) and frozen
    for key, value in frozen.items():
        name = "model." + key.removeprefix("trunk.").replace(".base_layer", "")
        assert torch.equal(value, start[name]), key
    assert any(v.abs().sum() > 0 for k, v in critic.items() if "lora_B" in k)  # the adapter trained
    assert critic["head.linear.weight"].abs().sum() > 0


def test_ppo_set_up_line_counts_the_separate_critics_parameters_too(qwen2_dir, tmp_path, capsys):
    """The set-up line said "N of M parameters trainable" of the policy alone: a separate critic
    (a second model, under LoRA with its own adapter) was in no count. Now the line says its own."""
    import re

    out = tmp_path / "ppo"
    assert main(["train", "ppo", "--model", qwen2_dir, "--out", str(out), *GRPO, "--steps", "1",
                 "--eval_problems", "0"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if "parameters trainable" in l)
    critic = re.search(r"critic=separate \(its own ([\d,]+) of ([\d,]+) parameters trainable", line)
    assert critic, line
    trainable, total = (int(g.replace(",", "")) for g in critic.groups())
    saved = load_file(out / "critic.safetensors")
    assert total == sum(v.numel() for v in saved.values())
    assert trainable == sum(v.numel() for k, v in saved.items() if "lora_" in k or k.startswith("head."))
    assert re.search(r"; [\d,]+ of [\d,]+ parameters trainable", line.split("the policy's count follows")[1])


def test_a_lora_reward_model_trained_on_a_lora_stage_scores_as_its_merged_copy(qwen2_dir, tmp_path):
    """SFT with LoRA, then `train rm --lora_r` on its model/: the reward model's adapter names the
    SFT adapter as its base, and `--reward_model` refused it ('not a local model directory')."""
    from transformers import AutoModelForSequenceClassification

    from lmpo.models.reward_scorer import RewardModelReward

    sft, rm = tmp_path / "sft", tmp_path / "rm"
    assert main(["train", "sft", "--model", qwen2_dir, "--out", str(sft), "--demonstrations", "8", "--epochs", "1",
                 "--eval_problems", "0", "--threads", "1", "--lora_r", "4", "--lr", "1e-2"]) == 0
    assert main(["train", "rm", "--model", str(sft / "model"), "--out", str(rm), "--pairs", "16", "--heldout_pairs",
                 "4", "--batch_size", "8", "--threads", "1", "--lora_r", "4", "--lora_merge", "true", "--lr", "1e-2"]) == 0
    assert main(["train", "grpo", "--model", str(sft / "model"), "--out", str(tmp_path / "grpo"), *GRPO,
                 "--steps", "1", "--eval_problems", "0", "--rewards", "rm", "--reward_model", str(rm / "model")]) == 0
    scorer = RewardModelReward(str(rm / "model"), encode_prompt=lambda tok, text: tok(text)["input_ids"])
    scorer.setup()
    merged = AutoModelForSequenceClassification.from_pretrained(rm / "model" / "merged").eval()
    ids = torch.tensor([[5, 9, 12, 20, 7, 3, 30, 11]])
    with torch.no_grad():
        assert torch.allclose(scorer.model(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-5)


def test_a_lora_reward_models_adapter_is_refused_where_a_causal_lm_is_loaded(qwen2_dir, tmp_path, capsys):
    """A full reward model given as --model was refused ('saved as a ...ForSequenceClassification,
    not a causal LM'), but its LoRA twin loaded: its adapter merged into a causal LM, its score
    head dropped, and DPO or eval ran on a trunk trained for scoring."""
    rm = tmp_path / "rm"
    assert main(["train", "rm", "--model", qwen2_dir, "--out", str(rm), "--pairs", "16", "--heldout_pairs", "4",
                 "--batch_size", "8", "--threads", "1", "--lora_r", "4"]) == 0
    capsys.readouterr()
    assert main(["eval", "--model", str(rm / "model"), "--eval_problems", "2", "--threads", "1"]) != 0
    assert main(["train", "dpo", "--model", str(rm / "model"), "--out", str(tmp_path / "dpo"), "--pairs", "8",
                 "--threads", "1"]) != 0
    err = capsys.readouterr().err
    assert err.count("SEQ_CLS") == 2 and "not a causal LM" in err
    assert not (tmp_path / "dpo").exists()
