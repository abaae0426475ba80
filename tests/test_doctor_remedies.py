"""The doctor on every trainer: broken preference and reward-model runs are found, and each
remedy names flags that the run's own command takes (`lmpo train online_dpo` has no
--collapse_guard; a pipeline's stage takes --rl_stage.group_size, not --group_size). Synthetic
metrics rows, shaped like each trainer's own."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import re
from pathlib import Path

import pytest

from lmpo.cli.main import main
from lmpo.cli.train import TRAINERS
from lmpo.reports.doctor import diagnose
from lmpo.reports.doctor_runs import diagnose_run

STEPS = 40


def _fields(trainer: str) -> set[str]:
    if trainer == "rl":
        from lmpo.trainers.rl_config import RLConfig

        return {f.name for f in dataclasses.fields(RLConfig)}
    module, config, _ = TRAINERS[trainer]
    return {f.name for f in dataclasses.fields(getattr(importlib.import_module(f"lmpo.trainers.{module}"), config))}


def _flags(text: str) -> tuple[set[str], set[str]]:
    """(plain, dotted) flags a remedy names outside `backticked commands` (another command's)."""
    text = re.sub(r"`[^`]*`", "", text)
    plain = set(re.findall(r"(?<![\w.-])--([a-z_][a-z0-9_]*)(?![\w.])", text))
    return plain, set(re.findall(r"(?<![\w.-])--([a-z_]+\.[a-z_]+)", text))


def _series(**series: tuple[float, float]) -> list[dict]:
    """STEPS training rows, each figure going linearly from its first value to its last."""
    return [{"step": i, **{k: a + (b - a) * (i - 1) / (STEPS - 1) for k, (a, b) in series.items()}}
            for i in range(1, STEPS + 1)]


def _evals(accuracy: tuple[float, float], fmt: tuple[float, float] | None = (0.95, 0.05),
           every: int = 10) -> list[dict]:
    rows = []
    for step in range(0, STEPS + 1, every):
        t = step / STEPS
        row = {"step": step, "eval_accuracy": accuracy[0] + (accuracy[1] - accuracy[0]) * t}
        if fmt:
            row["eval_format_accuracy"] = fmt[0] + (fmt[1] - fmt[0]) * t
        rows.append(row)
    return rows


def _broken(rows: list[dict], **faults) -> list[dict]:
    """The rows with a non-finite loss at the end and the given figures on the last row."""
    rows = [dict(r) for r in rows]
    last = max((r for r in rows if "loss" in r), key=lambda r: r["step"])
    last.update(loss=math.nan, **faults)
    return rows


PREFERENCE = _series(loss=(0.69, 3.7), accuracy=(0.5, 0.1), margin=(0.0, -2.0), grad_norm=(50.0, 50.0))
RL = _series(reward_mean=(0.1, 2.0), accuracy=(0.5, 0.5), format_accuracy=(1.0, 0.3), zero_var_frac=(0.95, 0.95),
             entropy=(0.5, 0.0), kl=(0.0, 3.0), truncated_frac=(0.0, 0.9), completion_len_mean=(10.0, 40.0),
             clip_frac=(0.5, 0.5), sampler_kl=(0.0, 0.1), loss=(0.1, 0.1))


def _kinds(evals: list[dict]) -> list[dict]:
    """The evaluations with a kind of problem solved half the time at first and never at the end."""
    evals = [dict(r) for r in evals]
    evals[0]["eval_kind_refund_accuracy"], evals[-1]["eval_kind_refund_accuracy"] = 0.5, 0.0
    return evals


ROWS = {
    "rl": _broken(RL, skipped_updates=1, unscorable=3) + _kinds(_evals((0.5, 0.1), every=STEPS)),
    "online_dpo": _broken(_series(reward_mean=(0.5, 0.5), accuracy=(0.5, 0.1), loss=(0.7, 3.0), optimizer_steps=(0, 0),
                                  unended_frac=(0.0, 0.0)), unscorable=3) + _kinds(_evals((0.5, 0.1))),
    "rft": _series(reward_mean=(0.5, 0.5), acceptance_rate=(0.0, 0.0), kept=(0, 0), updates=(0, 0), loss=(1.0, 1.0),
                   unscorable=(1, 1)) + _kinds(_evals((0.5, 0.1))),
    "dpo": _broken(PREFERENCE, skipped_updates=2) + _evals((0.6, 0.0)),
    "kto": _broken(_series(loss=(0.5, 3.0), kl=(0.0, 2.0), margin=(0.0, -1.0)), skipped_updates=2)
    + _evals((0.6, 0.0)),
    "orpo": _broken(PREFERENCE, skipped_updates=2) + _evals((0.6, 0.0)),
    "rm": _broken(PREFERENCE, skipped_updates=2) + _evals((0.4, 0.2), fmt=None),
    "cpt": _broken(_series(loss=(3.0, 1.0)), skipped_updates=2),
    "sft": _broken(_series(loss=(3.0, 1.0)), skipped_updates=2) + [{"step": STEPS, "eval_format_accuracy": 0.4}],
}
# what each trainer's broken rows must show, so that the flag check below reads the remedies that matter
EXPECTED = {"rl": {"reward_hacking", "eos_loss", "entropy_collapse", "kl_runaway", "nonfinite", "kind_lost"},
            "online_dpo": {"decline", "eos_loss", "no_updates", "nonfinite", "kind_lost"},
            "rft": {"decline", "eos_loss", "no_updates", "kind_lost"},
            "dpo": {"decline", "eos_loss", "nonfinite", "below_chance"}, "kto": {"decline", "eos_loss", "nonfinite"},
            "orpo": {"decline", "eos_loss", "below_chance"}, "rm": {"decline", "nonfinite", "below_chance"},
            "cpt": {"loss_still_falling", "nonfinite"}, "sft": {"sft_format_low", "nonfinite"}}


@pytest.mark.parametrize("trainer", sorted(ROWS))
def test_every_remedy_names_flags_of_the_runs_trainer(trainer):
    """QA: online DPO was told `--collapse_guard true`, `--stop_patience N` and
    `--missing_eos_penalty`, which `lmpo train online_dpo` refuses; a standalone SFT run
    `--sft.epochs`, which only `lmpo pipeline` takes."""
    found = diagnose(ROWS[trainer], trainer, group_size=4 if trainer == "rl" else None)
    assert EXPECTED[trainer] <= {f.code for f in found}
    fields = _fields(trainer)
    for finding in found:
        plain, dotted = _flags(finding.remedy)
        assert plain <= fields, f"{trainer} {finding.code}: {sorted(plain - fields)} in {finding.remedy!r}"
        assert not dotted or "`lmpo pipeline`" in finding.remedy, f"{trainer} {finding.code}: {finding.remedy!r}"


def test_a_broken_preference_or_reward_model_run_is_found():
    """QA: a DPO run whose held-out accuracy fell 60% → 0% and its format 95% → 5%, and a reward
    model whose held-out pairwise accuracy fell 40% → 20%, were "no problems found"."""
    for trainer in ("dpo", "kto", "orpo"):
        found = {f.code: f for f in diagnose(ROWS[trainer], trainer)}
        assert found["decline"].value.startswith("60.0% (best, step 0) → 0.0%")
        assert found["eos_loss"].value == "95.0% → 5.0%"
    rm = {f.code: f for f in diagnose(ROWS["rm"], "rm")}
    assert rm["decline"].value.startswith("40.0% (best, step 0) → 20.0%")
    assert rm["below_chance"].severity == "note" and rm["below_chance"].value == "20.0%"
    assert "eos_loss" not in rm
    healthy = _series(loss=(0.69, 0.3), accuracy=(0.6, 0.95)) + _evals((0.3, 0.5), fmt=(0.8, 0.9))
    assert [f.code for f in diagnose(healthy, "dpo")] == []


def test_one_completion_of_eight_is_no_eos_loss():
    """QA: a GRPO run of 8 steps × 8 completions was told `eos_loss` (format 12.5% → 0.0%): its
    first step against its last, one completion each way."""
    short = [{"step": i, "reward_mean": 0.0, "format_accuracy": f, "groups_sampled": 2}
             for i, f in enumerate((0.125, 0.25, 0.125, 0.125, 0.0, 0.25, 0.125, 0.0), 1)]
    assert "eos_loss" not in {f.code for f in diagnose(short, "rl", group_size=4)}
    assert "eos_loss" not in {f.code for f in diagnose(short, "rl")}  # completions unknown: too few steps
    long = [{"step": i, "reward_mean": 0.0, "groups_sampled": 2, "format_accuracy": 1.0 - 0.7 * (i - 1) / 39}
            for i in range(1, 41)]
    (eos,) = [f for f in diagnose(long, "rl", group_size=4) if f.code == "eos_loss"]
    assert eos.value == "97.3% → 32.7%"


def _stage(pipeline: Path, name: str, trainer: str, rows: list[dict], **config) -> None:
    (pipeline / name).mkdir(parents=True)
    (pipeline / name / "run.json").write_text(json.dumps({"trainer": trainer, "config": {"group_size": 4, **config}}))
    (pipeline / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_doctor_names_a_pipeline_stages_flags_as_the_pipeline_takes_them(tmp_path, capsys):
    """QA: `lmpo doctor PIPELINE_DIR` said `raise --group_size` of the GRPO stage, which `lmpo
    pipeline` refuses (its own [doctor] lines said --rl_stage.group_size)."""
    pipeline = tmp_path / "pipe"
    no_signal = [{"step": i, "reward_mean": 0.0, "accuracy": 0.0, "zero_var_frac": 1.0} for i in range(1, 11)]
    _stage(pipeline, "sft", "sft", [{"step": 5, "eval_format_accuracy": 0.4}])
    _stage(pipeline, "grpo", "rl", no_signal)
    (pipeline / "run.json").write_text(json.dumps({"trainer": "pipeline"}))
    assert main(["doctor", str(pipeline)]) == 0
    out = capsys.readouterr().out
    assert "raise --rl_stage.group_size" in out and "--group_size" not in out
    assert "more --sft.epochs or --sft.demonstrations" in out
    _stage(tmp_path, "sft", "sft", [{"step": 5, "eval_format_accuracy": 0.4}])
    assert main(["doctor", str(tmp_path / "sft")]) == 0  # a run of `lmpo train sft`: its flags
    assert "more --epochs or --demonstrations" in capsys.readouterr().out


def test_rft_that_accepted_nothing_is_told_how_keep_top_k_keeps_the_best():
    """QA: "keep the best with --keep_top_k N" kept nothing in a run that had --keep_top_k 1:
    keep_top_k picks among accepted samples, so it needs --accept_threshold -inf."""
    rows = [{"step": r, "reward_mean": 0.0, "acceptance_rate": 0.0, "kept": 0, "updates": 0} for r in (1, 2)]
    (found,) = [f for f in diagnose(rows, "rft") if f.code == "no_updates"]
    assert "--accept_threshold -inf --keep_top_k N" in found.remedy


def test_held_out_format_checks_weigh_the_problems_behind_each_evaluation(tmp_path, capsys):
    """A held-out format accuracy of 1/8 then 0/8 was `eos_loss` (12.5% → 0.0%), and an SFT run
    at 7/8 was `sft_format_low` (87.5% < 90%): one problem each, noise. The run's --eval_problems
    says how many problems each share counts; the findings name the counts."""
    grpo = [{"step": 0, "eval_format_accuracy": 0.125}, {"step": 1, "reward_mean": 0.0},
            {"step": 2, "reward_mean": 0.0, "eval_format_accuracy": 0.0}]
    _stage(tmp_path, "grpo", "rl", grpo, eval_problems=8)
    _stage(tmp_path, "sft", "sft", [{"step": 5, "eval_format_accuracy": 0.875}], eval_problems=8)
    assert main(["doctor", str(tmp_path / "grpo")]) == 0
    assert main(["doctor", str(tmp_path / "sft")]) == 0
    out = capsys.readouterr().out
    assert "eos_loss" not in out and "sft_format_low" not in out and out.count("no problems found") == 2
    fell = [dict(r, eval_format_accuracy=v) if "eval_format_accuracy" in r else r for r, v in zip(grpo, (0.75, 0, 0.0))]
    _stage(tmp_path, "grpo6", "rl", fell, eval_problems=8)
    (eos,) = [f for f in diagnose_run(tmp_path / "grpo6")["grpo6"] if f.code == "eos_loss"]
    assert eos.value == "75.0% (6/8) → 0.0% (0/8)" and "standard errors" in eos.threshold
    _stage(tmp_path, "sft5", "sft", [{"step": 5, "eval_format_accuracy": 0.5}], eval_problems=8)
    (low,) = diagnose_run(tmp_path / "sft5")["sft5"]
    assert low.code == "sft_format_low" and low.value == "50.0% (4/8)"
    # an --eval_prompts file of 8 rows under the default --eval_problems 500: 1/8 is no whole count of 500
    _stage(tmp_path, "short", "rl", grpo, eval_problems=500)
    assert "eos_loss" not in {f.code for f in diagnose_run(tmp_path / "short")["short"]}


def test_reward_hacking_weighs_the_problems_behind_each_evaluation(tmp_path):
    """A GRPO run whose reward rose while held-out accuracy went 20/40 → 17/40 was called
    `reward_hacking` (50.0% → 42.5%): three problems, within sampling noise. The run's
    --eval_problems says how many problems each share counts; a fall beyond noise is still
    found, with its counts."""
    def run(name: str, last: float) -> list:
        rows = [{"step": 0, "eval_accuracy": 0.5}] + _series(reward_mean=(0.3, 0.9), accuracy=(0.5, 0.5))
        rows[-1]["eval_accuracy"] = last
        _stage(tmp_path, name, "rl", rows, eval_problems=40)
        return [f for f in diagnose_run(tmp_path / name)[name] if f.code == "reward_hacking"]

    assert run("noise", 17 / 40) == []
    (found,) = run("hacked", 6 / 40)
    assert "held-out 50.0% (20/40) → 15.0% (6/40)" in found.value and "standard errors" in found.threshold


@pytest.mark.parametrize("trainer", ["sft", "rm", "dpo", "kto", "orpo"])
def test_a_run_that_ended_below_its_start_model_says_so(trainer, tmp_path):
    """A real `lmpo train sft --lr 0.05` from a CPT model: held-out 32/100 at step 0, 0/100 at the
    end; the doctor said only `sft_format_low` and told it to train more (--epochs). The stages
    evaluated only before and after training now compare the two, beyond sampling noise."""
    counts = {"heldout_pairs": 100} if trainer == "rm" else {"eval_problems": 100}

    def found(name: str, last: float) -> list:
        rows = [{"step": 0, "eval_accuracy": 0.32, "eval_format_accuracy": 1.0},
                {"step": 2, "loss": 1.0}, {"step": 2, "eval_accuracy": last, "eval_format_accuracy": 1.0}]
        _stage(tmp_path, name, trainer, rows, **counts)
        return [f for f in diagnose_run(tmp_path / name)[name] if f.code == "heldout_fell"]

    assert found("noise", 0.25) == []  # 32/100 → 25/100: within two standard errors
    (fell,) = found("fell", 0.0)
    assert fell.value == "32.0% (32/100) (step 0) → 0.0% (0/100) (step 2)" and "standard errors" in fell.threshold
    assert _flags(fell.remedy)[0] <= _fields(trainer) and "--lr" in fell.remedy


def test_sft_that_broke_a_well_formed_start_is_not_told_to_train_more(tmp_path):
    """The same run's `sft_format_low` said "more --epochs or --demonstrations" of a format the
    start model had at 100% and SFT took to 0%."""
    rows = [{"step": 0, "eval_accuracy": 0.32, "eval_format_accuracy": 1.0},
            {"step": 2, "eval_accuracy": 0.0, "eval_format_accuracy": 0.0}]
    _stage(tmp_path, "sft", "sft", rows, eval_problems=100)
    (low,) = [f for f in diagnose_run(tmp_path / "sft")["sft"] if f.code == "sft_format_low"]
    assert "the updates broke the format" in low.message and low.remedy.startswith("lower --lr")
    _stage(tmp_path, "sft2", "sft", [rows[1]], eval_problems=100)  # no start measured: as before
    (low,) = [f for f in diagnose_run(tmp_path / "sft2")["sft2"] if f.code == "sft_format_low"]
    assert low.remedy == "more --epochs or --demonstrations"


def test_online_dpo_pair_accuracy_is_not_read_as_sampled_accuracy():
    """Online DPO logs `accuracy` as its pairs' (the implicit reward ranks the chosen first), of one
    or a few pairs a round; without held-out evaluations the doctor said `decline: training accuracy
    (sampled) fell ... 100.0% → 0.0%` of it, and beside a held-out fall "training accuracy fell too"."""
    rounds = [{"step": i, "round": i, "reward_mean": 0.3, "pairs": 1, "accuracy": float(i <= 12)} for i in range(1, 25)]
    assert "decline" not in {f.code for f in diagnose(rounds, "online_dpo")}
    evals = [{"step": s, "eval_accuracy": 0.6 - 0.5 * s / 24} for s in range(0, 25, 4)]
    (decline,) = [f for f in diagnose(rounds + evals, "online_dpo") if f.code == "decline"]
    assert decline.metric == "eval_accuracy" and "training accuracy" not in decline.message


@pytest.mark.parametrize("trainer", sorted(ROWS))
def test_a_gradient_norm_that_exploded_under_a_finite_loss_is_a_finding(trainer):
    """A run whose loss stayed finite while grad_norm went from 3 to 1e6 (--grad_clip cut every
    update) was "no problems found"; a norm that wanders, or starts at 0 (RL steps without
    signal), is none."""
    routed = {"reward_mean": 0.5} if trainer in ("rl", "online_dpo", "rft") else {}
    rows = [{"step": i, "loss": 1.0, "lr": 1e-3, "grad_norm": 3.0 if i <= 30 else 1e6, **routed}
            for i in range(1, STEPS + 1)]
    (found,) = [f for f in diagnose(rows, trainer) if f.code == "grad_norm_explosion"]
    assert found.value.startswith("3 → 1e+06") and found.severity == "warning"
    plain, dotted = _flags(found.remedy)
    assert plain <= _fields(trainer) and not dotted
    wander = [dict(r, grad_norm=(0.0 if r["step"] <= 5 else 0.5 * (1 + r["step"] % 7))) for r in rows]
    assert "grad_norm_explosion" not in {f.code for f in diagnose(wander, trainer)}


@pytest.mark.parametrize("trainer", ["cpt", "sft"])
def test_a_supervised_loss_that_ended_above_its_start_is_a_finding(trainer):
    """A real `lmpo train sft --lr 1.0` run: loss 4.7 at step 1, 164 at step 13, 30 at the end;
    the doctor said only that the format was low."""
    rising = _series(loss=(4.7, 30.0))
    (found,) = [f for f in diagnose(rising, trainer) if f.code == "loss_rising"]
    assert found.value.startswith("6.") and found.severity == "warning"
    assert _flags(found.remedy)[0] <= _fields(trainer)
    assert "loss_rising" not in {f.code for f in diagnose(_series(loss=(4.7, 1.0)), trainer)}
