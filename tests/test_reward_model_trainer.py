import json

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from lmpo.cli.main import main
from lmpo.envs import SortDigits
from lmpo.trainers.pairs import embedded_pairs, scoring_rows
from lmpo.trainers.reward_model import scores


def test_embedded_preference_pairs_are_right_vs_wrong_and_split():
    task = SortDigits()
    pairs = task.preference_pairs(300, seed=0)
    assert all(chosen == p.answer and rejected != chosen for p, chosen, rejected in pairs)
    assert not any(task.is_heldout(p) for p, _, _ in pairs)
    assert all(task.is_heldout(p) for p, _, _ in task.preference_pairs(50, seed=0, heldout=True))
    near_misses = sum(sorted(r) == sorted(c) or len(r) == len(c) - 1 for _, c, r in pairs)
    assert near_misses > 100  # most rejected answers are close to right, not random strings


def test_reward_model_trains_and_loads_with_plain_transformers(tmp_path, tiny_llama, char_tokenizer):
    start = tmp_path / "start"
    tiny_llama.save_pretrained(start)
    char_tokenizer.save_pretrained(start)
    assert main(["train", "rm", "--model", str(start), "--out", str(tmp_path / "rm"), "--pairs", "64",
                 "--heldout_pairs", "32", "--epochs", "1", "--batch_size", "16", "--threads", "1"]) == 0
    result = json.loads((tmp_path / "rm" / "result.json").read_text())
    assert 0 <= result["accuracy"] <= 1
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm" / "model")
    tok = AutoTokenizer.from_pretrained(tmp_path / "rm" / "model")
    ids, mask = scoring_rows(embedded_pairs(SortDigits(), tok, 4, seed=1), tok.pad_token_id)
    with torch.no_grad():
        ours = scores(model, ids, mask)
        # one unpadded sequence at a time: the score of the last token, no pooling involved
        single = torch.stack([model(input_ids=ids[i : i + 1, : int(mask[i].sum())]).logits[0, 0] for i in range(len(ids))])
    assert torch.allclose(ours, single, atol=1e-5)


def test_a_trained_reward_model_drives_rl(tmp_path, tiny_llama, char_tokenizer):
    from lmpo.trainers.rl import train_rl
    from lmpo.trainers.rl_config import RLConfig

    start = tmp_path / "start"
    tiny_llama.save_pretrained(start)
    char_tokenizer.save_pretrained(start)
    assert main(["train", "rm", "--model", str(start), "--out", str(tmp_path / "rm"), "--pairs", "32",
                 "--heldout_pairs", "8", "--epochs", "1", "--batch_size", "16", "--threads", "1"]) == 0
    cfg = RLConfig(model=str(start), out=str(tmp_path / "ppo"), rewards="rm=1.0,format=0.5",
                   reward_model=str(tmp_path / "rm" / "model"), advantage="rloo", steps=2, prompts_per_step=2,
                   group_size=4, max_new_tokens=6, eval_problems=0, save_every=0, threads=1)
    train_rl(cfg)
    rows = [json.loads(line) for line in (tmp_path / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert "reward_rm" in rows[0] and rows[0]["reward_rm"] != 0.0
    # the total is the weighted sum of the components
    assert rows[0]["reward_mean"] == pytest.approx(rows[0]["reward_rm"] + 0.5 * rows[0]["reward_format"], abs=1e-5)


def test_rm_reward_without_a_model_directory_is_a_clear_error(tmp_path):
    from lmpo.trainers.rl import train_rl
    from lmpo.trainers.rl_config import RLConfig

    with pytest.raises(ValueError, match="reward 'rm' needs reward_model"):
        train_rl(RLConfig(model="tiny", rewards="rm=1.0", out=str(tmp_path / "x")))


def test_a_lora_reward_model_scores_from_its_adapter_as_merged(tmp_path, tiny_llama, char_tokenizer):
    """`lmpo train rm --lora_r N` writes the adapter (its score head included) as model/: given as
    --reward_model it loads on its base and scores as the merged copy does; it used to be
    refused as "not a model directory"."""
    from lmpo.envs.rewards import reward_functions
    from lmpo.envs.data.chat import encode_start
    from lmpo.models.reward_scorer import RewardModelReward

    start = tmp_path / "start"
    tiny_llama.save_pretrained(start)
    char_tokenizer.save_pretrained(start)
    assert main(["train", "rm", "--model", str(start), "--out", str(tmp_path / "rm"), "--pairs", "32",
                 "--heldout_pairs", "8", "--epochs", "1", "--batch_size", "16", "--threads", "1", "--lora_r", "4",
                 "--lora_merge", "true"]) == 0
    adapter = tmp_path / "rm" / "model"
    assert (adapter / "adapter_config.json").is_file() and not (adapter / "config.json").exists()
    task = SortDigits()
    problems = [task.make("3141"), task.make("2718")]
    completions, ended = ["1134", "9"], [True, False]
    scorer = reward_functions({"rm": 1.0}, str(adapter))["rm"]
    from_adapter = scorer(task, problems, completions, ended)
    from_merged = RewardModelReward(str(adapter / "merged"), encode_prompt=encode_start)(task, problems, completions, ended)
    assert from_adapter == pytest.approx(from_merged, abs=1e-5)
    assert from_adapter[0] != from_adapter[1]


def test_an_adapter_that_is_not_a_reward_models_is_refused(tmp_path, start_model):
    from lmpo.envs.rewards import reward_functions

    assert main(["train", "sft", "--model", start_model, "--out", str(tmp_path / "sft"), "--lora_r", "4",
                 "--demonstrations", "8", "--batch_size", "4", "--eval_problems", "0", "--threads", "1"]) == 0
    with pytest.raises(ValueError, match=r"is an adapter for CAUSAL_LM, not for a reward model \(SEQ_CLS\)"):
        reward_functions({"rm": 1.0}, str(tmp_path / "sft" / "model"))


def test_a_reward_model_starts_from_a_lora_stages_adapter_as_merged(tmp_path, start_model, char_tokenizer):
    """`lmpo train rm --model <a LoRA SFT's model/>`: the trunk is the merged SFT model and every
    weight trains (transformers alone loads the adapter unmerged and frozen: 0 trainable)."""
    from lmpo.models import load_model
    from lmpo.trainers.reward_model import load_reward_model

    assert main(["train", "sft", "--model", start_model, "--out", str(tmp_path / "sft"), "--lora_r", "4",
                 "--demonstrations", "8", "--batch_size", "4", "--eval_problems", "0", "--threads", "1"]) == 0
    adapter = str(tmp_path / "sft" / "model")
    model = load_reward_model(adapter, char_tokenizer, seed=0)
    merged = load_model(adapter, char_tokenizer, seed=0)
    assert all(p.requires_grad for p in model.parameters())
    for name, tensor in merged.base_model.state_dict().items():
        assert torch.equal(model.base_model.state_dict()[name], tensor), name
    assert main(["train", "rm", "--model", adapter, "--out", str(tmp_path / "rm"), "--pairs", "32",
                 "--heldout_pairs", "8", "--epochs", "1", "--batch_size", "16", "--threads", "1"]) == 0


def test_scores_are_read_at_the_closing_eos_where_the_pad_token_is_the_eos():
    """Where the tokenizer pads with its EOS (GPT-2, Llama 3 base), transformers' pooling reads a
    row ending with EOS one token early; the packed training forward reads it at the EOS. The
    padded scoring of evaluation and of `--reward_model` now reads where training does."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from lmpo.models import build_char_tokenizer
    from lmpo.trainers.reward_model import pair_scores

    tok = build_char_tokenizer()
    eos = tok.eos_token_id
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_labels=1, pad_token_id=eos, eos_token_id=eos)).eval()
    pairs = embedded_pairs(SortDigits(), tok, 4, seed=1)
    assert all(p.chosen_ids[-1] == eos for p in pairs)
    ids, mask = scoring_rows(pairs, eos)
    with torch.no_grad():
        trained_at = pair_scores(model, pairs, eos, "cpu")  # the packed forward of training
        padded = scores(model, ids, mask)
        pooled = model(input_ids=ids, attention_mask=mask).logits[:, 0]  # transformers' pooling
    assert torch.allclose(padded, trained_at, atol=1e-5)
    assert (pooled - trained_at).abs().max() > 1e-3


def test_a_row_past_the_reward_models_context_is_said_not_an_index_error(tmp_path, char_tokenizer):
    """A GPT-2 reward model (learned positions) given a prompt and completion longer than its
    context failed deep in its forward with `IndexError: index out of range in self`."""
    from transformers import GPT2Config, GPT2ForSequenceClassification

    from lmpo.envs.base import Problem
    from lmpo.envs.rewards import reward_functions

    config = GPT2Config(vocab_size=len(char_tokenizer), n_positions=16, n_embd=16, n_layer=1, n_head=2, num_labels=1,
                        pad_token_id=char_tokenizer.pad_token_id)
    GPT2ForSequenceClassification(config).save_pretrained(tmp_path / "rm")
    char_tokenizer.save_pretrained(tmp_path / "rm")
    rm = reward_functions({"rm": 1.0}, str(tmp_path / "rm"))["rm"]
    assert len(rm(None, [Problem("12+3=", "")], ["15"], [True])) == 1
    with pytest.raises(ValueError, match=r"the reward model's context is 16 tokens, and a prompt with its "
                                         r"completion makes 2[0-9] \(prompt '1234567890"):
        rm(None, [Problem("12+3=", ""), Problem("1234567890" * 2, "")], ["15", "0"], [True, True])
