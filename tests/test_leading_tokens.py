"""A tokenizer that puts BOS before every text (Llama, Gemma, Mistral) gets it at the start of
every sequence lmpo trains on or samples from: plain prompts, completions' prompts, documents,
SFT text rows, preference and KTO prompts, RL prompts, reward-model scoring. A chat template
that writes BOS itself keeps exactly one. Before, every plain text went in without the BOS the
model was pre-trained with (TRL issue 3520: garbage from Gemma)."""

from __future__ import annotations

import json

import pytest
from tokenizers import processors

from lmpo.envs.data import load_preferences, load_sft
from lmpo.envs.data.chat import leading_ids, starting
from lmpo.envs.data.prompts import load_prompts
from lmpo.envs.data.records import DataError
from lmpo.envs.data.unpaired import load_unpaired
from lmpo.models import build_char_tokenizer
from lmpo.rollout.render import ChatRenderer, TextRenderer

BOS_TEMPLATE = "{{ bos_token }}" + build_char_tokenizer().chat_template


def bos_tokenizer(single: str = "<bos> $A", template: str | None = None):
    """The embedded tokenizer with a post-processor that adds BOS (as Llama's does)."""
    tok = build_char_tokenizer()
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[("<bos>", tok.bos_token_id), ("<eos>", tok.eos_token_id)])
    if template is not None:
        tok.chat_template = template
    return tok


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_the_leading_tokens_are_what_the_tokenizer_puts_before_a_text(char_tokenizer):
    tok = bos_tokenizer()
    assert tok("12").input_ids[0] == tok.bos_token_id
    assert leading_ids(tok) == [tok.bos_token_id]
    assert leading_ids(bos_tokenizer("<bos> $A <eos>")) == [tok.bos_token_id]  # a closing EOS is not leading
    assert leading_ids(char_tokenizer) == []  # the embedded tokenizer adds none: its ids are unchanged
    assert starting(tok, [5, 6]) == [tok.bos_token_id, 5, 6]
    assert starting(tok, [tok.bos_token_id, 5]) == [tok.bos_token_id, 5]  # never twice


def test_plain_data_rows_start_with_bos_once(tmp_path):
    tok = bos_tokenizer()
    bos = tok.bos_token_id
    (prompt_row,), _ = load_sft(_write(tmp_path / "sft.jsonl", [{"prompt": "1+2=", "completion": "3"}]), tok,
                                max_length=512)
    (text_row,), _ = load_sft(_write(tmp_path / "cpt.jsonl", [{"text": "abc"}]), tok, max_length=512)
    assert prompt_row.input_ids[0] == bos and prompt_row.loss_mask[0] == 0 and prompt_row.input_ids.count(bos) == 1
    assert text_row.input_ids == [bos, *tok("abc", add_special_tokens=False).input_ids, tok.eos_token_id]
    pairs, _ = load_preferences(_write(tmp_path / "pairs.jsonl", [{"prompt": "1+2=", "chosen": "3", "rejected": "4"}]),
                                tok, max_length=512)
    assert pairs[0].prompt_ids == [bos, *tok("1+2=", add_special_tokens=False).input_ids]
    assert pairs[0].chosen_ids[0] != bos  # a reply continues the sequence
    unpaired, _ = load_unpaired(_write(tmp_path / "kto.jsonl", [{"prompt": "1+2=", "completion": "3", "label": True},
                                                               {"prompt": "1+2=", "completion": "4", "label": False}]),
                                tok, max_length=512)
    assert all(e.prompt_ids[0] == bos and e.prompt_ids.count(bos) == 1 for e in unpaired)


@pytest.mark.parametrize("template", [BOS_TEMPLATE, None], ids=["template-writes-bos", "template-without-bos"])
def test_chat_rows_start_with_exactly_one_bos(tmp_path, template):
    tok = bos_tokenizer(template=template)
    bos = tok.bos_token_id
    conversation = [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"}]
    examples, _ = load_sft(_write(tmp_path / "chat.jsonl", [{"messages": conversation}]), tok, max_length=512)
    ids, mask = examples[0].input_ids, examples[0].loss_mask
    assert ids[0] == bos and ids.count(bos) == 1 and mask[0] == 0
    assert tok.decode([t for t, m in zip(ids, mask) if m]) == "3<eos>"  # the reply's loss is where it was
    pairs, _ = load_preferences(_write(tmp_path / "pairs.jsonl", [
        {"prompt": [conversation[0]], "chosen": "3", "rejected": "4"}]), tok, max_length=512)
    assert pairs[0].prompt_ids[0] == bos and pairs[0].prompt_ids.count(bos) == 1


@pytest.mark.parametrize("template", [BOS_TEMPLATE, None], ids=["template-writes-bos", "template-without-bos"])
def test_rl_prompts_start_with_exactly_one_bos(tmp_path, template):
    tok = bos_tokenizer(template=template)
    bos = tok.bos_token_id
    ids, text = TextRenderer(tok).prompt([{"role": "user", "content": "31415="}])
    assert ids == [bos, *tok("31415=", add_special_tokens=False).input_ids] and text == "31415="
    ids, _ = ChatRenderer(tok).prompt([{"role": "user", "content": "31415="}])
    assert ids[0] == bos and ids.count(bos) == 1
    # a prompt file's messages are rendered to text up front, then encoded as a plain prompt
    problems = load_prompts(_write(tmp_path / "p.jsonl", [{"prompt": [{"role": "user", "content": "31415="}]}]),
                            tokenizer=tok)
    ids, _ = TextRenderer(tok).prompt([{"role": "user", "content": problems[0].prompt}])
    assert ids[0] == bos and ids.count(bos) == 1


def test_the_prompt_length_check_counts_the_bos(tmp_path):
    tok = bos_tokenizer()
    path = _write(tmp_path / "p.jsonl", [{"prompt": "12345"}])
    assert load_prompts(path, tokenizer=tok, max_prompt_tokens=6)
    with pytest.raises(DataError, match="at most 5 tokens"):
        load_prompts(path, tokenizer=tok, max_prompt_tokens=5)


def test_task_documents_each_start_with_bos_and_end_with_eos():
    from lmpo.envs import make_task
    from lmpo.trainers.batches import task_document_ids

    tok = bos_tokenizer()
    docs = task_document_ids(make_task("sort_digits"), tok, 5, 0)
    assert len(docs) == 5 and all(d[0] == tok.bos_token_id and d[-1] == tok.eos_token_id for d in docs)
    assert all(d.count(tok.bos_token_id) == 1 for d in docs)


def test_a_reward_model_scores_prompts_as_it_was_trained_on_them(tmp_path, tiny_llama):
    """The reward model trained on pairs whose prompts start with BOS scores its rows the same way."""
    from transformers import LlamaForSequenceClassification

    from lmpo.envs import make_task
    from lmpo.envs.base import Problem
    from lmpo.envs.rewards import reward_functions

    tok = bos_tokenizer()
    config = tiny_llama.config.__class__(**{**tiny_llama.config.to_dict(), "num_labels": 1,
                                            "bos_token_id": tok.bos_token_id})
    LlamaForSequenceClassification(config).save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    scorer = reward_functions({"rm": 1.0}, reward_model=str(tmp_path / "rm"))["rm"]
    scorer.setup()
    seen = []
    scorer.model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"]),
                                           with_kwargs=True)
    scorer(make_task("exact_match"), [Problem("31415=", "11345")], ["11345"], [True])
    assert seen[0][0].tolist() == [tok.bos_token_id, *tok("31415=11345", add_special_tokens=False).input_ids,
                                   tok.eos_token_id]


def test_grpo_on_a_bos_model_samples_after_the_bos(tmp_path, tiny_llama):
    """End to end: a saved model whose tokenizer adds BOS, RL on a prompt file. Every trajectory
    the run keeps starts with the BOS, once."""
    from lmpo.trainers.rl import train_rl
    from lmpo.trainers.rl_config import RLConfig

    tok = bos_tokenizer()
    model_dir = tmp_path / "bos_model"
    tiny_llama.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    rows = [{"prompt": f"{d}=", "answer": "".join(sorted(d))} for d in ("31415", "27182")]
    train = _write(tmp_path / "train.jsonl", rows)
    cfg = RLConfig(model=str(model_dir), out=str(tmp_path / "rl"), task="exact_match", prompts=train,
                   eval_prompts=train, eval_problems=2, eval_every=1, steps=1, prompts_per_step=2, group_size=2,
                   max_new_tokens=4, save_every=0, threads=1, reward_timeout=0, save_trajectories=4)
    train_rl(cfg)
    kept = [json.loads(line) for line in open(tmp_path / "rl" / "trajectories.jsonl")]
    prompts = [t["segments"][0] for t in kept]  # a random model's own tokens may be anything
    assert prompts and all(p["source"] == "prompt" and p["text"] in ("<bos>31415=", "<bos>27182=") for p in prompts)
