"""LoRA through PEFT: the base with the adapter off is the reference, adapters save and load
(alone, merged, and as the start of a next stage), on the embedded preset and on a Qwen2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from lmpo.models import (LoraOptions, adapter_disabled, completion_outputs, enable_gradient_checkpointing, is_peft_model,
                         load_model, load_tokenizer, parameter_counts, reference_logprobs, save_lora, save_model,
                         trainable_parameters)
from lmpo.models.memory import is_checkpointing
from lmpo.models.padding import left_pad

OPTS = LoraOptions(r=4, alpha=8.0)


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory, char_tokenizer):
    torch.manual_seed(5)
    config = Qwen2Config(vocab_size=len(char_tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, pad_token_id=char_tokenizer.pad_token_id,
                         eos_token_id=char_tokenizer.eos_token_id)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # random q/k/v biases, so that the base's biases matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    path = tmp_path_factory.mktemp("qwen2")
    model.save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(params=["tiny", "qwen2"])
def base_name(request, qwen2_dir):
    return "tiny" if request.param == "tiny" else qwen2_dir


def _batch(tok):
    g = torch.Generator().manual_seed(0)
    prompts = [[tok.bos_token_id] + torch.randint(10, 60, (n,), generator=g).tolist() for n in (4, 2)]
    return (*left_pad(prompts, tok.pad_token_id), torch.randint(10, 60, (2, 6), generator=g))


def _logprobs(model, batch, **kw):
    with torch.no_grad():
        return completion_outputs(model, *batch, **kw).logprobs


def _train_step(policy, batch, lr=0.05):
    optimizer = torch.optim.Adam(list(trainable_parameters(policy)), lr=lr)
    loss = -completion_outputs(policy, *batch).logprobs.mean()
    loss.backward()
    optimizer.step()


def test_the_base_with_the_adapter_off_is_the_reference(base_name, char_tokenizer):
    batch = _batch(char_tokenizer)
    base = _logprobs(load_model(base_name, char_tokenizer, seed=2), batch)
    policy = load_model(base_name, char_tokenizer, seed=2, keep_dropout=False, lora=OPTS)
    assert is_peft_model(policy)
    # a fresh adapter (B = 0) changes nothing
    torch.testing.assert_close(_logprobs(policy, batch), base, atol=1e-6, rtol=0)
    torch.testing.assert_close(reference_logprobs(policy, *batch), base, atol=1e-6, rtol=0)
    policy.train()
    _train_step(policy, batch)
    policy.eval()
    trained = _logprobs(policy, batch)
    assert (trained - base).abs().max() > 1e-2
    assert trained.mean() > base.mean()  # the step raised the likelihood it was trained on
    torch.testing.assert_close(reference_logprobs(policy, *batch), base, atol=1e-6, rtol=0)
    torch.testing.assert_close(reference_logprobs(policy, *batch, chunk_tokens=5), base, atol=1e-6, rtol=0)
    torch.testing.assert_close(_logprobs(policy, batch, chunk_tokens=5), trained, atol=1e-6, rtol=0)
    with adapter_disabled(policy):
        torch.testing.assert_close(_logprobs(policy, batch), base, atol=1e-6, rtol=0)
    torch.testing.assert_close(_logprobs(policy, batch), trained, atol=0, rtol=0)  # on again after the block


def test_only_the_adapter_trains(base_name, char_tokenizer):
    policy = load_model(base_name, char_tokenizer, lora=OPTS)
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    targeted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in names}
    assert targeted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}  # all-linear, no head
    counts = parameter_counts(policy)
    hidden, layers = policy.config.hidden_size, policy.config.num_hidden_layers
    assert counts.trainable == sum(p.numel() for p in trainable_parameters(policy))
    assert 0 < counts.trainable < 0.2 * counts.total
    assert counts.trainable % (OPTS.r * layers) == 0 and counts.trainable > OPTS.r * 2 * hidden * 7 * layers // 2
    only_qv = load_model(base_name, char_tokenizer, lora=LoraOptions(r=2, target_modules=["q_proj", "v_proj"]))
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, p in only_qv.named_parameters() if p.requires_grad} == {"q_proj", "v_proj"}


def test_adapter_saves_alone_and_merged_and_starts_a_next_stage(base_name, char_tokenizer, tmp_path):
    from peft import PeftModel

    batch = _batch(char_tokenizer)
    policy = load_model(base_name, char_tokenizer, seed=2, lora=OPTS)
    _train_step(policy.train(), batch)
    trained = _logprobs(policy.eval(), batch)
    out = save_lora(policy, char_tokenizer, tmp_path / "sft", merged=True)
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert not (out / "config.json").exists()
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == base_name
    torch.testing.assert_close(_logprobs(policy, batch), trained, atol=0, rtol=0)  # saving merged left it as it was

    plain_peft = PeftModel.from_pretrained(load_model(base_name, char_tokenizer, seed=2), str(out))
    torch.testing.assert_close(_logprobs(plain_peft, batch), trained, atol=1e-6, rtol=0)
    merged = AutoModelForCausalLM.from_pretrained(out / "merged")
    assert not is_peft_model(merged)
    torch.testing.assert_close(_logprobs(merged, batch), trained, atol=1e-5, rtol=0)

    tok = load_tokenizer(str(out))
    assert tok.pad_token_id == char_tokenizer.pad_token_id
    as_plain = load_model(str(out), tok, seed=2)  # a full fine-tune starting from the adapter run
    assert not is_peft_model(as_plain)
    torch.testing.assert_close(_logprobs(as_plain, batch), trained, atol=1e-5, rtol=0)
    assert all(p.requires_grad for p in as_plain.parameters())  # merged, every weight trains again
    _train_step(as_plain.train(), batch)
    assert (_logprobs(as_plain.eval(), batch) - trained).abs().max() > 1e-2

    stage2 = load_model(str(out), tok, seed=2, lora=OPTS)  # a fresh adapter over the merged stage-1 model
    torch.testing.assert_close(reference_logprobs(stage2, *batch), trained, atol=1e-5, rtol=0)
    _train_step(stage2.train(), batch)
    trained2 = _logprobs(stage2.eval(), batch)
    assert (trained2 - trained).abs().max() > 1e-2
    out2 = save_lora(stage2, tok, tmp_path / "rl")
    assert not (out2 / "merged").exists()
    reloaded = load_model(str(out2), tok, seed=2)
    torch.testing.assert_close(_logprobs(reloaded, batch), trained2, atol=1e-5, rtol=0)


def test_a_run_resumes_its_adapter(char_tokenizer, qwen2_dir, tmp_path):
    batch = _batch(char_tokenizer)
    base = _logprobs(load_model(qwen2_dir, char_tokenizer), batch)
    policy = load_model(qwen2_dir, char_tokenizer, lora=OPTS)
    _train_step(policy.train(), batch)
    trained = _logprobs(policy.eval(), batch)
    save_model(policy, char_tokenizer, tmp_path / "step-1")  # save_model writes a LoRA model's adapter
    assert (tmp_path / "step-1" / "adapter_model.safetensors").exists()
    resumed = load_model(qwen2_dir, char_tokenizer, lora=OPTS, resume_adapter=str(tmp_path / "step-1"))
    assert [n for n, p in resumed.named_parameters() if p.requires_grad] == \
        [n for n, p in policy.named_parameters() if p.requires_grad]
    torch.testing.assert_close(_logprobs(resumed, batch), trained, atol=1e-6, rtol=0)
    torch.testing.assert_close(reference_logprobs(resumed, *batch), base, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="needs lora"):
        load_model(qwen2_dir, char_tokenizer, resume_adapter=str(tmp_path / "step-1"))


def test_gradient_checkpointing_on_a_lora_model(char_tokenizer):
    batch = _batch(char_tokenizer)
    grads = []
    for checkpointed in (False, True):
        torch.manual_seed(7)  # the adapter's A is drawn from the global generator
        policy = load_model("tiny", char_tokenizer, seed=2, lora=OPTS)
        with torch.no_grad():  # a non-zero B, so that every adapter parameter gets a gradient
            for name, p in policy.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
        if checkpointed:
            enable_gradient_checkpointing(policy)
        assert is_checkpointing(policy) == checkpointed
        policy.train()
        loss = -completion_outputs(policy, *batch, chunk_tokens=4).logprobs.mean()
        grads.append(torch.autograd.grad(loss, list(trainable_parameters(policy))))
    assert all(g.abs().sum() > 0 for g in grads[0])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_clear_errors(char_tokenizer, tiny_llama, start_model, tmp_path):
    with pytest.raises(TypeError, match="no adapter to disable"):
        adapter_disabled(tiny_llama)
    with pytest.raises(TypeError, match="no LoRA adapter"):
        save_lora(tiny_llama, char_tokenizer, tmp_path)
    with pytest.raises(ValueError, match="rank and alpha"):
        LoraOptions(r=0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="QLoRA.*CUDA"):
            load_model(start_model, char_tokenizer, lora=LoraOptions(qlora=True))
    with pytest.raises(ValueError, match="preset"):
        load_model("tiny", char_tokenizer, lora=LoraOptions(qlora=True))


def test_an_adapter_whose_base_moved_says_so(tmp_path):
    """An adapter names its base by path; with the base moved, the error named only the missing
    base directory, not the adapter that pointed there or the field to fix."""
    import json

    import pytest

    from lmpo.models import build_char_tokenizer, load_model

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "gone")}))
    with pytest.raises(FileNotFoundError, match=rf"the adapter in {adapter} was trained on {tmp_path}/gone "
                                                r"\(base_model_name_or_path in its adapter_config.json\), which "
                                                r"does not exist"):
        load_model(str(adapter), build_char_tokenizer())


def test_the_python_api_and_the_trainers_share_the_lora_defaults():
    """`LoraOptions` scaled the update by 32/16 = 2 while `--lora_r 16` in the trainers scaled it
    by 16/16 = 1: the same adapter trained differently from the Python API and from the CLI."""
    from lmpo.trainers.harness import RunOptions

    assert LoraOptions().alpha == RunOptions().lora_alpha
    assert LoraOptions().dropout == RunOptions().lora_dropout
    assert LoraOptions().target_modules == RunOptions().lora_target_modules


def test_the_hardware_page_gives_the_lora_defaults_the_code_has():
    """docs/hardware.md's LoraOptions table said alpha 32 after the default became 16."""
    import re

    page = (Path(__file__).resolve().parents[1] / "docs" / "hardware.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", page, re.M))
    defaults = LoraOptions()
    assert float(rows["alpha"]) == defaults.alpha and int(rows["r"]) == defaults.r
    assert float(rows["dropout"]) == defaults.dropout and rows["target_modules"].strip("`") == defaults.target_modules


@pytest.mark.parametrize("targets", ["", " , "])
def test_no_target_module_named_is_refused_naming_the_option(targets, tmp_path, capsys):
    """`--lora_target_modules ""` stopped with PEFT's words: 'No `target_modules` passed but also
    no `target_parameters` found.'"""
    from lmpo.cli.main import main

    assert main(["train", "sft", "--out", str(tmp_path / "run"), "--threads", "1", "--lora_r", "4",
                 "--lora_target_modules", targets]) != 0
    err = capsys.readouterr().err
    assert "--lora_target_modules" in err and "all-linear" in err and "target_parameters" not in err
    assert not (tmp_path / "run").exists()
