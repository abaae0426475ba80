"""A model directory that ships its own Python code (`auto_map` in its config): transformers put
up a terminal prompt mid-run ("Do you wish to run the custom code? [y/N]", again for every copy it
loads) and, answered no or without a terminal, a multi-line error telling the user to pass an
argument no lmpo command had. Now it is refused in one line unless `--trust_remote_code true`,
with which every trainer loads it (policy, reference, critic, tokenizer) and saves a model that
loads the same way."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from lmpo.cli.main import main

from hardening_common import error_line

CODE = '''from transformers import GPT2Config, GPT2LMHeadModel


class TinyConfig(GPT2Config):
    model_type = "lmpo_test_tiny"


class TinyLM(GPT2LMHeadModel):
    config_class = TinyConfig
'''
RUN = ["--eval_problems", "0", "--threads", "1", "--save_every", "0"]


@pytest.fixture(scope="module")
def custom_model(tmp_path_factory, char_tokenizer):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("custom")
    GPT2LMHeadModel(GPT2Config(vocab_size=len(char_tokenizer), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                               bos_token_id=char_tokenizer.bos_token_id, eos_token_id=char_tokenizer.eos_token_id,
                               pad_token_id=char_tokenizer.pad_token_id)).save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    (path / "modeling_tiny.py").write_text(CODE)
    config = json.loads((path / "config.json").read_text())
    config.update(model_type="lmpo_test_tiny",
                  auto_map={"AutoConfig": "modeling_tiny.TinyConfig", "AutoModelForCausalLM": "modeling_tiny.TinyLM"})
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def _data(tmp_path) -> str:
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}=", "completion": f"{i}"}) + "\n" for i in range(8)))
    return str(path)


def test_a_model_with_its_own_code_is_refused_in_one_line_without_trust(custom_model, tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("asked on the terminal"))
    argv = ["train", "sft", "--model", custom_model, "--data", _data(tmp_path), "--epochs", "1",
            "--out", str(tmp_path / "s"), *RUN]
    assert main(argv) == 2
    assert error_line(capsys) == (f"lmpo: error: {custom_model} is a model with its own Python code "
                                  "(modeling_tiny.TinyConfig, modeling_tiny.TinyLM); loading it runs that code, "
                                  "which lmpo does only with --trust_remote_code true")


def test_with_trust_every_trainer_loads_it_and_saves_a_model_that_loads_alike(custom_model, tmp_path):
    from transformers import AutoModelForCausalLM

    data = _data(tmp_path)
    sft = tmp_path / "sft"
    assert main(["train", "sft", "--model", custom_model, "--data", data, "--epochs", "1", "--out", str(sft),
                 "--trust_remote_code", "true", *RUN]) == 0
    assert (sft / "model" / "modeling_tiny.py").is_file()
    assert type(AutoModelForCausalLM.from_pretrained(sft / "model", trust_remote_code=True)).__name__ == "TinyLM"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{i}=", "answer": f"{i}"}) + "\n" for i in range(8)))
    rl = ["--task", "exact_match", "--prompts", str(prompts), "--steps", "1", "--prompts_per_step", "2",
          "--group_size", "2", "--max_new_tokens", "4", "--reward_timeout", "0", "--trust_remote_code", "true", *RUN]
    # a reference copy (beta > 0), a critic from the same model, and LoRA's base
    assert main(["train", "grpo", "--model", str(sft / "model"), "--out", str(tmp_path / "g"), *rl]) == 0
    assert main(["train", "ppo", "--model", str(sft / "model"), "--out", str(tmp_path / "p"), *rl]) == 0
    assert main(["train", "grpo", "--model", str(sft / "model"), "--out", str(tmp_path / "l"), "--lora_r", "4",
                 *rl]) == 0
