"""The KTO trainer: a few steps on a tiny model, its reference point, a falling loss on a fixed
batch, exact resume, and the pipeline's `--rl kto` stage."""

import copy
import json
import math
import signal
from dataclasses import replace

import pytest
import torch

from lmpo.algos import kto
from lmpo.cli.main import main
from lmpo.envs.data.unpaired import UnpairedExample
from lmpo.trainers.distributed import Distributed
from lmpo.trainers.kto import KTOConfig, encode_unpaired, kto_loss, summed_logps, with_mismatched
from lmpo.trainers.pipeline import PipelineConfig, last_stage, validate_stages
from test_data import write
from test_resume import _assert_same_weights, _run, _tail, launcher  # noqa: F401 (a fixture)


def rows_of(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_kto_trains_on_the_tasks_right_and_wrong_answers(start_model, tmp_path):
    out = tmp_path / "kto"
    assert main(["train", "kto", "--model", start_model, "--out", str(out), "--pairs", "16", "--batch_size", "8",
                 "--eval_problems", "16", "--log_every", "1", "--threads", "1"]) == 0
    steps = [r for r in rows_of(out) if "loss" in r]
    assert len(steps) == 4 and all(math.isfinite(r["loss"]) for r in steps)  # 16 pairs: 32 examples
    assert {"kl", "desirable_reward", "undesirable_reward", "margin", "desirable_logps", "grad_norm"} <= set(steps[0])
    # the policy starts as the reference: every reward and z0 are 0, so each example's loss is 1 - sigma(0)
    assert steps[0]["loss"] == pytest.approx(0.5, abs=1e-6) and steps[0]["kl"] == 0.0
    assert steps[-1]["margin"] != 0.0
    result = json.loads((out / "result.json").read_text())
    assert result["models_held"] == {"policy": 1, "reference": 0} and result["accuracy"] is not None
    assert result["name"] == "kto"


def _fixed_rows(n: int = 8) -> list[dict]:
    return [{"prompt": f"{i}{i + 1}=", "completion": f"{i}{i + 1}" if i % 2 else f"{i + 1}{i}", "label": bool(i % 2)}
            for i in range(n)]


def test_loss_falls_on_a_tiny_fixed_batch(start_model, tmp_path):
    path = write(tmp_path / "u.jsonl", _fixed_rows())
    out = tmp_path / "kto"
    assert main(["train", "kto", "--model", start_model, "--data", str(path), "--out", str(out), "--batch_size", "8",
                 "--epochs", "12", "--lr", "1e-3", "--warmup_steps", "0", "--lr_schedule", "constant",
                 "--log_every", "1", "--save_every", "0", "--threads", "1"]) == 0
    losses = [r["loss"] for r in rows_of(out) if "loss" in r]
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.1, losses


def test_the_reference_point_carries_no_gradient(tiny_llama, char_tokenizer):
    """z0 is a constant of the loss: the gradient equals that of `kto` with z0 given as a number,
    and differs from the one a z0 left in the graph would give."""
    policy = copy.deepcopy(tiny_llama).train().requires_grad_(True)
    examples = [UnpairedExample(char_tokenizer(p).input_ids, char_tokenizer(c).input_ids + [char_tokenizer.eos_token_id],
                                d) for p, c, d in [("12=", "12", True), ("31=", "31", False), ("20=", "02", True)]]
    enc = encode_unpaired(with_mismatched(examples), char_tokenizer.pad_token_id)
    with torch.no_grad():
        ref_logps = summed_logps(policy, enc, enc.completion, enc.completion_mask) - 0.5
        ref_kl = summed_logps(policy, enc, enc.kl_completion, enc.kl_completion_mask) - 1.0  # so z0 = 1
    cfg = KTOConfig(beta=0.5)
    loss, figures = kto_loss(policy, enc, (ref_logps, ref_kl), cfg, Distributed())
    assert figures["kl"].item() == pytest.approx(1.0, abs=1e-5) and not figures["kl"].requires_grad
    params = [p for p in policy.parameters()]
    grads = torch.autograd.grad(loss, params)

    logps = summed_logps(policy, enc, enc.completion, enc.completion_mask)
    by_hand, _ = kto(logps, ref_logps, enc.desirable, figures["kl"].item(), beta=0.5)
    for a, b in zip(grads, torch.autograd.grad(by_hand.mean(), params, retain_graph=True)):
        torch.testing.assert_close(a, b)
    z0_in_graph = (summed_logps(policy, enc, enc.kl_completion, enc.kl_completion_mask) - ref_kl).mean()
    reward = 0.5 * (logps - ref_logps)
    attached = torch.where(enc.desirable, 1 - torch.sigmoid(reward - 0.5 * z0_in_graph),
                           1 - torch.sigmoid(0.5 * z0_in_graph - reward)).mean()
    assert any(not torch.allclose(a, b) for a, b in zip(grads, torch.autograd.grad(attached, params)))


def test_the_mismatched_completions_are_the_batchs_own_shifted_by_one():
    examples = [UnpairedExample([5], [10 + i, 2], i % 2 == 0) for i in range(3)]
    enc = encode_unpaired(with_mismatched(examples), pad_id=0)
    assert enc.kl_completion[:, 0].tolist() == [12, 10, 11] and enc.desirable.tolist() == [True, False, True]


def test_options_are_checked_before_any_model_loads(tmp_path, capsys):
    assert main(["train", "kto", "--model", "no/such/model", "--batch_size", "1", "--undesirable_weight", "-1",
                 "--out", str(tmp_path / "k")]) == 2
    err = capsys.readouterr().err
    assert "batch_size=1: KTO's reference point" in err and "undesirable_weight=-1.0 must be >= 0" in err


RUN = ["train", "kto", "--log_every", "1", "--pairs", "8", "--batch_size", "8", "--epochs", "2", "--lr", "1e-3",
       "--eval_problems", "0", "--save_every", "1", "--threads", "1"]  # 16 examples: 2 steps per epoch


def check_exact_resume(launcher, argv: list[str], tmp_path, steps: int) -> None:  # noqa: F811
    """Killed at the end of step 2 (an epoch's end) and while writing step 3's checkpoint, then
    resumed: the same weights and losses as the uninterrupted run, each step logged once."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    assert _run(launcher, [*argv, "--out", str(ref)], ref) == 0, _tail(ref)
    for attempt, kill in enumerate(["epoch_end:2", "checkpoint_write:3"]):
        flags = ["--out", str(run)] if attempt == 0 else ["--resume", str(run)]
        assert _run(launcher, argv + flags, run, kill) == -signal.SIGKILL, _tail(run)
    assert _run(launcher, [*argv, "--resume", str(run)], run) == 0, _tail(run)
    _assert_same_weights(ref / "model", run / "model")
    assert [r["step"] for r in rows_of(run) if "loss" in r] == list(range(1, steps + 1))
    assert [r["loss"] for r in rows_of(run) if "loss" in r] == [r["loss"] for r in rows_of(ref) if "loss" in r]


def test_killed_and_resumed_kto_run_equals_the_uninterrupted_one(launcher, start_model, tmp_path):  # noqa: F811
    check_exact_resume(launcher, [*RUN, "--model", start_model], tmp_path, steps=4)


@pytest.mark.parametrize("rl,bad,error", [("kto", {"batch_size": 1}, "batch_size=1"),
                                          ("orpo", {"beta": 0.0}, "beta=0.0 must be > 0")])
def test_the_pipeline_runs_it_as_its_last_stage(rl, bad, error, start_model, tmp_path):
    cfg = PipelineConfig(rl=rl)
    cfg = replace(cfg, **{rl: replace(getattr(cfg, rl), pairs=8, batch_size=8, eval_problems=8)})
    validate_stages(cfg)
    shared = {"task": cfg.task, "seed": 0, "threads": 1, "device": "cpu", "precision": "fp32"}
    result = last_stage(cfg, start_model, tmp_path, shared)
    assert result.name == rl and (tmp_path / rl / "model").is_dir() and result.accuracy is not None
    with pytest.raises(ValueError, match=error):
        validate_stages(replace(cfg, **{rl: replace(getattr(cfg, rl), **bad)}))


@pytest.mark.slow
def test_two_processes_train_as_one_on_the_same_global_batch(start_model, tmp_path):
    """The mismatched pairs are made on the whole batch and z0 is gathered over the processes,
    so two data-parallel processes log the losses and reference points of one."""
    from test_distributed import torchrun

    args = ["train", "kto", "--model", start_model, "--pairs", "8", "--batch_size", "8", "--epochs", "3",
            "--lr", "1e-3", "--eval_problems", "0", "--log_every", "1", "--save_every", "0", "--threads", "1"]
    torchrun("-m", "lmpo", *args, "--out", str(tmp_path / "two"))
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    one, two = ([r for r in rows_of(tmp_path / name) if "loss" in r] for name in ("one", "two"))
    assert len(one) == len(two) == 6 and any(r["kl"] > 0 for r in one), one
    for a, b in zip(one, two):
        for key in ("loss", "kl", "desirable_reward", "undesirable_reward"):
            assert b[key] == pytest.approx(a[key], abs=1e-5), (a["step"], key)


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["kto", "orpo"])
def test_the_default_stage_raises_heldout_accuracy_from_the_sft_start(trainer, tmp_path):
    """The acceptance check: from the embedded task's SFT checkpoint (seed 0: 32.0% held-out), the
    default budget gains >= 20 points (measured: KTO 67.8%, ORPO 76.2%)."""
    from lmpo.teach.start import sft_start

    start = sft_start(seed=0)
    out = tmp_path / trainer
    assert main(["train", trainer, "--model", start.model_dir, "--out", str(out), "--threads", "1"]) == 0
    accuracy = [r["eval_accuracy"] for r in rows_of(out) if "eval_accuracy" in r]
    assert accuracy[0] == pytest.approx(start.sft_accuracy) and accuracy[-1] - accuracy[0] >= 0.20, accuracy
