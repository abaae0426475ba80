"""`lmpo exercise train`: the user's function is the one the stage runs, and the registry is left clean."""

from pathlib import Path

import pytest

from lmpo.algos import ADVANTAGES, PREFERENCE_LOSSES, TOKEN_ADVANTAGES
from lmpo.teach.exercise import EXERCISES
from lmpo.teach.exercise.check import user_function
from lmpo.teach.exercise.train import TrainOptions, train_exercise

SOLUTIONS = Path(__file__).parent / "exercise_solutions"


def _counted(name: str):
    fn = user_function(SOLUTIONS / f"{name}_correct.py", EXERCISES[name])
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)

    return counted, calls


def _tiny(tmp_path, **kw):
    # a fresh preset model instead of the SFT checkpoint: this test is about the plumbing
    return TrainOptions(steps=1, eval_problems=2, out=str(tmp_path), threads=1, **kw)


@pytest.mark.parametrize("name, registry", [("grpo_advantages", ADVANTAGES), ("dpo_loss", PREFERENCE_LOSSES)])
def test_train_runs_the_users_function_then_the_reference(tmp_path, name, registry):
    before = registry.names()
    fn, calls = _counted(name)
    yours, reference = train_exercise(EXERCISES[name], fn, _tiny(tmp_path), model_dir="tiny", say=lambda s: None)
    assert calls, "the user's function was never called by the stage"
    assert registry.names() == before
    assert yours.run_dir.endswith("yours") and reference.run_dir.endswith("lmpo")
    for run in (yours, reference):
        assert 0.0 <= run.before <= 1.0 and 0.0 <= run.after <= 1.0


def test_gae_runs_under_its_own_name_and_is_restored(tmp_path):
    reference = TOKEN_ADVANTAGES.get("gae")
    fn, calls = _counted("gae")
    train_exercise(EXERCISES["gae"], fn, _tiny(tmp_path), model_dir="tiny", say=lambda s: None)
    assert calls and TOKEN_ADVANTAGES.get("gae") is reference


def test_an_error_in_the_users_function_leaves_the_registry_clean(tmp_path):
    before = ADVANTAGES.names()

    def broken(rewards, group_ids):
        raise ZeroDivisionError("mine")

    with pytest.raises(ZeroDivisionError, match="mine"):
        train_exercise(EXERCISES["grpo_advantages"], broken, _tiny(tmp_path), model_dir="tiny", say=lambda s: None)
    assert ADVANTAGES.names() == before


def test_train_options_are_validated(tmp_path):
    with pytest.raises(ValueError, match="--steps"):
        TrainOptions(steps=0).validate()


@pytest.mark.slow
def test_train_end_to_end_from_the_sft_checkpoint(tmp_path, capsys):
    """A correct GRPO-advantage solution learns, as lmpo's own does, from the SFT checkpoint."""
    from lmpo.cli.main import main

    code = main(["exercise", "train", str(SOLUTIONS / "grpo_advantages_correct.py"), "--steps", "40",
                 "--out", str(tmp_path), "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "check: pass" in out and "lmpo grpo" in out
    import json

    def accuracy(run: str, step: int) -> float:
        rows = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return [r["eval_accuracy"] for r in rows if r.get("step") == step and "eval_accuracy" in r][0]

    assert accuracy("yours", 40) > accuracy("yours", 0) + 0.05
    assert accuracy("lmpo", 40) > accuracy("lmpo", 0) + 0.05
