"""Chat data as models' own templates write it: end-of-turn tokens the generation config names
(Gemma), tool calls and reasoning in OpenAI's shape, templates that render earlier turns otherwise
(Qwen3), and a template given with `--chat_template`."""

import json
import re

import pytest

from lmpo.envs.data import DataError, load_preferences, load_sft

from test_data import CHAT, decode, ext, loss_text, msg, write  # noqa: F401 (ext: a fixture)


GEMMA_LIKE = ("{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
              "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
              "{% endif %}")


def gemma_like_tokenizer(tmp_path, generation_eos: bool):
    """A directory whose chat template ends a turn with `<end_of_turn>`, a token only its
    generation config names as a stop (as Gemma's does); the tokenizer's eos stays `<eos>`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmpo.models import build_char_tokenizer
    from lmpo.models.loading import load_tokenizer

    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    tok.chat_template = GEMMA_LIKE
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    end = tok.convert_tokens_to_ids("<end_of_turn>")
    model.generation_config.eos_token_id = [tok.eos_token_id, end] if generation_eos else tok.eos_token_id
    model.save_pretrained(tmp_path / "gemma_like")
    tok.save_pretrained(tmp_path / "gemma_like")
    return load_tokenizer(str(tmp_path / "gemma_like")), model


def test_a_turn_may_end_with_the_end_of_turn_token_sampling_stops_on(tmp_path):
    from lmpo.rollout.engines import stop_token_ids

    tok, model = gemma_like_tokenizer(tmp_path, generation_eos=True)
    (ex,), _ = load_sft(write(tmp_path / "c.jsonl", [{"messages": CHAT[1:3]}]), tok, max_length=128)
    assert loss_text(tok, ex) == "4<end_of_turn>"  # the newline after it carries no loss
    (pair,), _ = load_preferences(write(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": [msg("assistant", "y")],
                                                               "rejected": [msg("assistant", "n")]}]),
                                  tok, max_length=128)
    assert decode(tok, pair.chosen_ids) == "y<end_of_turn>"
    from lmpo.envs.data.chat import turn_end_ids
    assert turn_end_ids(tok) == stop_token_ids(model, tok)  # what the data ends turns with, sampling stops on


def test_a_turn_ending_with_no_token_sampling_stops_on_is_refused(tmp_path):
    tok, _ = gemma_like_tokenizer(tmp_path, generation_eos=False)
    with pytest.raises(DataError, match=r"row 1: field 'messages\[1\]'.*without a token sampling stops on \('<eos>'"):
        load_sft(write(tmp_path / "c.jsonl", [{"messages": CHAT[1:3]}]), tok, max_length=128)


def test_a_lora_adapters_turns_end_where_its_base_models_sampling_stops(tmp_path):
    from lmpo.envs.data.chat import turn_end_ids
    from lmpo.models.loading import load_tokenizer

    tok, _ = gemma_like_tokenizer(tmp_path, generation_eos=True)
    adapter = tmp_path / "adapter"  # as lmpo and PEFT save one: the tokenizer beside it, no generation config
    tok.save_pretrained(adapter)
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "gemma_like")}))
    assert turn_end_ids(load_tokenizer(str(adapter))) == turn_end_ids(tok) == [tok.eos_token_id,
                                                                              tok.convert_tokens_to_ids("<end_of_turn>")]


HERMES_LIKE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>\n"
    "{%- endif %}{%- for m in messages %}{%- if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{%- endif %}{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


def tool_conversation(arguments):
    return [msg("user", "id 4821?"),
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "7"},
            msg("assistant", "It is 7.")]


@pytest.fixture
def hermes_tokenizer():
    from lmpo.models import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token, tok.chat_template = "<|im_end|>", HERMES_LIKE
    return tok


@pytest.mark.parametrize("arguments", ['{"id": 4821}', {"id": 4821}])
def test_tool_calls_in_openai_shape_are_trained_as_the_template_writes_them(hermes_tokenizer, tmp_path, ext,
                                                                             arguments):
    from lmpo.envs.parsing import HermesFormat

    rows = [{"messages": tool_conversation(arguments), "tools": [LOOKUP]}, {"messages": CHAT[1:3], "tools": None}]
    (ex, plain), _ = load_sft(write(tmp_path / f"t.{ext}", rows), hermes_tokenizer, max_length=512)
    call_turn = '<tool_call>\n{"name": "lookup", "arguments": {"id": 4821}}\n</tool_call><|im_end|>'
    assert loss_text(hermes_tokenizer, ex) == call_turn + "It is 7.<|im_end|>"  # not the tool's response
    assert '<tools>{"type": "function"' in decode(hermes_tokenizer, ex.input_ids)
    parsed = HermesFormat().parse(call_turn.removesuffix("<|im_end|>"))  # what RL's parser reads back
    assert [(c.name, c.arguments) for c in parsed.calls] == [("lookup", {"id": 4821})]
    assert loss_text(hermes_tokenizer, plain) == "4<|im_end|>"


def test_a_template_that_ignores_tool_calls_is_refused(char_tokenizer, tmp_path):
    with pytest.raises(DataError, match=r"row 1: field 'messages': the tokenizer's chat template does not render "
                                        r"tool_calls"):
        load_sft(write(tmp_path / "t.jsonl", [{"messages": tool_conversation({"id": 4821})}]), char_tokenizer,
                 max_length=512)


@pytest.mark.parametrize("bad, where, expected", [
    ("{id: 4821", r"messages\[1\]\.tool_calls\[0\]\.function\.arguments", "a JSON object"),
    ([1], r"messages\[1\]\.tool_calls\[0\]\.function\.arguments", "a JSON object"),
])
def test_malformed_tool_calls_name_the_field(hermes_tokenizer, tmp_path, bad, where, expected):
    with pytest.raises(DataError, match=rf"row 1: field '{where}': expected {expected}"):
        load_sft(write(tmp_path / "t.jsonl", [{"messages": tool_conversation(bad)}]), hermes_tokenizer,
                 max_length=512)


@pytest.mark.parametrize("row, where", [
    ({"messages": tool_conversation('{"id": "\\ud800"}')}, r"messages\[1\]\.tool_calls\[0\]\.function\.arguments\.id"),
    ({"messages": tool_conversation({"id": 1}), "tools": '[{"name": "l\\udc00"}]'}, r"tools\[0\]\.name"),
])
def test_a_lone_surrogate_in_json_text_of_a_tool_field_names_the_field(hermes_tokenizer, tmp_path, row, where):
    """Arguments and schemas given as JSON text are parsed after the row: a `\\ud800` escape in
    them reached the tokenizer, a TypeError traceback."""
    with pytest.raises(DataError, match=rf"row 1: field '{where}': not valid Unicode \(a lone surrogate"):
        load_sft(write(tmp_path / "t.jsonl", [row]), hermes_tokenizer, max_length=512)


def test_reasoning_content_is_trained_where_the_template_writes_it_and_refused_where_not(hermes_tokenizer,
                                                                                        char_tokenizer, tmp_path):
    turn = {"role": "assistant", "content": "4", "reasoning_content": "2 and 2"}
    path = write(tmp_path / "r.jsonl", [{"messages": [msg("user", "2+2"), turn]}])
    (ex,), _ = load_sft(path, hermes_tokenizer, max_length=512)
    assert loss_text(hermes_tokenizer, ex) == "<think>2 and 2</think>4<|im_end|>"
    with pytest.raises(DataError, match="does not render reasoning_content, so the model would learn these turns "
                                        "without their reasoning"):
        load_sft(path, char_tokenizer, max_length=512)


@pytest.mark.parametrize("flag", [{"weight": 0}, {"train": False}])
def test_a_per_turn_loss_flag_is_refused_not_ignored(char_tokenizer, tmp_path, flag):
    rows = [{"messages": [msg("user", "2+2"), {**msg("assistant", "5"), **flag}, msg("user", "again"),
                          msg("assistant", "4")]}]
    key = next(iter(flag))
    with pytest.raises(DataError, match=rf"row 1: field 'messages\[1\]\.{key}': expected no per-turn loss flag"):
        load_sft(write(tmp_path / "w.jsonl", rows), char_tokenizer, max_length=512)


QWEN3_LIKE = (  # as Qwen3's: only the turns after the last user turn show their thinking
    "{%- set ns = namespace(last_query=-1) %}{%- for m in messages %}{%- if m.role == 'user' %}"
    "{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' }}{%- if loop.index0 > ns.last_query %}"
    "{{ '<think>\\n' + (m.reasoning_content or '') + '\\n</think>\\n\\n' }}{%- endif %}{{ m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")


def test_a_template_that_renders_earlier_turns_otherwise_still_trains_each_turn_as_written(hermes_tokenizer,
                                                                                          tmp_path):
    """Qwen3's template drops an assistant turn's thinking once a later user turn follows, so the
    conversation through a turn renders it otherwise than the whole conversation does; each turn
    is then found in the whole conversation, through its first end-of-turn token."""
    hermes_tokenizer.chat_template = QWEN3_LIKE
    rows = [{"messages": [msg("user", "2+2"), {**msg("assistant", "4"), "reasoning_content": "two twos"},
                          msg("user", "and 3+3?"), {**msg("assistant", "six"), "reasoning_content": "three twice"}]}]
    (ex,), _ = load_sft(write(tmp_path / "q.jsonl", rows), hermes_tokenizer, max_length=512)
    assert decode(hermes_tokenizer, ex.input_ids).count("<think>") == 1  # the whole conversation, as Qwen3 renders it
    assert loss_text(hermes_tokenizer, ex) == "4<|im_end|><think>\nthree twice\n</think>\n\nsix<|im_end|>"


def test_a_template_whose_generation_prompt_opens_a_reasoning_block_is_refused_saying_so(hermes_tokenizer, tmp_path):
    """DeepSeek-R1's generation prompt ends `<think>\\n`, which its finished turns lack: every chat
    file was refused as "renders the first 1 messages differently alone", blaming the messages."""
    opener = "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
    assert HERMES_LIKE.endswith(opener)
    hermes_tokenizer.chat_template = HERMES_LIKE.removesuffix(opener) + opener.replace("\\n' }}", "\\n<think>\\n' }}")
    rows = [{"messages": [msg("user", "2+2"), msg("assistant", "4")]}]
    with pytest.raises(ValueError, match=r"generation prompt '<\|im_start\|>assistant\\n<think>\\n' is not how it "
                                         r"renders the conversation going on .* --chat_template FILE"):
        load_sft(write(tmp_path / "r1.jsonl", rows), hermes_tokenizer, max_length=512)


def test_without_a_generation_config_the_models_config_names_the_stops_as_transformers_derives_them(tmp_path):
    from transformers import AutoModelForCausalLM

    from lmpo.envs.data.chat import turn_end_ids
    from lmpo.rollout.engines import stop_token_ids

    tok, model = gemma_like_tokenizer(tmp_path, generation_eos=True)
    folder = tmp_path / "gemma_like"
    config = json.loads((folder / "config.json").read_text())
    config["eos_token_id"] = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").unlink()
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    assert turn_end_ids(tok) == stop_token_ids(loaded, tok) == [tok.eos_token_id,
                                                                tok.convert_tokens_to_ids("<end_of_turn>")]


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_base_model_without_a_template_trains_on_chat_data_with_one_given_and_keeps_it(tiny_llama, char_tokenizer,
                                                                                     tmp_path, capsys):
    from lmpo.cli.main import main
    from lmpo.models.loading import load_tokenizer

    base = tmp_path / "base"  # as a base model ships: no chat template
    tiny_llama.save_pretrained(base)
    char_tokenizer.save_pretrained(base)
    (base / "chat_template.jinja").unlink()
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    data = write(tmp_path / "chat.jsonl", [{"messages": CHAT}] * 4)
    fix = "; give one with --chat_template FILE (a Jinja template)"
    with pytest.raises(DataError, match=re.escape(f"expected a tokenizer with a chat template to render messages, "
                                                  f"got a tokenizer without one{fix}")):
        load_sft(data, load_tokenizer(str(base)), max_length=128)
    from lmpo.envs.data.prompts import load_prompts

    prompts = write(tmp_path / "prompts.jsonl", [{"prompt": CHAT[:1], "answer": "4"}])
    with pytest.raises(DataError, match=re.escape(f"got a tokenizer without one{fix}")):  # was: "needs tokenizer="
        load_prompts(prompts, tokenizer=load_tokenizer(str(base)))
    template = tmp_path / "chatml.jinja"
    # ChatML with markers the embedded tokenizer spells in few tokens (its context is 128), its eos ending a turn
    template.write_text(CHATML.replace("<|im_start|>", "<|").replace("<|im_end|>", "<eos>"))
    args = ["train", "sft", "--model", str(base), "--data", str(data), "--out", str(tmp_path / "sft"),
            "--chat_template", str(template), "--epochs", "1", "--eval_problems", "0", "--threads", "1"]
    assert main(args) in (0, None)
    saved = load_tokenizer(str(tmp_path / "sft" / "model"))
    assert saved.chat_template == template.read_text()  # the next stage renders as this one trained
    (example,), _ = load_sft(write(tmp_path / "one.jsonl", [{"messages": CHAT}]), saved, max_length=128)
    assert loss_text(saved, example) == "4<eos>six<eos>"


def test_a_chat_template_that_cannot_render_is_refused_before_anything_loads(tmp_path):
    from lmpo.models.loading import load_tokenizer

    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }\n")
    with pytest.raises(ValueError, match=r"--chat_template .*broken.jinja: the template cannot render"):
        load_tokenizer("tiny", chat_template=str(broken))
    with pytest.raises(ValueError, match=r"--chat_template .*missing.jinja: cannot read it"):
        load_tokenizer("tiny", chat_template=str(tmp_path / "missing.jinja"))


@pytest.mark.parametrize("row, where, expected", [
    ({"tools": "lookup"}, "tools", r"a list of function schemas \(JSON objects, or their JSON text\), got 'lookup'"),
    ({"tools": {"name": "lookup"}}, "tools", "a list of function schemas"),
    ({"messages": [msg("user", "q"), {"role": "assistant", "content": None, "tool_calls": []}]},
     r"messages\[1\]\.tool_calls", "a non-empty list of tool calls"),
    ({"messages": [{**msg("user", "q"), "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]},
     r"messages\[0\]\.tool_calls", "tool calls only in an assistant turn"),
    ({"messages": [msg("user", "q"), {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}]},
     r"messages\[1\]\.tool_calls\[0\]\.function\.name", "a non-empty string"),
])
def test_malformed_tool_fields_name_the_field(hermes_tokenizer, tmp_path, row, where, expected):
    row = {"messages": tool_conversation({"id": 1}), **row}
    with pytest.raises(DataError, match=rf"row 1: field '{where}': expected {expected}"):
        load_sft(write(tmp_path / "t.jsonl", [row]), hermes_tokenizer, max_length=512)


def test_a_tools_column_given_as_json_text_is_read(hermes_tokenizer, tmp_path):
    """Datasets keep schemas of many shapes as one JSON text per row (a columnar format cannot
    hold them as objects)."""
    rows = [{"messages": tool_conversation({"id": 4821}), "tools": json.dumps([LOOKUP])}]
    (example,), _ = load_sft(write(tmp_path / "t.jsonl", rows), hermes_tokenizer, max_length=512)
    assert '<tools>{"type": "function", "function": {"name": "lookup"' in decode(hermes_tokenizer, example.input_ids)


def parts(*texts):
    return [{"type": "text", "text": t} for t in texts]


def test_content_as_openai_text_parts_is_one_string(char_tokenizer, tmp_path, ext):
    """`content: [{"type": "text", "text": ...}, ...]` (OpenAI's, and many datasets'), joined by
    newlines as vLLM renders it for a text model; every row alike, as Parquet needs."""
    rows = [{"messages": [{"role": "user", "content": parts("2+2=", "answer in digits")},
                          {"role": "assistant", "content": parts("4")}]}]
    (example,), _ = load_sft(write(tmp_path / f"t.{ext}", rows), char_tokenizer, max_length=512)
    assert decode(char_tokenizer, example.input_ids) == "<|user|>2+2=\nanswer in digits<|assistant|>4<eos>"
    assert loss_text(char_tokenizer, example) == "4<eos>"


def test_a_non_text_content_part_is_refused_naming_it(char_tokenizer, tmp_path):
    image = {"type": "image_url", "image_url": {"url": "cat.png"}}
    rows = [{"messages": [{"role": "user", "content": [*parts("what is this?"), image]}, msg("assistant", "a cat")]}]
    with pytest.raises(DataError, match=r"row 1: field 'messages\[0\]\.content\[1\]': expected a text part, "
                                        r".*got a part of type 'image_url'"):
        load_sft(write(tmp_path / "t.jsonl", rows), char_tokenizer, max_length=512)


@pytest.mark.parametrize("chat", [True, False])
def test_the_rm_reward_scores_a_completion_as_the_reward_model_was_trained_on_it(tmp_path, chat):
    """A reward model trained on chat pairs learns each reply's score at the template's end of
    turn (`<end_of_turn>`), after the prompt rendered as a user turn. The `rm` reward scored a
    completion after the raw prompt and closed it with the tokenizer's eos instead (QA: the good
    answer's reward went from +2.07 to -0.93 on a Gemma-like model). Now each row is encoded as
    training encoded it, chat or text, by the record `lmpo train rm` leaves beside the model."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from lmpo.cli.main import main
    from lmpo.envs.base import Problem
    from lmpo.envs.rewards import reward_functions
    from lmpo.models.reward_scorer import last_token_scores

    tok, _ = gemma_like_tokenizer(tmp_path, generation_eos=True)
    rows = [{"prompt": [msg("user", f"q{i}")] if chat else f"q{i}", "chosen": [msg("assistant", "yes")] if chat else "yes",
             "rejected": [msg("assistant", "no")] if chat else "no"} for i in range(24)]
    data = str(write(tmp_path / "pairs.jsonl", rows))
    out = tmp_path / "rm"
    assert main(["train", "rm", "--model", str(tmp_path / "gemma_like"), "--data", data, "--out", str(out),
                 "--batch_size", "8", "--epochs", "1", "--heldout_pairs", "4", "--threads", "1"]) == 0
    (pair,), _ = load_preferences(write(tmp_path / "one.jsonl", rows[:1]), tok, max_length=128)
    model = AutoModelForSequenceClassification.from_pretrained(out / "model").eval()
    trained = []
    for reply in (pair.chosen_ids, pair.rejected_ids):
        ids = torch.tensor([pair.prompt_ids + reply])
        trained.append(last_token_scores(model, ids, torch.ones_like(ids)).item())
    rm = reward_functions({"rm": 1.0}, str(out / "model"))["rm"]
    scored = rm(None, [Problem("q0", "")] * 2, ["yes", "no"], [True, True])
    assert scored == pytest.approx(trained, abs=1e-5)


@pytest.mark.parametrize("text,says", [
    ('[1, 2]', "expected an object with 'rows': \"chat\" or \"text\", got [1, 2]"),
    ('{"rows": "chats"}', "expected an object with 'rows'"),
    ('{"rows": "chat", "turn_ends": "4"}', "'turn_ends' must be a list of token ids, got \"4\""),
    ('{"rows": "chat"', "not readable JSON"),
])
def test_a_bad_reward_rows_file_is_named_not_read_as_text(tmp_path, text, says):
    """A list, an unknown `rows` or a string of turn ends was taken in silence: scored as text."""
    from lmpo.envs.data.reward_rows import REWARD_ROWS_FILE
    from lmpo.envs.rewards import chat_rows

    (tmp_path / REWARD_ROWS_FILE).write_text(text)
    with pytest.raises(ValueError, match=f"{REWARD_ROWS_FILE}: .*{re.escape(says)}"):
        chat_rows(str(tmp_path))
    (tmp_path / REWARD_ROWS_FILE).write_text('{"rows": "text", "turn_ends": []}')
    assert chat_rows(str(tmp_path)) == {}


TOOL_BRANCH = "<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"


def test_a_template_that_drops_a_role_is_refused_and_one_that_escapes_it_is_not(hermes_tokenizer, tmp_path):
    """A template with no branch for `tool` dropped the tool's result from the training text, silently."""
    from lmpo.envs.data.prompts import load_prompts

    said = "field 'messages': message 3 (role 'tool') does not appear in the chat template's rendering (the template "
    conversation = tool_conversation({"id": 4821})
    conversation[2]["content"] = ' "7" & <ok> '
    data = write(tmp_path / "t.jsonl", [{"messages": conversation, "tools": [LOOKUP]}])
    escaping = TOOL_BRANCH.replace("m.content", "m.content | trim | tojson")
    hermes_tokenizer.chat_template = HERMES_LIKE.replace(TOOL_BRANCH, escaping)
    load_sft(data, hermes_tokenizer, max_length=512)  # escaped and trimmed, yet there: trained
    hermes_tokenizer.chat_template = HERMES_LIKE.replace(TOOL_BRANCH, "")
    with pytest.raises(DataError, match=re.escape(f"t.jsonl: row 1: {said}has no branch for role 'tool', or leaves its "
                                                  f"content out), so the model would learn the turns after it without "
                                                  f"it; give --chat_template FILE with a template that renders it, or "
                                                  f"leave the tool messages out of the data")):
        load_sft(data, hermes_tokenizer, max_length=512)
    prompts = write(tmp_path / "p.jsonl", [{"prompt": conversation[:3], "answer": "7"}])
    with pytest.raises(DataError, match=re.escape("row 1: field 'prompt': message 3 (role 'tool') does not appear")):
        load_prompts(prompts, tokenizer=hermes_tokenizer)
    pairs = write(tmp_path / "pairs.jsonl", [{"prompt": conversation[:3], "chosen": "It is 7.", "rejected": "No."}])
    with pytest.raises(DataError, match=re.escape("message 3 (role 'tool') does not appear")):
        load_preferences(pairs, hermes_tokenizer, max_length=512)
