"""Agentic tasks on a locally saved Hugging Face model: a byte-level BPE tokenizer (merges across
turn boundaries) with its own ChatML chat template, and a small random Qwen2."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from lmpo.envs import Problem, make_task
from lmpo.rollout import MODEL, EpisodeLimits, LocalEngine, SamplingParams, run_episodes
from lmpo.rollout.render import ChatRenderer, check_prefix_preserving

CHATML = (
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def bpe_tokenizer():
    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    text = [f"key {k} lookup({k}) 31415 11345 user assistant tool_response\n" for k in "abcdefghij"] * 50
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(text, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>"], clean_up_tokenization_spaces=False)
    tok.chat_template = CHATML
    return tok


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory, bpe_tokenizer):
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(bpe_tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=bpe_tokenizer.pad_token_id,
                         eos_token_id=bpe_tokenizer.eos_token_id)
    path = tmp_path_factory.mktemp("qwen")
    Qwen2ForCausalLM(config).save_pretrained(path)
    bpe_tokenizer.save_pretrained(path)
    return path


def test_model_tokens_are_kept_exactly_as_sampled_with_a_bpe_tokenizer(bpe_tokenizer):
    tok = bpe_tokenizer
    check_prefix_preserving(ChatRenderer(tok), "<|im_end|>")
    # ids that decode to "lookup(a)" but are not how the tokenizer would encode that text: re-encoding
    # the conversation would change them
    pieces = [tok.convert_tokens_to_ids(c) for c in "lookup"] + tok("(a)", add_special_tokens=False).input_ids
    assert tok.decode(pieces) == "lookup(a)" and tok("lookup(a)", add_special_tokens=False).input_ids != pieces
    sampled = [pieces + [tok.eos_token_id], tok("11345", add_special_tokens=False).input_ids + [tok.eos_token_id]]

    class Replay:
        def sync_weights(self, model):
            pass

        def generate(self, prompts, params, max_new_tokens=None):
            from lmpo.rollout import Sample

            ids = sampled.pop(0)
            return [Sample(ids, [-1.0] * len(ids), "eos")]

    task = make_task("vault")
    problem = task.train_problems(1, 0)[0]
    problem = Problem(problem.prompt, problem.answer, {**problem.meta})
    key = problem.meta["key"]
    problem.meta["table"] = [(k if k != key else "a", v) for k, v in problem.meta["table"]]
    problem = Problem(problem.prompt.replace(key, "a"), problem.answer, {**problem.meta, "key": "a"})
    first, second = [list(s) for s in sampled]
    (traj,) = run_episodes(Replay(), task.make_env, [problem], SamplingParams(max_new_tokens=40),
                           EpisodeLimits(max_turns=3, max_tokens=200), ChatRenderer(tok), tok)
    assert traj.termination == "answered", traj.segments(tok)
    spans = [traj.token_ids[s:e] for s, e in traj.turn_spans]
    assert spans == [first, second]  # never re-encoded
    assert [tok.decode(s[:-1]) for s in spans] == ["lookup(a)", "11345"]
    assert all(traj.sources[i] == MODEL for s, e in traj.turn_spans for i in range(s, e))
    # the held ids are the prompt, then each turn and each rendered suffix, in order: no drift
    text = tok.decode(traj.token_ids, skip_special_tokens=False)
    whole = tok.apply_chat_template(traj.messages, tokenize=False)
    assert whole.startswith(text)
    observation = "".join(tok.decode([t]) for t, s in zip(traj.token_ids, traj.sources) if s == 3)
    assert observation == dict(problem.meta["table"])["a"]


def test_hf_model_behaviour_logprobs_match_a_teacher_forced_forward(qwen_dir):
    """On-policy: the ratio of the first update is 1 for every model token of a multi-turn episode."""
    from lmpo.models import completion_logprobs, load_model_and_tokenizer
    from lmpo.models.padding import left_pad
    from lmpo.rollout import to_rollout

    model, tok = load_model_and_tokenizer(str(qwen_dir))
    task = make_task("vault")
    engine = LocalEngine(model, tok.eos_token_id, tok.pad_token_id, generator=torch.Generator().manual_seed(0))
    trajs = run_episodes(engine, task.make_env, task.train_problems(6, 0), SamplingParams(max_new_tokens=24),
                         EpisodeLimits(max_turns=2, max_tokens=60, max_turn_tokens=12), ChatRenderer(tok), tok)
    rollout = to_rollout(trajs, tok.pad_token_id)
    ids, mask = left_pad(rollout.prompt_ids, tok.pad_token_id)
    with torch.no_grad():
        forced = completion_logprobs(model, ids, mask, rollout.completion_ids)[0]
    on = rollout.loss_mask.bool()
    assert torch.allclose(forced[on], rollout.logprobs[on], atol=1e-4)


def test_an_agentic_task_trains_a_saved_qwen2_through_the_cli(qwen_dir, tmp_path):
    from lmpo.cli.main import main

    out = tmp_path / "grpo"
    code = main(["train", "grpo", "--model", str(qwen_dir), "--task", "vault", "--steps", "2", "--prompts_per_step",
                 "2", "--group_size", "2", "--eval_problems", "4", "--eval_every", "1", "--save_every", "0",
                 "--threads", "1", "--max_turn_tokens", "10", "--out", str(out)])
    assert code == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "reward_mean" in r]
    assert len(train) == 2 and all("turns_mean" in r and "obs_token_frac" in r for r in train)
    assert any(k.startswith("termination_") for k in train[0])
    saved = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert {r["phase"] for r in saved} == {"train", "eval"}
    assert (out / "model" / "config.json").exists()


def test_sft_on_an_agent_task_refuses_a_template_at_start_not_after_training(qwen_dir, tmp_path, capsys):
    """QA: SFT trained every step, then its held-out evaluation refused the template (exit 2, no
    model saved); RL refused the same template before its first step. Now SFT does too."""
    from lmpo.cli.main import main

    eaten = tmp_path / "eaten.jinja"  # the generation prompt lacks the newline its assistant turns have
    eaten.write_text(CHATML.replace("{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
                                    "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}"))
    out = tmp_path / "sft"
    code = main(["train", "sft", "--model", str(qwen_dir), "--task", "vault", "--demonstrations", "8", "--epochs", "1",
                 "--eval_problems", "2", "--threads", "1", "--chat_template", str(eaten), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "not prefix-preserving" in err and "The generation prompt differs" in err
    assert "[sft] step" not in err and not (out / "metrics.jsonl").exists()
