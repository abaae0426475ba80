"""Issue 14 (hostile-user probe), inputs: options the chosen part ignores, YAML keys given twice,
data errors located before tokenising, users' reward functions that fail and say why.

One test (or a few) per class of the issue; each fails on the code before the fix."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lmpo.cli.config import ConfigError, build
from lmpo.cli.main import main

from hardening_common import RL_RUN, error_line as _error



@pytest.mark.parametrize("loss", ["gspo", "cispo"])
def test_an_option_the_selected_loss_does_not_take_is_an_error(loss, tmp_path, capsys):
    from lmpo.trainers.rl_config import RLConfig
    from lmpo.trainers.validation import ConfigError as InvalidConfig

    with pytest.raises(InvalidConfig, match=rf"dual_clip=3.0 is not used by loss={loss} \({loss} takes: "
                                            rf"clip_eps_low, clip_eps_high[,)]"):
        RLConfig(loss=loss, dual_clip=3.0).validate()
    assert main(["train", loss, "--model", "tiny", "--out", str(tmp_path / "r"), "--dual_clip", "3"]) == 2
    assert "dual_clip=3.0 is not used" in _error(capsys)


@pytest.mark.parametrize("settings,match", [
    ({"advantage": "rloo", "std": "population"}, "std='population' is not used by advantage=rloo"),
    ({"aggregation": "token_mean", "max_len_norm": 8}, "max_len_norm=8 is not used by aggregation=token_mean"),
    ({"advantage": "grpo", "gae_lambda": 0.9}, "gae_lambda=0.9 is not used by advantage=grpo"),
])
def test_options_of_other_advantages_and_aggregations_are_errors(settings, match):
    from lmpo.trainers.rl_config import RLConfig

    with pytest.raises(ValueError, match=match):
        RLConfig(**settings).validate()


def test_every_preset_and_the_defaults_validate():
    from lmpo.trainers.online_dpo import OnlineDPOConfig
    from lmpo.trainers.preference import PreferenceConfig
    from lmpo.trainers.presets import RL_PRESETS
    from lmpo.trainers.rl_config import RLConfig

    for preset in RL_PRESETS.values():
        RLConfig(**preset.settings).validate()
    RLConfig(dual_clip=3.0).validate()  # ppo_clip takes it
    PreferenceConfig().validate()
    OnlineDPOConfig().validate()
    PreferenceConfig(loss="cdpo", label_smoothing=0.2).validate()
    with pytest.raises(ValueError, match=r"label_smoothing=0.2 is not used by loss=dpo"):
        PreferenceConfig(loss="dpo", label_smoothing=0.2).validate()
    with pytest.raises(ValueError, match=r"gamma=1.0 is not used by loss=ipo"):
        PreferenceConfig(loss="ipo", gamma=1.0).validate()


def test_a_yaml_key_given_twice_is_an_error_with_both_lines(tmp_path):
    from lmpo.trainers.rl_config import RLConfig

    f = tmp_path / "c.yaml"
    f.write_text("lr: 0.1\nsteps: 3\nlr: 0.2\n")
    with pytest.raises(ConfigError, match=r"c.yaml: line 3: lr: given twice \(first on line 1\)"):
        build(RLConfig, yaml_file=str(f))
    f.write_text("cpt:\n  steps: 1\nsft:\n  epochs: 1\ncpt:\n  seq_len: 9\n")
    from lmpo.trainers.pipeline import PipelineConfig

    with pytest.raises(ConfigError, match=r"line 5: cpt: given twice \(first on line 1\)"):
        build(PipelineConfig, yaml_file=str(f))


def _jsonl(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_exact_match_prompts_without_an_answer_are_an_error_naming_the_row(start_model, tmp_path, capsys):
    prompts = _jsonl(tmp_path / "p.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2="}])
    run = tmp_path / "run"
    assert main(["train", "grpo", "--model", start_model, "--out", str(run), "--prompts", prompts,
                 "--task", "exact_match", *RL_RUN]) == 2
    assert "p.jsonl: row 2: field 'answer': expected the answer" in _error(capsys)
    assert not run.exists()  # refused before any model loaded or anything was written
    from lmpo.envs.data import load_prompts

    assert load_prompts(prompts)[1].answer == ""  # other tasks may go without answers


def test_a_null_prompt_is_called_null_not_missing(tmp_path):
    """`{"prompt": null, ...}` was refused as having 'no such field', which sends a user looking
    for a misspelt column name."""
    from lmpo.envs.data import DataError, load_prompts

    prompts = _jsonl(tmp_path / "p.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": None, "answer": "4"}])
    with pytest.raises(DataError, match=r"row 2: field 'prompt': expected .* got null \(the row's other fields: answer\)"):
        load_prompts(prompts)
    prompts = _jsonl(tmp_path / "q.jsonl", [{"question": "1+1=", "answer": "2"}])
    with pytest.raises(DataError, match=r"row 1: field 'prompt': expected .* got no such field \(the row has: question"):
        load_prompts(prompts)


def test_rl_prompts_longer_than_the_context_are_a_located_error(start_model, tmp_path):
    from lmpo.envs.data.records import DataError
    from lmpo.trainers.preflight import load_prompt_files
    from lmpo.trainers.rl_config import RLConfig

    prompts = _jsonl(tmp_path / "p.jsonl", [{"prompt": "12345="}, {"prompt": "1" * 200}, {"prompt": "x" * 10**6}])
    cfg = RLConfig(model=start_model, prompts=prompts, max_new_tokens=8, eval_problems=0)
    with pytest.raises(DataError, match=r"p.jsonl: row 2: field 'prompt': expected a prompt of at most 120 tokens "
                                        r"\(the model's context of 128 tokens minus max_new_tokens=8\), got 200 tokens"):
        load_prompt_files(cfg)


def test_an_overlong_row_is_rejected_from_its_length_before_tokenizing(char_tokenizer, tmp_path, monkeypatch):
    from lmpo.envs.data import chat, load_sft
    from lmpo.envs.data.preferences import load_preferences
    from lmpo.envs.data.records import DataError

    calls = []
    real = chat.encode
    monkeypatch.setattr(chat, "encode", lambda tok, text, *a, **k: calls.append(len(text)) or real(tok, text, *a, **k))
    huge = "7" * 2_000_000
    sft = _jsonl(tmp_path / "sft.jsonl", [{"prompt": "a", "completion": "b"}, {"prompt": "a", "completion": huge}])
    with pytest.raises(DataError, match=r"sft.jsonl: row 2: .*over max_length 64; rejected before tokenizing"):
        load_sft(sft, char_tokenizer, max_length=64)
    examples, report = load_sft(sft, char_tokenizer, max_length=64, overlong="skip")
    assert len(examples) == 1 and report.skipped_overlong == 1
    pairs = _jsonl(tmp_path / "pairs.jsonl", [{"prompt": huge, "chosen": "1", "rejected": "2"}])
    with pytest.raises(DataError, match=r"pairs.jsonl: row 1: .*rejected before tokenizing"):
        load_preferences(pairs, char_tokenizer, max_length=64)
    assert max(calls) < 1000  # the huge text never reached the tokenizer


def test_truncate_tokenizes_no_more_of_a_huge_row_than_it_keeps_and_keeps_the_same(char_tokenizer, tmp_path,
                                                                                      monkeypatch):
    """`--overlong truncate` tokenized a 30 MB reply whole (11 GB and rising after a minute); an
    over-long row's error named its first field (`'prompt': at least 2307693 tokens (2
    characters)`) instead of the long one."""
    from lmpo.envs.data import chat, load_sft
    from lmpo.envs.data import report as loading
    from lmpo.envs.data.preferences import load_preferences
    from lmpo.envs.data.records import DataError

    rows = [{"prompt": "1=", "chosen": "1", "rejected": "2"}, {"prompt": "2=", "chosen": "9" * 3000 + "8" * 10**6,
                                                                 "rejected": "3" * 500}]
    pairs = _jsonl(tmp_path / "pairs.jsonl", rows)
    with pytest.raises(DataError, match=r"pairs.jsonl: row 2: field 'chosen': at least \d+ tokens \(1003000 "
                                        r"characters in this field\)"):
        load_preferences(pairs, char_tokenizer, max_length=64)
    sft = _jsonl(tmp_path / "sft.jsonl", [{"messages": [{"role": "user", "content": "a"},
                                                        {"role": "assistant", "content": "b" * 10**6}]}])
    calls = []
    real = chat.encode
    monkeypatch.setattr(chat, "encode", lambda tok, text, *a, **k: calls.append(len(text)) or real(tok, text, *a, **k))
    cut, report = load_preferences(pairs, char_tokenizer, max_length=64, overlong="truncate")
    cut_sft, sft_report = load_sft(sft, char_tokenizer, max_length=64, overlong="truncate")
    assert report.truncated == sft_report.truncated == 1
    assert max(calls) < 10_000  # the megabytes never reached the tokenizer
    monkeypatch.setattr(loading, "_cut_strings", lambda value, chars: value)  # as before: tokenized whole
    assert load_preferences(pairs, char_tokenizer, max_length=64, overlong="truncate")[0] == cut  # the same kept
    assert load_sft(sft, char_tokenizer, max_length=64, overlong="truncate")[0] == cut_sft


def test_a_non_string_prompt_in_preference_data_is_a_type_error(char_tokenizer, tmp_path):
    from lmpo.envs.data.preferences import load_preferences
    from lmpo.envs.data.records import DataError

    path = _jsonl(tmp_path / "pairs.jsonl", [{"prompt": "1=", "chosen": "1", "rejected": "2"},
                                              {"prompt": 5, "chosen": "1", "rejected": "2"}])
    with pytest.raises(DataError, match=r"row 2: field 'prompt': expected a string or a list of messages, got int"):
        load_preferences(path, char_tokenizer, max_length=64)


def _runner_score(fn, n=2, **kwargs):
    from lmpo.envs import make_task
    from lmpo.rollout.reward_runner import RewardRunner

    task = make_task("sort_digits")
    problems = [task.make("12345") for _ in range(n)]
    with RewardRunner({"r": (fn, 1.0)}, **kwargs) as runner:
        return runner.score(task, problems, ["1"] * n, [True] * n)


@pytest.mark.parametrize("timeout_s", [5.0, 0.0], ids=["worker", "in-process"])
def test_reward_values_that_are_not_numbers_are_unscorable_with_the_reason(timeout_s):
    from reward_fns import returns_strings

    scores = _runner_score(returns_strings, timeout_s=timeout_s)
    assert scores.valid.tolist() == [False, False]
    assert "returned True (a bool), not a number" in scores.reasons["r"]


def test_a_reward_worker_has_a_memory_limit_and_bounded_captured_output(tmp_path, capfd):
    from reward_fns import allocates, prints_a_lot

    from lmpo.envs import make_task
    from lmpo.rollout.reward_runner import RewardRunner

    task = make_task("sort_digits")
    problems = [task.make("12345")]
    log = tmp_path / "workers.log"
    with RewardRunner({"big": (allocates, 1.0), "loud": (prints_a_lot, 1.0)}, timeout_s=30.0) as runner:
        for worker in runner._workers.values():
            worker.memory_mb, worker.log_path = 512, str(log)
        scores = runner.score(task, problems, ["1"], [True])
    assert scores.valid.tolist() == [False] and scores.failures == {"big": 1}
    assert "memory" in scores.reasons["big"] and "512 MB" in scores.reasons["big"]
    assert scores.components["loud"].tolist() == [1.0]
    out, err = capfd.readouterr()
    assert "xxxxxxxx" not in out and "xxxxxxxx" not in err  # nothing reached the trainer's terminal
    assert 1 << 20 <= log.stat().st_size < (1 << 20) + 4096 and "output beyond" in log.read_text()


def test_reward_failures_are_recorded_and_a_run_that_never_scores_stops(start_model, tmp_path, capsys):
    run = tmp_path / "rl"
    assert main(["train", "grpo", "--model", start_model, "--out", str(run), *RL_RUN[:-2], "--steps", "5",
                 "--rewards", "reward_fns:raises=1.0", "--reward_timeout", "10", "--max_unscorable_steps", "2"]) == 1
    captured = capsys.readouterr().err
    assert "[reward] reward_fns:raises could not score 4 of 4 completions (exception): ValueError: the grader crashed" \
        in captured
    last = captured.strip().splitlines()[-1]
    assert last.startswith("lmpo: error: every completion was unscorable in 2 consecutive scoring rounds")
    assert "the grader crashed" in last
    records = [json.loads(line) for line in (run / "reward_failures.jsonl").read_text().splitlines()]
    assert records[0]["function"] == "reward_fns:raises" and records[0]["kind"] == "exception"
    assert "ValueError: the grader crashed" in records[0]["reason"] and "Traceback" in records[0]["reason"]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "unscorable" in r] == [1]  # stopped in step 2, before its update
    assert "reward_mean" not in steps[-1] and steps[-1]["unscorable"] == 4  # nothing scored: no reward, not 0


def test_the_installed_command_imports_reward_modules_from_the_current_directory(tmp_path, monkeypatch):
    """`lmpo` (a console script: sys.path starts with its bin directory) finds `mymod:fn` in the
    current directory as `python -m lmpo` does (sys.path starts with the current directory)."""
    from lmpo.envs.rewards import import_reward

    (tmp_path / "issue14_rewards.py").write_text("def fn(task, problems, completions, terminated):\n"
                                                  "    return [1.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert import_reward("issue14_rewards:fn")(None, [], ["a"], [True]) == [1.0]


@pytest.mark.parametrize("cls,settings,match", [
    ("SFTConfig", {"max_length": 64}, r"max_length=64 is only read with --data FILE"),
    ("SFTConfig", {"data": "x.jsonl", "demonstrations": 10}, r"demonstrations=10 is not used with --data"),
    ("CPTConfig", {"data": "x.jsonl", "corpus_documents": 10}, r"corpus_documents=10 is not used with --data"),
    ("PreferenceConfig", {"overlong": "skip"}, r"overlong='skip' is only read with --data FILE"),
    ("RewardModelConfig", {"data": "x.jsonl", "heldout_data": "y.jsonl", "heldout_pairs": 5},
     r"heldout_pairs=5 is not used with --heldout_data"),
    ("RLConfig", {"prompts": "p.jsonl", "prompt_pool": 50}, r"prompt_pool=50 is not used with --prompts"),
])
def test_an_option_of_the_other_data_source_is_an_error(cls, settings, match):
    from lmpo.trainers import preference, reward_model, rl_config, supervised

    config = {"SFTConfig": supervised.SFTConfig, "CPTConfig": supervised.CPTConfig, "RLConfig": rl_config.RLConfig,
              "PreferenceConfig": preference.PreferenceConfig, "RewardModelConfig": reward_model.RewardModelConfig}[cls]
    with pytest.raises(ValueError, match=match):
        config(**settings).validate()
    config(**{k: v for k, v in settings.items() if k in ("data", "prompts", "heldout_data")}).validate()


def test_the_reward_model_worker_gets_room_for_its_weights(start_model, tmp_path):
    from reward_fns import half

    from lmpo.envs.data.chat import encode_start
    from lmpo.models.reward_scorer import RewardModelReward
    from lmpo.rollout.reward_runner import RewardRunner
    from lmpo.trainers.reward_watch import WatchedRewards

    runner = RewardRunner({"rm": (RewardModelReward(start_model, encode_prompt=encode_start), 1.0), "mine": (half, 1.0)}, timeout_s=5.0)
    watched = WatchedRewards(runner, tmp_path, max_unscorable_steps=3, memory_mb=100)
    assert runner._workers["mine"].memory_mb == 100 and runner._workers["rm"].memory_mb >= 2048
    assert runner._workers["mine"].log_path == str(tmp_path / "reward_workers.log")
    watched.close()


def test_a_short_run_whose_every_completion_was_unscorable_does_not_exit_0(start_model, tmp_path, capsys):
    run = tmp_path / "rl"
    assert main(["train", "grpo", "--model", start_model, "--out", str(run), *RL_RUN[:-2], "--steps", "1",
                 "--rewards", "reward_fns:raises=1.0", "--reward_timeout", "0"]) == 1
    assert "every completion of all 1 scoring rounds was unscorable" in _error(capsys)
    assert not (run / "model").exists()


def test_the_error_policy_records_its_failure_too(start_model, tmp_path):
    from lmpo.rollout.reward_runner import RewardFailure
    from lmpo.trainers.rl import train_rl
    from lmpo.trainers.rl_config import RLConfig

    cfg = RLConfig(model=start_model, out=str(tmp_path / "rl"), steps=2, prompts_per_step=2, group_size=2,
                   max_new_tokens=4, eval_problems=0, save_every=0, threads=1, rewards="reward_fns:raises=1.0",
                   reward_timeout=0.0, reward_failure="error")
    with pytest.raises(RewardFailure):
        train_rl(cfg)
    record = json.loads((tmp_path / "rl" / "reward_failures.jsonl").read_text().splitlines()[0])
    assert record["function"] == "reward_fns:raises" and "the grader crashed" in record["reason"]


@pytest.mark.parametrize("stage", ["sft", "dpo", "kto", "rm"])
def test_logprob_chunks_are_refused_where_nothing_chunks(stage, start_model, tmp_path, capsys):
    """`--logprob_chunk_tokens` was accepted and ignored outside RL, and the memory it promised to
    save was not saved."""
    argv = ["train", stage, "--model", start_model, "--out", str(tmp_path / stage), "--logprob_chunk_tokens", "8"]
    assert main(argv) == 2
    assert _error(capsys) == (f"lmpo: error: invalid {stage} config: logprob_chunk_tokens=8 is not used by {stage}: "
                              "only RL's log-probs apply the output head in chunks")
    assert not (tmp_path / stage).exists()


def test_rl_chunks_the_reference_and_critic_forwards_too(start_model, tmp_path, monkeypatch):
    """Only the update chunked: the reference forward (and a value head's) still built the whole
    batch's full-vocabulary logits."""
    import lmpo.trainers.rl as rl

    seen = []
    real = rl.completion_outputs

    def recording(*args, **kwargs):
        seen.append((kwargs.get("hidden", False), kwargs.get("chunk_tokens", 0)))
        return real(*args, **kwargs)

    monkeypatch.setattr(rl, "completion_outputs", recording)
    for preset, extra in (("grpo", []), ("ppo", ["--critic", "head"])):
        assert main(["train", preset, "--model", start_model, "--out", str(tmp_path / preset), *RL_RUN, *extra,
                     "--logprob_chunk_tokens", "3"]) == 0
    assert (False, 3) in seen and (True, 3) in seen and all(chunk == 3 for _, chunk in seen)


def test_a_prompt_the_tokenizer_turns_into_no_tokens_is_refused_before_training(tmp_path):
    """A whitespace prompt under a tokenizer that drops whitespace passed every check before the
    model loaded and stopped the run when the shuffled stream reached it (QA U: step 15 of 20),
    and again on --resume."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from lmpo.envs.data import DataError, load_prompts

    vocab = {"[UNK]": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate("0123456789+=")}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split("", "isolated")])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", eos_token="<eos>")
    assert tokenizer("   ", add_special_tokens=False).input_ids == []
    prompts = _jsonl(tmp_path / "p.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": "   ", "answer": "1"}])
    with pytest.raises(DataError, match=r"p.jsonl: row 2: field 'prompt': expected a prompt of at least one token, "
                                        r"got '   ', which the tokenizer turns into no tokens"):
        load_prompts(prompts, tokenizer=tokenizer)
    assert len(load_prompts(prompts)) == 2  # without a tokenizer there is nothing to count
