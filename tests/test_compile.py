"""`compile_blocks`: RMSNorms and MLPs through torch.compile, the numbers and the model unchanged."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from lmpo.cli.main import main
from lmpo.models import apply_lora, compile_blocks, completion_outputs, load_model, uncompiled_blocks
from lmpo.models.lora import LoraOptions

needs_compiler = pytest.mark.skipif(not __import__("shutil").which("g++") and not __import__("shutil").which("clang++"),
                                    reason="inductor needs a C++ compiler on the CPU")


def _outputs(model, prompt, completion, lengths):
    model.zero_grad(set_to_none=True)
    out = completion_outputs(model, prompt, torch.ones_like(prompt), completion, lengths=lengths)
    out.logprobs.sum().backward()
    return out.logprobs.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@needs_compiler
@pytest.mark.parametrize("name", ["tiny_qwen2", "tiny_llama"])
def test_compiled_blocks_give_the_eager_numbers_and_leave_the_model_as_it_was(name, request, tmp_path, char_tokenizer):
    model = copy.deepcopy(request.getfixturevalue(name)).train()
    layers = model.config.num_hidden_layers
    torch.manual_seed(0)
    prompt, completion = torch.randint(3, 40, (4, 7)), torch.randint(3, 40, (4, 9))
    lengths = torch.tensor([9, 5, 9, 2])
    eager = _outputs(model, prompt, completion, lengths)
    keys = list(model.state_dict())

    assert compile_blocks(model) == 3 * layers + 1  # two norms and an MLP per layer, the final norm
    assert compile_blocks(model) == 0
    assert type(model.model.layers[0].mlp).__name__ == type(model.model.layers[0].mlp).__mro__[1].__name__
    compiled = _outputs(model, prompt, completion, lengths)
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-5)
    for n, g in eager[1].items():
        torch.testing.assert_close(compiled[1][n], g, rtol=1e-4, atol=1e-5, msg=n)

    assert list(model.state_dict()) == keys
    twin = copy.deepcopy(model)  # a copy is compiled too, and reads its own weights
    with torch.no_grad():
        twin.model.norm.weight.mul_(2)
    assert not torch.equal(twin(prompt).logits, model(prompt).logits)
    model.save_pretrained(tmp_path)
    char_tokenizer.save_pretrained(tmp_path)
    reloaded = load_model(str(tmp_path), char_tokenizer).train()
    torch.testing.assert_close(_outputs(reloaded, prompt, completion, lengths)[0], eager[0], rtol=1e-5, atol=1e-5)

    assert uncompiled_blocks(model) == 3 * layers + 1
    assert type(model.model.norm).__mro__[1] is torch.nn.Module


@needs_compiler
def test_mlps_holding_lora_layers_stay_eager(tiny_qwen2):
    model = apply_lora(copy.deepcopy(tiny_qwen2), LoraOptions(r=4, alpha=8.0, dropout=0.0, target_modules="all-linear"))
    layers = tiny_qwen2.config.num_hidden_layers
    assert compile_blocks(model) == 2 * layers + 1  # the norms only
    prompt = torch.randint(3, 40, (2, 6))
    assert torch.isfinite(model(input_ids=prompt).logits).all()


@needs_compiler
def test_a_dpo_run_with_compiled_blocks_matches_the_eager_run(start_model, tmp_path, capsys):
    losses = {}
    for flag in ([], ["--compile_blocks", "true"]):
        out = tmp_path / ("compiled" if flag else "eager")
        assert main(["train", "dpo", "--model", start_model, "--out", str(out), "--pairs", "16", "--batch_size", "8",
                     "--device", "cpu", "--eval_problems", "0", "--log_every", "1", "--threads", "1", *flag]) == 0
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        losses[bool(flag)] = [r["loss"] for r in rows if "loss" in r]
    assert "7 blocks compiled" in capsys.readouterr().out  # 2 layers x (2 norms + an MLP) + the final norm
    assert len(losses[True]) == 2 and all(math.isfinite(x) for x in losses[True])
    assert losses[True] == pytest.approx(losses[False], abs=1e-5)


def test_compile_blocks_without_a_compiler_is_refused_before_the_run_starts(start_model, tmp_path, monkeypatch, capsys):
    import lmpo.models.compile as compile_mod

    monkeypatch.setattr(compile_mod.shutil, "which", lambda name: None)
    code = main(["train", "dpo", "--model", start_model, "--out", str(tmp_path / "a"), "--pairs", "8",
                 "--compile_blocks", "true", "--device", "cpu"])
    assert code != 0 and "needs a C++ compiler" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_compile_blocks_with_fsdp_is_refused():
    from types import SimpleNamespace

    from lmpo.trainers.harness import RunOptions, _check_parallel_options

    with pytest.raises(ValueError, match="compile_blocks with fsdp"):
        _check_parallel_options(RunOptions(fsdp=True, compile_blocks=True), SimpleNamespace(active=True))


@needs_compiler
def test_compiled_blocks_under_gradient_checkpointing_give_the_eager_gradients(tiny_qwen2):
    from lmpo.models import enable_gradient_checkpointing

    model = copy.deepcopy(tiny_qwen2).train()
    prompt, completion, lengths = torch.randint(3, 40, (4, 7)), torch.randint(3, 40, (4, 9)), torch.tensor([9, 5, 9, 2])
    eager = _outputs(model, prompt, completion, lengths)
    enable_gradient_checkpointing(model)
    assert compile_blocks(model) == 3 * tiny_qwen2.config.num_hidden_layers + 1
    compiled = _outputs(model, prompt, completion, lengths)
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-5)
    for n, g in eager[1].items():
        torch.testing.assert_close(compiled[1][n], g, rtol=1e-4, atol=1e-5, msg=n)
