"""`--chat_template_kwargs`: the template's own variables (Qwen3's `enable_thinking`), the same
in every render of a run and in the model it saves; and an RL prompt file's `tools` column,
which reaches the template."""

from __future__ import annotations

import json

import pytest

from lmpo.models import build_char_tokenizer

# Qwen3's switch, as its template writes it: thinking off puts an empty think block in the generation
# prompt, which a finished assistant turn without reasoning renders too
QWEN3_LIKE = ("{% for m in messages %}<|{{ m['role'] }}|>"
              "{% if m['role'] == 'assistant' %}<think></think>{{ m['content'] }}<eos>"
              "{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
              "{% if add_generation_prompt %}<|assistant|>"
              "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}{% endif %}")
CHAT = [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]


def _model_dir(tmp_path, tiny_llama):
    tok = build_char_tokenizer()
    tok.chat_template = QWEN3_LIKE
    tiny_llama.save_pretrained(tmp_path / "qwen3_like")
    tok.save_pretrained(tmp_path / "qwen3_like")
    return str(tmp_path / "qwen3_like")


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_template_variables_reach_every_render_and_the_saved_tokenizer(tmp_path, tiny_llama):
    from transformers import AutoTokenizer

    from lmpo.envs.data import load_sft
    from lmpo.models.loading import load_tokenizer
    from lmpo.rollout.render import ChatRenderer

    model = _model_dir(tmp_path, tiny_llama)
    prompt = [CHAT[0]]
    assert not load_tokenizer(model).apply_chat_template(prompt, tokenize=False,
                                                         add_generation_prompt=True).endswith("<think></think>")
    tok = load_tokenizer(model, chat_template_kwargs='{"enable_thinking": false}')
    # a call's own value cannot undo the run's: every render of the run is alike
    for text in (tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True),
                 tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, enable_thinking=True),
                 ChatRenderer(tok).prompt(prompt)[1]):
        assert text == "<|user|>2+2=<|assistant|><think></think>"
    (example,), _ = load_sft(_write(tmp_path / "pc.jsonl", [{"prompt": prompt, "completion": "4"}]), tok,
                             max_length=128)
    assert tok.decode(example.input_ids) == "<|user|>2+2=<|assistant|><think></think>4<eos>"
    assert tok.decode([t for t, m in zip(example.input_ids, example.loss_mask) if m]) == "4<eos>"  # the prompt's now
    tok.save_pretrained(tmp_path / "saved")
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "saved")  # without lmpo, as the next stage or a server loads it
    assert reloaded.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True).endswith("<think></think>")


@pytest.mark.parametrize("value, message", [
    ("enable_thinking=false", "expected a JSON object such as"),
    ('["enable_thinking"]', "expected a JSON object of template variables, got list"),
    ("{}", "got an empty one"),
    ('{"add_generation_prompt": true}', "'add_generation_prompt' cannot be set"),
    ('{"not a name": 1}', "'not a name' cannot be set"),
])
def test_malformed_template_variables_are_refused_saying_why(value, message):
    from lmpo.models.loading import load_tokenizer

    with pytest.raises(ValueError, match=rf"--chat_template_kwargs.*{message}"):
        load_tokenizer("tiny", chat_template_kwargs=value)


def test_sft_with_template_variables_saves_a_model_that_renders_with_them(tmp_path, tiny_llama):
    from lmpo.cli.main import main
    from lmpo.models.loading import load_tokenizer

    model = _model_dir(tmp_path, tiny_llama)
    data = _write(tmp_path / "chat.jsonl", [{"prompt": [CHAT[0]], "completion": "4"}] * 4)
    out = tmp_path / "sft"
    args = ["train", "sft", "--model", model, "--data", data, "--out", str(out), "--epochs", "1",
            "--eval_problems", "0", "--threads", "1", "--chat_template_kwargs", '{"enable_thinking": false}']
    assert main(args) in (0, None)
    saved = load_tokenizer(str(out / "model"))
    assert saved.apply_chat_template([CHAT[0]], tokenize=False, add_generation_prompt=True).endswith("<think></think>")
    assert json.loads((out / "run.json").read_text())["config"]["chat_template_kwargs"] == '{"enable_thinking": false}'


def test_an_rl_prompt_files_tools_column_reaches_the_template(tmp_path):
    from lmpo.envs.data.prompts import load_prompts

    tok = build_char_tokenizer()
    tok.chat_template = ("{% if tools %}<|system|>tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}"
                         "{% endif %}" + tok.chat_template)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    path = _write(tmp_path / "p.jsonl", [{"prompt": [CHAT[0]], "tools": tools}, {"prompt": [CHAT[0]]}])
    with_tools, without = load_prompts(path, tokenizer=tok)
    assert with_tools.prompt == "<|system|>tools: lookup <|user|>2+2=<|assistant|>"
    assert without.prompt == "<|user|>2+2=<|assistant|>"
    assert with_tools.meta["tools"] == tools  # and reward functions see them
