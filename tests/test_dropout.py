"""Dropout is off in the policy (and reference, and critic) unless asked for: on a GPT-2 that
ships with dropout 0.1, the first on-policy RL step has KL and clip fraction exactly 0 and a policy
loss of 0, and the first DPO loss is ln 2. `--keep_dropout` keeps the model's own dropout: the KL
of the first step is then not 0, while the ratio of its first update stays exactly 1 (π_old is the loss
forward's own) and that of a second update moves off 1 (π_old is an earlier forward, with other dropout)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from lmpo.cli.main import main


@pytest.fixture(scope="module")
def gpt2_with_dropout(tmp_path_factory, char_tokenizer):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(char_tokenizer), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, bos_token_id=char_tokenizer.bos_token_id,
                        eos_token_id=char_tokenizer.eos_token_id, pad_token_id=char_tokenizer.pad_token_id)
    path = tmp_path_factory.mktemp("gpt2")
    GPT2LMHeadModel(config).save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return str(path)


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("keep,iterations", [(False, 1), (True, 1), (True, 2)])
def test_first_on_policy_step_has_no_kl_and_no_clipping(gpt2_with_dropout, tmp_path, keep, iterations):
    out = tmp_path / "rl"
    argv = ["train", "grpo", "--model", gpt2_with_dropout, "--out", str(out), "--steps", "1", "--prompts_per_step", "4",
            "--group_size", "4", "--max_new_tokens", "6", "--eval_problems", "0", "--save_every", "0", "--threads", "1",
            "--num_iterations", str(iterations),
            "--rewards", "rm=1.0", "--reward_model", gpt2_with_dropout + "-rm", "--reward_timeout", "0"]
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    AutoModelForSequenceClassification.from_pretrained(gpt2_with_dropout, num_labels=1).save_pretrained(argv[-3])
    AutoTokenizer.from_pretrained(gpt2_with_dropout).save_pretrained(argv[-3])  # a random scorer: rewards differ
    assert main(argv + (["--keep_dropout", "true"] if keep else [])) == 0
    (step,) = [r for r in _rows(out) if "reward_mean" in r]
    assert step["reward_std"] > 0
    if not keep:
        assert step["kl"] == 0.0 and step["clip_frac"] == 0.0
        assert abs(step["policy_loss"]) < 1e-6 and abs(step["loss"]) < 1e-6
    elif iterations == 1:  # train-mode dropout: a KL to the eval-mode reference at once, the ratio still 1
        assert step["kl"] > 1e-4 and step["loss"] > step["policy_loss"] + 1e-6
        assert step["clip_frac"] == 0.0 and abs(step["policy_loss"]) < 1e-6
    else:  # the second update's π_old is the first's forward, under other dropout: its ratio is not 1
        assert step["kl"] > 1e-4 and abs(step["policy_loss"]) > 1e-6


@pytest.mark.parametrize("keep", [False, True])
def test_first_dpo_loss_is_ln2(gpt2_with_dropout, tmp_path, keep):
    out = tmp_path / "dpo"
    assert main(["train", "dpo", "--model", gpt2_with_dropout, "--out", str(out), "--pairs", "16", "--batch_size", "8",
                 "--eval_problems", "0", "--log_every", "1", "--threads", "1",
                 *(["--keep_dropout", "true"] if keep else [])]) == 0
    first = [r for r in _rows(out) if "loss" in r][0]
    if keep:
        assert abs(first["loss"] - math.log(2)) > 1e-4
    else:
        assert first["loss"] == pytest.approx(math.log(2), abs=1e-7) and first["margin"] == 0.0


def _tiny(kind: str):
    import transformers as T
    configs = {  # every dropout rate these architectures keep, at 0.3
        "bloom": T.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=2, hidden_dropout=0.3,
                               attention_dropout=0.3),
        "falcon": T.FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 hidden_dropout=0.3, attention_dropout=0.3),
        "opt": T.OPTConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, ffn_dim=64,
                           word_embed_proj_dim=32, max_position_embeddings=64, dropout=0.3, attention_dropout=0.3,
                           layerdrop=0.3),
        "phi": T.PhiConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, resid_pdrop=0.3, embd_pdrop=0.3, attention_dropout=0.3),
    }
    torch.manual_seed(0)
    return T.AutoModelForCausalLM.from_config(configs[kind], attn_implementation="eager")


@pytest.mark.parametrize("kind", ["bloom", "falcon", "opt", "phi"])
def test_dropout_kept_as_a_float_or_read_from_the_config_is_off_too(kind, tmp_path, char_tokenizer):
    """Bloom keeps `hidden_dropout` as a float and Falcon reads its rates from the config at each
    forward: before, two train-mode forwards of the 'dropout-free' model differed by 0.008 (Bloom)
    and 0.3 (Falcon), and Falcon's first on-policy step had a KL of 7.5e-3."""
    from lmpo.models.loading import disable_dropout, save_model

    model = disable_dropout(_tiny(kind)).train()
    ids = torch.randint(0, 64, (2, 12))
    assert torch.equal(model(ids).logits, model(ids).logits)
    before = {k: v for k, v in _tiny(kind).config.to_dict().items() if "drop" in k}
    save_model(model, char_tokenizer, tmp_path)  # the saved model keeps its own rates
    saved = json.loads((tmp_path / "config.json").read_text())
    assert {k: v for k, v in saved.items() if "drop" in k} == before and 0.3 in before.values()
    assert torch.equal(model(ids).logits, model(ids).logits)  # and they stay off after saving


def test_a_merged_lora_model_keeps_its_own_dropout_rates(tmp_path, char_tokenizer):
    """`--lora_merge true` wrote merged/config.json with every rate 0 (QA: attention_dropout 0.1 →
    0.0): the merge copied the model whose rates training had set to 0. The adapter kept them."""
    from lmpo.models import LoraOptions, apply_lora
    from lmpo.models.loading import disable_dropout, save_model

    model = apply_lora(disable_dropout(_tiny("phi")), LoraOptions(r=2))
    save_model(model, char_tokenizer, tmp_path, merged=True)
    saved = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert {k: v for k, v in saved.items() if k in ("resid_pdrop", "embd_pdrop", "attention_dropout")} == {
        "resid_pdrop": 0.3, "embd_pdrop": 0.3, "attention_dropout": 0.3}
