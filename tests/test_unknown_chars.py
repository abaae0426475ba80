"""Text a tokenizer cannot represent is named when data loads (the embedded model's tokenizer has
a fixed alphabet: anything outside it, a tab, 'é', Chinese, becomes <unk>), not trained on in
silence."""

import json
from pathlib import Path

import pytest

from lmpo.envs.data import load_preferences, load_prompts, load_sft
from lmpo.envs.data.chat import encode
from lmpo.envs.data.unknown import counting_unknown


def write(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def test_sft_data_names_the_characters_the_tokenizer_lacks_and_the_first_row(tmp_path, char_tokenizer):
    path = write(tmp_path / "d.jsonl", [{"prompt": "abc", "completion": "def"},
                                        {"prompt": "h\u00e9llo\tw\u00f6rld", "completion": "\u4f60\u597d"},
                                        {"prompt": "x\u00e9", "completion": "y"}])
    _, report = load_sft(path, char_tokenizer, max_length=64)
    unknown = report.unknown
    assert (unknown.tokens, unknown.rows, unknown.first) == (6, 2, "row 2")
    assert unknown.chars == {"\u00e9": 2, "\t": 1, "\u00f6": 1, "\u4f60": 1, "\u597d": 1}
    summary = report.summary()
    assert "warning: 6 of" in summary and "'\\t' x1" in summary and "'\u00e9' x2" in summary
    assert "(first at row 2)" in summary and "the model never sees it" in summary
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    shown = next(line.strip() for line in readme.splitlines() if line.strip().startswith("warning: 6 of"))
    assert summary.splitlines()[1].strip() == shown  # the README's example is this file's output


def test_data_the_tokenizer_represents_has_no_warning(tmp_path, char_tokenizer):
    path = write(tmp_path / "d.jsonl", [{"prompt": "abc", "completion": "def"}])
    _, report = load_sft(path, char_tokenizer, max_length=64)
    assert report.unknown.tokens == 0 and report.unknown.total > 0
    assert "warning" not in report.summary()


def test_a_literal_unk_token_in_the_text_is_not_an_unknown_character(char_tokenizer):
    with counting_unknown(char_tokenizer) as unknown:
        ids = encode(char_tokenizer, "a<unk>b")
    assert char_tokenizer.unk_token_id in ids
    assert unknown.tokens == 0


def test_counted_alike_through_the_tokenizers_own_call(char_tokenizer):
    from lmpo.models import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer._lmpo_backend_encode = {"use": False, "checked": 0}  # as when the backend's ids differed
    with counting_unknown(tokenizer) as unknown:
        encode(tokenizer, "\u00e9a\u00e9")
    assert (unknown.tokens, dict(unknown.chars)) == (2, {"\u00e9": 2})


def test_counting_stops_when_the_block_ends(char_tokenizer):
    with counting_unknown(char_tokenizer) as unknown:
        encode(char_tokenizer, "\u00e9")
    encode(char_tokenizer, "\u00e9")
    assert unknown.tokens == 1
    assert getattr(char_tokenizer, "_lmpo_unknown", None) is None


def test_preference_pairs_are_counted_too(tmp_path, char_tokenizer):
    path = write(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": "\u00e9", "rejected": "b"}])
    _, report = load_preferences(path, char_tokenizer, max_length=64)
    assert report.unknown.tokens == 1 and "warning" in report.summary()


def test_rl_prompts_and_exact_match_answers_are_counted_apart(tmp_path, char_tokenizer):
    path = write(tmp_path / "r.jsonl", [{"prompt": "12=", "answer": "21"},
                                        {"prompt": "\u4f60=", "answer": "\u597d\u597d"}])
    unknown: dict = {}
    load_prompts(path, tokenizer=char_tokenizer, require_answer=True, unknown=unknown)
    assert (unknown["prompt"].tokens, unknown["prompt"].first) == (1, "row 2")
    assert (unknown["answer"].tokens, dict(unknown["answer"].chars)) == (2, {"\u597d": 2})


def test_an_rl_run_warns_before_its_model_loads(tmp_path, char_tokenizer, capsys):
    from lmpo.trainers.preflight import load_prompt_files
    from lmpo.trainers.rl_config import RLConfig

    path = write(tmp_path / "r.jsonl", [{"prompt": "\u00e912=", "answer": "21\u00e9"}])
    model = tmp_path / "tok"
    char_tokenizer.save_pretrained(model)
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 256}))
    load_prompt_files(RLConfig(model=str(model), task="exact_match", prompts=str(path), out=str(tmp_path / "o")))
    out = capsys.readouterr().out
    assert "in the prompts, 1 of" in out and "the model never sees it" in out
    assert "in the answers, 1 of" in out and "no completion can match those answers" in out


@pytest.mark.parametrize("text", ["", "plain text"])
def test_nothing_to_report_is_an_empty_summary(char_tokenizer, text):
    with counting_unknown(char_tokenizer) as unknown:
        encode(char_tokenizer, text)
    assert unknown.summary() == ""


def test_a_conversation_is_counted_once_not_once_per_located_turn(tmp_path, char_tokenizer):
    from lmpo.envs.data.chat import render
    from lmpo.envs.data.records import Record

    messages = [{"role": "user", "content": "\u00e9"}, {"role": "assistant", "content": "a"},
                {"role": "user", "content": "b"}, {"role": "assistant", "content": "\u00f6"}]
    path = write(tmp_path / "c.jsonl", [{"messages": messages}])
    (example,), report = load_sft(path, char_tokenizer, max_length=256)
    whole = render(Record(str(path), 1, {"messages": messages}), "messages", char_tokenizer, messages,
                   generation_prompt=False)
    assert (report.unknown.tokens, report.unknown.total) == (2, len(encode(char_tokenizer, whole)))


def test_a_chat_preference_pair_counts_its_shared_prompt_once(tmp_path, char_tokenizer):
    prompt = [{"role": "user", "content": "\u00e9\u00e9"}]
    row = {"prompt": prompt, "chosen": [{"role": "assistant", "content": "\u00f6"}],
           "rejected": [{"role": "assistant", "content": "b"}]}
    (pair,), report = load_preferences(write(tmp_path / "p.jsonl", [row]), char_tokenizer, max_length=256)
    assert report.unknown.tokens == 3 and dict(report.unknown.chars) == {"\u00e9": 2, "\u00f6": 1}
    assert report.unknown.total == len(pair.prompt_ids) + len(pair.chosen_ids) + len(pair.rejected_ids)
