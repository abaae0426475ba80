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
    assert yours.steps and set(yours.steps) == set(reference.steps) and yours.steps[1]["loss"] is not None


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


def _fails_check(tmp_path, suffix: str) -> Path:
    """A grpo_advantages that the check refuses: the correct solution with `suffix` on its result."""
    text = (SOLUTIONS / "grpo_advantages_correct.py").read_text()
    *body, last = text.rstrip().splitlines()
    assert last.strip().startswith("return ")
    path = tmp_path / "mine.py"
    path.write_text("\n".join(body + [last + suffix]) + "\n")
    return path


def test_train_after_a_failed_check_says_why_training_broke_and_never_that_it_is_right(tmp_path, monkeypatch,
                                                                                     capsys):
    """A wrong shape passed the check's FAIL, then broke the trainer (a traceback from lmpo's
    advantages code); a wrong sign that happened to train alike in 2 steps was told "yours trains
    exactly like lmpo's"."""
    import lmpo.teach.exercise.train as train
    from lmpo.cli.main import main
    from lmpo.teach.exercise.train import RunFigures

    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch: value tensor of shape [64, 1] cannot be broadcast")

    monkeypatch.setattr(train, "train_exercise", broken)
    shape = _fails_check(tmp_path, ".unsqueeze(1)")
    assert main(["exercise", "train", str(shape), "--steps", "2", "--out", str(tmp_path / "runs")]) == 1
    out = capsys.readouterr().out
    assert "training with your function stopped: RuntimeError: shape mismatch" in out
    assert "(the check above says why: your result has the wrong shape" in out

    same = [RunFigures("yours", 0.3, 0.3, 1.0, "y"), RunFigures("lmpo grpo", 0.3, 0.3, 1.0, "l")]
    monkeypatch.setattr(train, "train_exercise", lambda *a, **k: same)
    assert main(["exercise", "train", str(_fails_check(tmp_path, " * -1")), "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "check: FAIL" in out and "yours trains exactly like lmpo's here" in out
    assert "your function failed the check above, so it is not lmpo's function whatever these figures show" in out


def _figures(label, after, rewards):
    from lmpo.teach.exercise.train import RunFigures

    steps = {s: {"reward_mean": r, "loss": 0.1 * s} for s, r in enumerate(rewards, 1)}
    return RunFigures(label, 0.3, after, 1.0, f"/runs/{label}", steps)


def test_same_final_accuracy_with_different_steps_is_not_called_the_same():
    from lmpo.teach.exercise.train import verdict

    yours, ref = _figures("yours", 0.5, [0.4, 0.45, 0.5]), _figures("lmpo", 0.5, [0.4, 0.6, 0.5])
    for lang in ("en", "zh"):
        text = verdict(yours, ref, lang=lang)
        assert "exactly like" not in text and "完全相同" not in text, text
        assert "reward_mean" in text and "0.45" in text and "0.6" in text, text
    assert "step 2" in verdict(yours, ref)


def test_same_run_to_float_tolerance_is_the_same():
    from lmpo.teach.exercise.train import verdict

    ref = _figures("lmpo", 0.5, [0.4, 0.6, 0.5])
    yours = _figures("yours", 0.5, [0.4 + 1e-9, 0.6, 0.5])
    assert "exactly like lmpo's" in verdict(yours, ref)
    assert "完全相同" in verdict(yours, ref, lang="zh")


@pytest.mark.parametrize("lang, hedge", [("en", "may be too few"), ("zh", "可能还不足以显现差异")])
def test_the_too_few_steps_hedge_only_where_the_runs_look_alike(tmp_path, monkeypatch, capsys, lang, hedge):
    """A wrong sign ended 28 points below lmpo's, and the note still said the difference had not shown yet
    (in Chinese as a fact: 差异尚未显现)."""
    import lmpo.teach.exercise.train as train
    from lmpo.cli.main import main
    from lmpo.teach.exercise.train import RunFigures

    wrong = _fails_check(tmp_path, " * -1")
    apart = [RunFigures("yours", 0.31, 0.20, 1.0, "y"), RunFigures("lmpo grpo", 0.31, 0.48, 1.0, "l")]
    alike = [RunFigures("yours", 0.31, 0.46, 1.0, "y"), RunFigures("lmpo grpo", 0.31, 0.48, 1.0, "l")]
    for runs, shown in ((apart, False), (alike, True)):
        monkeypatch.setattr(train, "train_exercise", lambda *a, runs=runs, **k: runs)
        assert main(["exercise", "train", str(wrong), "--steps", "20", "--lang", lang]) == 0
        out = capsys.readouterr().out
        assert ("20" in out and hedge in out) == shown, out
        assert "尚未显现" not in out
