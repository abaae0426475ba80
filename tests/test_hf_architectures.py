"""What a user's own Hugging Face models meet: an architecture whose weights transformers renames
between the module and the saved file (a run trained from one resumes from its checkpoints), and a
chat template that refuses a system turn (agent tasks, whose conversations have none, still run),
one that refuses tool turns, and no chat template at all (an agent task's refusal names the option
that gives one)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from lmpo.cli.main import main

from hardening_common import SFT_RUN


@pytest.fixture(scope="module")
def neox_model(tmp_path_factory, char_tokenizer) -> str:
    """A tiny GPT-NeoX: its output head is `lm_head` in the module, `embed_out` in the saved file."""
    torch.manual_seed(0)
    config = GPTNeoXConfig(vocab_size=len(char_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, max_position_embeddings=128, rotary_pct=0.25,
                           bos_token_id=char_tokenizer.bos_token_id, eos_token_id=char_tokenizer.eos_token_id,
                           pad_token_id=char_tokenizer.pad_token_id)
    path = tmp_path_factory.mktemp("neox")
    GPTNeoXForCausalLM(config).save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return str(path)


def test_a_gpt_neox_run_resumes_from_its_checkpoint(neox_model, tmp_path):
    """The checkpoint's `embed_out.weight` was refused: "does not match the model: missing
    ['lm_head.weight'], unexpected ['embed_out.weight']"."""
    out = tmp_path / "sft"
    assert main(["train", "sft", "--model", neox_model, "--out", str(out), *SFT_RUN]) == 0
    final = (out / "model" / "model.safetensors").read_bytes()
    (out / "result.json").unlink()  # as if killed after its last checkpoint (a finished run is not resumed)
    assert main(["train", "sft", "--resume", str(out)]) == 0
    assert (out / "model" / "model.safetensors").read_bytes() == final


def test_a_template_that_refuses_a_system_turn_may_run_agent_tasks(char_tokenizer):
    """Gemma's template raises on a system message; the tasks' conversations have none, yet the
    template check rendered its canned conversation with one and refused the model for
    `--task calculator`: "the chat template cannot render a tool-use conversation: System role not
    supported"."""
    from lmpo.models.tokenizer import CHAT_TEMPLATE
    from lmpo.rollout.render import ChatRenderer, check_prefix_preserving

    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
                         "{% endif %}" + CHAT_TEMPLATE)
    renderer = ChatRenderer(tok)
    check_prefix_preserving(renderer, "<eos>")
    assert renderer.turn_end == "<eos>"


def test_an_agent_task_on_a_model_without_a_chat_template_names_the_option_that_gives_one(tmp_path, char_tokenizer,
                                                                                           capsys):
    """GPT-2 and Phi ship no chat template: the refusal said to "set tokenizer.chat_template", which
    a user of the command cannot do; `--chat_template FILE` is how."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = None
    config = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=16, n_layer=1, n_head=2,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    tok.save_pretrained(tmp_path / "gpt2")
    assert main(["eval", "--model", str(tmp_path / "gpt2"), "--task", "calculator", "--eval_problems", "1",
                 "--threads", "1"]) == 2
    assert "give one with --chat_template FILE" in capsys.readouterr().err


def test_a_template_that_refuses_tool_turns_is_refused_with_the_option_that_replaces_it(char_tokenizer):
    """Gemma's template raises unless user and assistant turns alternate, so a tool turn fails it:
    the refusal quoted the template's own message and stopped there."""
    from lmpo.models.tokenizer import CHAT_TEMPLATE
    from lmpo.rollout.render import ChatRenderer, TemplateError, check_prefix_preserving

    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('Conversation roles "
                         "must alternate user/assistant') }}{% endif %}{% endfor %}" + CHAT_TEMPLATE)
    with pytest.raises(TemplateError, match="must alternate user/assistant; .* give one with --chat_template FILE"):
        check_prefix_preserving(ChatRenderer(tok), "<eos>")
