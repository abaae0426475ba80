"""The rows a chat reward model scores in RL are the rows `lmpo train rm` trained it on."""

import pytest

from test_data import msg, write

QWEN_LIKE = (  # ChatML with a default system turn (Qwen2's), and tool schemas in the system turn
    "{%- if messages[0].role != 'system' %}<|im_start|>system\nYou are helpful.{% if tools %}<tools>"
    "{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


@pytest.fixture
def chat_reward_model(tmp_path):
    """A one-label classifier with a ChatML template, recorded as trained on chat rows."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from lmpo.models import build_char_tokenizer
    from lmpo.trainers.reward_model import record_rows

    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token, tok.chat_template = "<|im_end|>", QWEN_LIKE
    model = LlamaForSequenceClassification(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                                       num_hidden_layers=1, num_attention_heads=2,
                                                       num_key_value_heads=2, num_labels=1,
                                                       pad_token_id=tok.pad_token_id))
    directory = tmp_path / "rm"
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    record_rows(directory, tok, chat=True)
    return str(directory), tok


@pytest.mark.parametrize("tools", [None, [LOOKUP]])
def test_a_message_list_prompt_is_scored_as_train_rm_encoded_it(chat_reward_model, tmp_path, monkeypatch, tools):
    """QA: a --prompts row given as messages reached the `rm` reward as the policy's rendered
    template text, which the chat reward row wrapped in a user turn of a second template (a
    system turn and `<|im_start|>user` inside a user turn): held-out pairwise accuracy 61% as
    `train rm` reported it, 54% through the reward. Now the reward model renders the row's
    messages (and tools) with its own template, once, as training did."""
    from lmpo.envs.data import load_preferences, load_prompts
    from lmpo.envs.rewards import reward_functions
    from lmpo.models import reward_scorer

    directory, tok = chat_reward_model
    prompt = [msg("user", "sort 40369")]
    extra = {"tools": tools} if tools else {}
    row = {"prompt": prompt, "chosen": [msg("assistant", "03469")], "rejected": [msg("assistant", "96430")], **extra}
    (pair,), _ = load_preferences(write(tmp_path / "pairs.jsonl", [row]), tok, max_length=512)
    (problem,) = load_prompts(write(tmp_path / "prompts.jsonl", [{"prompt": prompt, "answer": "03469", **extra}]),
                              tokenizer=tok)
    assert problem.prompt.count("<|im_start|>system") == 1
    scored = []

    def seen(model, input_ids, attention_mask):
        scored.extend(row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask))
        return input_ids.new_zeros(len(input_ids)).float()

    monkeypatch.setattr(reward_scorer, "last_token_scores", seen)
    rm = reward_functions({"rm": 1.0}, directory)["rm"]
    rm(None, [problem, problem], ["03469", "96430"], [True, True])
    trained = [pair.prompt_ids + pair.chosen_ids, pair.prompt_ids + pair.rejected_ids]
    assert [tok.decode(r) for r in scored] == [tok.decode(r) for r in trained]
    assert scored == trained


def test_a_text_prompt_is_still_one_user_turn(chat_reward_model, tmp_path):
    """A prompt given as text keeps its meaning: one user turn, as `train rm` reads a text prompt
    of a chat pair."""
    from lmpo.envs.base import Problem
    from lmpo.envs.data import load_preferences
    from lmpo.envs.rewards import reward_functions

    directory, tok = chat_reward_model
    row = {"prompt": "sort 40369", "chosen": [msg("assistant", "03469")], "rejected": [msg("assistant", "96430")]}
    (pair,), _ = load_preferences(write(tmp_path / "pairs.jsonl", [row]), tok, max_length=512)
    rm = reward_functions({"rm": 1.0}, directory)["rm"]
    assert rm.rows([Problem("sort 40369", "")], ["03469"], [True]) == [pair.prompt_ids + pair.chosen_ids]
