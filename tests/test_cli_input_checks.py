"""Inputs the CLI once took in silence or answered with a misleading message: repeated compare
seeds, prompts over the RL limit in `lmpo data`, sampling options of a greedy `lmpo eval`, and
the wording of over-long rows, JSON arrays named .jsonl and a file given to `lmpo report`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmpo.cli.main import main
from lmpo.envs.data import DataError, load_sft, read_records
from lmpo.teach.compare.summary import MethodSummary, Spread, recommend
from hardening_common import error_line


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_compare_refuses_a_seed_given_twice(tmp_path, capsys):
    argv = ["compare", "--methods", "grpo", "--seeds", "0,0", "--samples", "64", "--out", str(tmp_path / "cmp")]
    assert main(argv) == 2
    assert "seeds='0,0' names a seed twice" in error_line(capsys)
    assert not (tmp_path / "cmp").exists()


def test_one_method_is_not_said_to_be_ahead_of_others():
    one = MethodSummary("grpo", Spread.of([0.5, 0.52]), Spread.of([10, 10]), Spread.of([100, 100]),
                        Spread.of([64, 64]), Spread.of([500, 500]), ["policy"], "none", "", "")
    last = recommend([one], Spread.of([0.5, 0.51])).lines[-1]
    assert last == "Recommendation: grpo — the only method compared, so none to rank it against."


def test_data_warns_of_prompts_over_the_rl_limit(tmp_path, capsys):
    """The trainers refuse a prompt over the context less max_new_tokens (the tiny preset: 256)."""
    path = _jsonl(tmp_path / "long.jsonl", [{"prompt": "1" * 300, "answer": "1"}, {"prompt": "1+1=", "answer": "2"}])
    assert main(["data", path, "--kind", "prompts", "--show", "0"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("warning: 1 rows are over 244 tokens (the model's context of 256 tokens minus max_new_tokens=12): "
            "a trainer stops at the first of them") in out
    assert main(["data", path, "--kind", "prompts", "--show", "0", "--max_new_tokens", "300"]) == 2
    assert "--max_new_tokens 300 leaves no room for a prompt in the model's context of 256 tokens" in error_line(capsys)


def test_eval_refuses_sampling_options_without_samples(capsys):
    argv = ["eval", "--model", "tiny", "--eval_problems", "2", "--temperature", "0.7", "--top_k", "5"]
    assert main(argv) == 2
    assert "temperature=0.7, top_k=5 need --samples K (samples=0 evaluates greedily" in error_line(capsys)
    assert main(["eval", "--model", "tiny", "--eval_problems", "2", "--top_p", "0.5"]) == 2
    assert "top_p=0.5 needs --samples K" in error_line(capsys)


def test_overlong_rows_name_the_cli_flag(tmp_path, char_tokenizer, capsys):
    short = _jsonl(tmp_path / "short.jsonl", [{"prompt": "1" * 40, "completion": "2"}])
    with pytest.raises(DataError, match="pass a larger --max_length, or --overlong skip or --overlong truncate"):
        load_sft(short, char_tokenizer, max_length=16)
    huge = _jsonl(tmp_path / "huge.jsonl", [{"prompt": "1" * 5000, "completion": "2"}])
    with pytest.raises(DataError, match="rejected before tokenizing \\(pass a larger --max_length, or --overlong skip or --overlong truncate"):
        load_sft(huge, char_tokenizer, max_length=16)
    # from Python the arguments are named too; on the command line the flags alone (it said both)
    with pytest.raises(DataError, match="--overlong truncate, overlong='skip' or 'truncate' from Python, to load"):
        load_sft(short, char_tokenizer, max_length=16)
    assert main(["train", "sft", "--data", short, "--max_length", "16", "--out", str(tmp_path / "run")]) == 2
    assert error_line(capsys).endswith("(pass a larger --max_length, or --overlong skip or --overlong truncate, to load "
                                       "such rows)")
    assert main(["data", short, "--model", "tiny", "--max_length", "16"]) == 2  # skipped, as `lmpo data` does
    assert error_line(capsys).endswith("all 1 rows are over max_length 16 (--overlong skip)")  # not overlong='skip'


@pytest.mark.parametrize("text", ['[{"prompt": "1+1=", "completion": "2"}]\n',
                                  '[\n{"prompt": "1+1=", "completion": "2"},\n'
                                  '{"prompt": "1+2=", "completion": "3"}\n]\n'])
def test_a_json_array_named_jsonl_is_told_to_be_named_json(tmp_path, text):
    (tmp_path / "arr.jsonl").write_text(text)
    with pytest.raises(DataError, match="row 1: .*; the file looks like one JSON array, not JSON Lines .*'arr.json'"):
        read_records(tmp_path / "arr.jsonl")
    (tmp_path / "arr.json").write_text(text)
    assert read_records(tmp_path / "arr.json")[0].fields["prompt"] == "1+1="


def test_report_of_a_file_says_it_is_not_a_run_directory(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    assert main(["report", str(tmp_path / "config.json")]) == 2
    assert error_line(capsys).endswith(f"config.json is a file, not a run directory (the directory holding it is "
                                       f"{tmp_path})")


def test_online_dpo_refuses_options_it_never_read(tmp_path, capsys):
    """`--pairs`, `--eval_max_new_tokens` and `--log_every` were accepted by `lmpo train online_dpo`
    and read by nothing."""
    for flag, says in (("--pairs", "pairs=7 is not read by online DPO"),
                       ("--eval_max_new_tokens", "eval_max_new_tokens=7 is not read by online DPO"),
                       ("--log_every", "log_every=7 is not read by online DPO")):
        assert main(["train", "online_dpo", "--model", "tiny", flag, "7", "--out", str(tmp_path / "run")]) == 2
        assert says in error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_a_reward_models_heldout_file_is_its_held_out_set_without_data_too(tmp_path, capsys):
    """`lmpo train rm --heldout_data FILE` without `--data` measured on the task's embedded pairs and
    ignored the file."""
    heldout = tmp_path / "one.jsonl"
    heldout.write_text(json.dumps({"prompt": "1=", "chosen": "1", "rejected": "2"}) + "\n")
    out = tmp_path / "rm"
    assert main(["train", "rm", "--model", "tiny", "--threads", "1", "--epochs", "1", "--batch_size", "2",
                 "--pairs", "8", "--heldout_data", str(heldout), "--max_length", "64", "--out", str(out)]) == 0
    assert "held-out pairwise accuracy" in (said := capsys.readouterr().out) and " on 1 pairs" in said, said


def test_a_reward_models_heldout_file_that_repeats_training_pairs_is_warned_of(tmp_path, capsys):
    """`--heldout_data` the same file as `--data`: the "held-out" 100% was training accuracy, unsaid."""
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}=", "chosen": "1", "rejected": "2"}) + "\n" for i in range(8)))
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"prompt": "1=", "chosen": "1", "rejected": "2"}) + "\n"
                     + json.dumps({"prompt": "x=", "chosen": "1", "rejected": "2"}) + "\n")
    for heldout, says in ((data, "8 of the 8 pairs"), (other, "1 of the 2 pairs")):
        assert main(["train", "rm", "--model", "tiny", "--threads", "1", "--epochs", "1", "--batch_size", "4",
                     "--data", str(data), "--heldout_data", str(heldout), "--max_length", "64",
                     "--out", str(tmp_path / heldout.stem)]) == 0
        assert f"warning: {says} of --heldout_data {heldout} are training pairs too" in capsys.readouterr().out


def test_online_dpos_round_row_speaks_for_every_update_of_the_round():
    """The row held only the round's last minibatch (3 of 15 pairs: accuracy 0.667), and the first
    update's loss (ln 2) was logged nowhere."""
    from lmpo.trainers.online_dpo import round_means

    updates = [(4, {"loss": 0.6931, "accuracy": 0.5, "grad_norm": 1.0, "lr": 1e-5}),
               (4, {"loss": 0.69, "accuracy": 0.25, "grad_norm": None, "lr": 2e-5}),
               (2, {"loss": 0.6, "accuracy": 1.0, "grad_norm": 3.0, "lr": 3e-5})]
    row = round_means(updates)
    assert row == pytest.approx({"loss": (4 * 0.6931 + 4 * 0.69 + 2 * 0.6) / 10, "accuracy": 0.5, "lr": 3e-5,
                                 "updates": 3})
    assert round_means([]) == {}


def test_online_dpo_logs_each_round_at_its_own_step_even_without_pairs(start_model, tmp_path):
    """A round whose samples all tie trains on nothing: its row repeated the step (the update count)
    of the round before it, and the report, which keys rows by step, dropped one of the two."""
    import json

    out = tmp_path / "odpo"
    assert main(["train", "online_dpo", "--model", start_model, "--out", str(out), "--rounds", "3",
                 "--prompts_per_round", "2", "--samples_per_prompt", "2", "--eval_problems", "0",
                 "--threads", "1"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rounds = [r for r in rows if "round" in r]
    assert [(r["step"], r["round"]) for r in rounds] == [(1, 1), (2, 2), (3, 3)]
    assert [r["optimizer_steps"] for r in rounds] == [0, 0, 0] and all(r["pairs"] == 0 for r in rounds)


def test_online_dpos_pairs_never_choose_a_cut_off_sample():
    """With a reward model, a completion cut off at the token limit could score best and be the
    chosen reply: DPO then taught the model not to stop (RFT's kept samples, the same)."""
    from types import SimpleNamespace

    from lmpo.trainers.online_dpo import best_vs_worst

    rows = [[1], [2], [3], [4], [5], [6], [7], [8]]
    rollout = SimpleNamespace(completion_token_lists=lambda: rows, prompt_ids=[[0]] * 8)
    scores = torch.tensor([0.9, 0.5, 0.1, 0.3, 0.2, 0.2, float("nan"), 0.8])
    ended = torch.tensor([False, True, True, True, False, True, True, False])
    _, chosen, rejected = best_vs_worst(rollout, scores, 4, ended)
    # group 1: the cut-off 0.9 is passed over, 0.5 is chosen over 0.1; group 2: only the
    # ended 0.2 may be chosen, and it does not beat the worst (0.2): no pair
    assert (chosen, rejected) == ([[2]], [[3]])
    _, chosen, rejected = best_vs_worst(rollout, scores, 4)  # every sample ended
    assert (chosen, rejected) == ([[1], [8]], [[3], [5]])
