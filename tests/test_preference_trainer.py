import json
import math

import pytest

from lmpo.cli.main import main


@pytest.mark.parametrize("loss", ["dpo", "cdpo", "ipo", "simpo"])
def test_preference_training_runs_for_every_loss(loss, start_model, tmp_path):
    out = tmp_path / loss
    assert main(["train", "dpo", "--loss", loss, "--model", start_model, "--out", str(out), "--pairs", "32",
                 "--batch_size", "8", "--eval_problems", "16", "--log_every", "1", "--threads", "1"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert len(steps) == 4 and all(math.isfinite(r["loss"]) for r in steps)
    assert {"chosen_reward", "rejected_reward", "margin", "accuracy"} <= set(steps[0])
    if loss == "dpo":
        # the policy starts equal to the reference: h = 0, so the first loss is -log(sigmoid(0)) = log 2
        assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
        assert steps[0]["margin"] == pytest.approx(0.0, abs=1e-5)
    result = json.loads((out / "result.json").read_text())
    assert result["models_held"] == {"policy": 1, "reference": 0} and result["accuracy"] is not None
