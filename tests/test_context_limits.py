"""A model's context bounds what it is trained on. On a GPT-2 (learned position embeddings, 64
positions) every one of these failed deep in the forward with `IndexError: index out of range
in self` before; now the data is held to the context with a message naming it, and rows the
context does hold train whatever they are batched with."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from lmpo.cli.main import main

from hardening_common import error_line

CONTEXT = 64
RUN = ["--epochs", "1", "--eval_problems", "0", "--threads", "1", "--save_every", "0"]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, char_tokenizer):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(char_tokenizer), n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=char_tokenizer.bos_token_id, eos_token_id=char_tokenizer.eos_token_id,
                        pad_token_id=char_tokenizer.pad_token_id)
    path = tmp_path_factory.mktemp("gpt2")
    GPT2LMHeadModel(config).save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return str(path)


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_an_example_past_the_context_is_refused_under_the_default_max_length(gpt2, tmp_path, capsys):
    data = _jsonl(tmp_path / "sft.jsonl", [{"prompt": "12", "completion": "34"}] * 8
                  + [{"prompt": "9" * 60, "completion": "9" * 30}])
    argv = ["train", "sft", "--model", gpt2, "--data", data, *RUN]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 2
    assert error_line(capsys).endswith("sft.jsonl: row 9: fields 'prompt' (60 characters) + 'completion' (30 characters): "
                                       "91 tokens together, over the model's context of 64 tokens (max_length 1024 is longer) (pass --overlong skip or --overlong "
                                       "truncate, to load such rows)")  # the CLI names its flags alone
    assert main([*argv, "--out", str(tmp_path / "b"), "--overlong", "skip"]) == 0
    assert "kept 8; over the model's context of 64 tokens (max_length 1024 is longer) (skip): 1 skipped" \
        in capsys.readouterr().out
    # a max_length under the context is the limit, named as before
    assert main([*argv, "--out", str(tmp_path / "c"), "--max_length", "32"]) == 2
    assert "91 tokens together, over max_length 32 (pass" in error_line(capsys)


def test_cpt_rows_longer_than_the_context_are_refused(gpt2, tmp_path, capsys):
    argv = ["train", "cpt", "--model", gpt2, "--out", str(tmp_path / "c"), "--steps", "1", "--threads", "1"]
    assert main(argv) == 2
    assert error_line(capsys) == ("lmpo: error: --seq_len 128: CPT rows hold seq_len + 1 = 129 tokens, more than "
                                  "the model's context of 64 tokens; use --seq_len 63 or less")


def test_sft_held_out_prompts_leave_room_for_the_answer(gpt2, tmp_path, capsys):
    data = _jsonl(tmp_path / "sft.jsonl", [{"prompt": "12", "completion": "34"}] * 8)
    held = _jsonl(tmp_path / "held.jsonl", [{"prompt": "12", "answer": "21"}, {"prompt": "9" * 58, "answer": "9"}])
    argv = ["train", "sft", "--model", gpt2, "--data", data, "--eval_prompts", held, "--out", str(tmp_path / "s"),
            *RUN[:2], "--threads", "1", "--save_every", "0"]
    assert main(argv) == 2
    assert error_line(capsys).endswith("held.jsonl: row 2: field 'prompt': expected a prompt of at most 52 tokens "
                                       "(the model's context of 64 tokens minus eval_max_new_tokens=12), got 58 tokens")


def test_rows_that_fit_train_beside_rows_that_pad_them_past_the_context(gpt2, tmp_path):
    """A long prompt with a short reply, batched with a short prompt and a long reply: padded to
    one width (KTO) or packed into one row (DPO with --overlong truncate), the positions ran past
    the context though every example fits."""
    long_prompt, short_prompt = "9" * 58, "1"
    kto = _jsonl(tmp_path / "kto.jsonl", [{"prompt": long_prompt, "completion": "12", "label": True},
                                          {"prompt": short_prompt, "completion": "3" * 58, "label": False}] * 4)
    assert main(["train", "kto", "--model", gpt2, "--data", kto, "--batch_size", "8", "--out", str(tmp_path / "k"),
                 *RUN]) == 0
    dpo = _jsonl(tmp_path / "dpo.jsonl", [{"prompt": "12", "chosen": "34", "rejected": "43"}] * 3
                 + [{"prompt": "9" * 60, "chosen": "9" * 30, "rejected": "8" * 30}])
    assert main(["train", "dpo", "--model", gpt2, "--data", dpo, "--overlong", "truncate", "--batch_size", "4",
                 "--out", str(tmp_path / "d"), *RUN]) == 0


def test_each_row_scores_alike_alone_and_beside_rows_that_pad_it_past_the_context(gpt2):
    """Padding's positions are clamped (padded batch) or 0 (packed rows): no real token sees them,
    so a row's log-probs are what it gets alone."""
    from transformers import AutoModelForCausalLM

    from lmpo.models.logprobs import completion_outputs
    from lmpo.models.packing import pack_completions
    from lmpo.models.padding import left_pad
    from lmpo.rollout import right_pad

    model = AutoModelForCausalLM.from_pretrained(gpt2).eval()
    prompts, completions = [[5] * 58, [6]], [[7, 8], [9] * 58]
    prompt_ids, prompt_mask = left_pad(prompts, 0)
    completion_ids, completion_mask = right_pad(completions, 0)
    lengths = completion_mask.sum(1)
    with torch.no_grad():
        padded = completion_outputs(model, prompt_ids, prompt_mask, completion_ids).logprobs
        packed = completion_outputs(model, prompt_ids, prompt_mask, completion_ids, lengths=lengths).logprobs
        for row in range(2):
            alone = completion_outputs(model, torch.tensor([prompts[row]]), torch.ones(1, len(prompts[row])),
                                       torch.tensor([completions[row]])).logprobs[0]
            n = len(completions[row])
            torch.testing.assert_close(padded[row, :n], alone)
            torch.testing.assert_close(packed[row, :n], alone)
    rows = pack_completions(prompt_ids, prompt_mask, completion_ids, lengths, row_tokens=2 * CONTEXT)
    assert int(rows.position_ids.max()) < CONTEXT
