"""The ORPO trainer: a few steps on a tiny model, its loss against a hand computation from the
model's own log-probs, a falling loss on a fixed batch, exact resume (`lmpo pipeline --rl orpo`: tests/test_kto.py)."""

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lmpo.cli.main import main
from test_data import write
from test_kto import check_exact_resume
from test_resume import launcher  # noqa: F401 (a fixture)


def step_rows(out):
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def test_orpo_trains_on_the_tasks_pairs_without_a_reference(start_model, tmp_path):
    out = tmp_path / "orpo"
    assert main(["train", "orpo", "--model", start_model, "--out", str(out), "--pairs", "32", "--batch_size", "8",
                 "--eval_problems", "16", "--log_every", "1", "--threads", "1"]) == 0
    steps = step_rows(out)
    assert len(steps) == 4 and all(math.isfinite(r["loss"]) for r in steps)
    assert {"nll", "log_odds_ratio", "accuracy", "margin", "chosen_logps"} <= set(steps[0])
    result = json.loads((out / "result.json").read_text())
    assert result["models_held"] == {"policy": 1, "reference": 0} and result["name"] == "orpo"
    assert result["accuracy"] is not None


def _average_logp(model, tok, prompt: str, reply: str) -> float:
    """Mean log-prob of the reply's tokens and eos after the prompt, from the model's logits."""
    prompt_ids = tok(prompt, add_special_tokens=False).input_ids
    reply_ids = tok(reply, add_special_tokens=False).input_ids + [tok.eos_token_id]
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + reply_ids])).logits[0].double()
    logps = torch.log_softmax(logits, -1)[len(prompt_ids) - 1:-1].gather(1, torch.tensor(reply_ids)[:, None])
    return logps.mean().item()


def test_the_first_loss_is_nll_plus_lambda_times_the_odds_ratio_term(start_model, tmp_path):
    path = write(tmp_path / "p.jsonl", [{"prompt": "312=", "chosen": "123", "rejected": "132"}])
    out = tmp_path / "orpo"
    lam = 0.5
    assert main(["train", "orpo", "--model", start_model, "--data", str(path), "--out", str(out), "--batch_size", "1",
                 "--beta", str(lam), "--log_every", "1", "--save_every", "0", "--threads", "1"]) == 0
    model, tok = AutoModelForCausalLM.from_pretrained(start_model).eval(), AutoTokenizer.from_pretrained(start_model)
    a_w, a_l = _average_logp(model, tok, "312=", "123"), _average_logp(model, tok, "312=", "132")
    log_odds = (a_w - math.log(1 - math.exp(a_w))) - (a_l - math.log(1 - math.exp(a_l)))
    odds_ratio_term = math.log(1 + math.exp(-log_odds))  # -log sigma(log odds ratio)
    (row,) = step_rows(out)
    assert row["nll"] == pytest.approx(-a_w, abs=1e-5)
    assert row["log_odds_ratio"] == pytest.approx(log_odds, abs=1e-5)
    assert row["loss"] == pytest.approx(-a_w + lam * odds_ratio_term, abs=1e-5)


def test_loss_falls_on_a_tiny_fixed_batch(start_model, tmp_path):
    rows = [{"prompt": f"{i}{i + 1}=", "chosen": f"{i}{i + 1}", "rejected": f"{i + 1}{i}"} for i in range(4)]
    path, out = write(tmp_path / "p.jsonl", rows), tmp_path / "orpo"
    assert main(["train", "orpo", "--model", start_model, "--data", str(path), "--out", str(out), "--batch_size", "4",
                 "--epochs", "10", "--lr", "1e-3", "--warmup_steps", "0", "--lr_schedule", "constant",
                 "--log_every", "1", "--save_every", "0", "--threads", "1"]) == 0
    losses = [r["loss"] for r in step_rows(out)]
    assert len(losses) == 10 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 1.0 and losses == sorted(losses, reverse=True), losses


RUN = ["train", "orpo", "--log_every", "1", "--pairs", "16", "--batch_size", "8", "--epochs", "2", "--lr", "1e-3",
       "--eval_problems", "0", "--save_every", "1", "--threads", "1"]  # 2 steps per epoch


def test_killed_and_resumed_orpo_run_equals_the_uninterrupted_one(launcher, start_model, tmp_path):  # noqa: F811
    check_exact_resume(launcher, [*RUN, "--model", start_model], tmp_path, steps=4)


def test_a_run_resumes_only_under_its_own_command(start_model, tmp_path, capsys):
    out = tmp_path / "orpo"
    argv = ["--pairs", "8", "--batch_size", "8", "--eval_problems", "0", "--threads", "1", "--model", start_model]
    assert main(["train", "orpo", *argv, "--out", str(out)]) == 0
    assert main(["train", "kto", *argv, "--resume", str(out)]) == 2
    assert f"it is a orpo run; resume it with `lmpo train orpo --resume {out}`" in capsys.readouterr().err
