"""SFT and reward-model runs log a held-out evaluation before training (step 0), as RL and DPO
runs do, so `lmpo report` and `lmpo doctor` have a "before" point; it leaves the trained model as
a run without it trains it (it moves no random state and no data order)."""

import json
from pathlib import Path

from lmpo.cli.main import main


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _sft(out: Path, eval_problems: int) -> None:
    assert main(["train", "sft", "--model", "tiny", "--out", str(out), "--threads", "1", "--epochs", "1",
                 "--demonstrations", "32", "--batch_size", "16", "--eval_problems", str(eval_problems),
                 "--save_every", "0"]) == 0


def test_sft_logs_held_out_accuracy_before_training_and_trains_the_same_model(tmp_path):
    """An SFT run's metrics held one evaluation, at its last step: its report drew a single point
    and nothing said where the model started."""
    _sft(tmp_path / "evaluated", 20)
    _sft(tmp_path / "plain", 0)
    rows = _rows(tmp_path / "evaluated")
    first, last = rows[0], rows[-1]
    assert first["step"] == 0 and {"eval_accuracy", "eval_format_accuracy"} <= first.keys()
    assert last["step"] == 2 and "eval_accuracy" in last
    assert not any("eval_accuracy" in r for r in _rows(tmp_path / "plain"))
    weights = [(tmp_path / run / "model" / "model.safetensors").read_bytes() for run in ("evaluated", "plain")]
    assert weights[0] == weights[1]


def test_reward_model_logs_pairwise_accuracy_of_its_start(tmp_path):
    """A reward-model run's only held-out figure was its end's: no start to judge the gain by.
    The step-0 row is the start model's pairwise accuracy on the same held-out pairs."""
    import torch

    from lmpo.envs import make_task
    from lmpo.models import load_tokenizer
    from lmpo.trainers.reward_model import (RewardModelConfig, load_reward_model, pairwise_accuracy,
                                            reward_model_pairs)

    out = tmp_path / "rm"
    assert main(["train", "rm", "--model", "tiny", "--out", str(out), "--pairs", "32", "--heldout_pairs", "40",
                 "--epochs", "1", "--batch_size", "16", "--threads", "1", "--save_every", "0"]) == 0
    rows = [r for r in _rows(out) if "eval_accuracy" in r]
    assert [r["step"] for r in rows] == [0, 2]
    cfg = RewardModelConfig(model="tiny", heldout_pairs=40, pairs=32)
    tok = load_tokenizer("tiny")
    _, heldout = reward_model_pairs(cfg, make_task(cfg.task), tok)
    torch.manual_seed(0)
    start = load_reward_model("tiny", tok, cfg.seed)
    start.config.pad_token_id = tok.pad_token_id
    assert rows[0]["eval_accuracy"] == pairwise_accuracy(start, tok, heldout)
