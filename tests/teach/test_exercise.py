"""`lmpo exercise`: correct solutions pass, planted mistakes fail with their symptom named."""

from pathlib import Path

import pytest
import torch

from lmpo.algos import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, PREFERENCE_LOSSES, TOKEN_ADVANTAGES
from lmpo.algos import bradley_terry_loss
from lmpo.cli.main import main
from lmpo.teach.exercise import (EXERCISES, ExerciseFileError, check_file, check_function, exercise_of_file,
                                 plugged, starter_text, write_starter)

SOLUTIONS = Path(__file__).parent / "exercise_solutions"

# planted mistake file -> (the probe that must catch it, words its symptom must contain)
PLANTED = {
    "grpo_advantages_population_std": ("worked_example", ["N instead of N-1", "population vs sample", "1.155×"]),
    "grpo_advantages_wrong_sign": ("worked_example", ["wrong sign"]),
    "grpo_advantages_no_eps": ("float64", ["you forgot eps", "(std + eps)"]),
    "grpo_advantages_eps_on_variance": ("float64", ["eps is added to the variance, not to the std"]),
    "grpo_advantages_naive_equal_group": ("equal_groups", ["advantages of an all-equal group are not zero"]),
    "grpo_advantages_contiguous_groups": ("unsorted_ids", ["group ids may be any integers in any order"]),
    "grpo_advantages_batch_std": ("unsorted_ids", ["not per group"]),
    "grpo_advantages_no_detach": ("constants", ["gradient flows through the baseline", "stop-gradient"]),
    "rloo_advantages_includes_self": ("worked_example", ["baseline includes the completion itself", "0.75×"]),
    "rloo_advantages_single_member": ("single_member", ["one completion", "G−1 = 0"]),
    "ppo_clip_loss_wrong_side": ("clip_grid", ["clip is applied on the wrong side for negative advantages",
                                               "at ratio 0.5, A=-1"]),
    "ppo_clip_loss_wrong_sign": ("clip_grid", ["wrong sign"]),
    "ppo_clip_loss_no_mask": ("padding", ["padding tokens change the loss", "mask is not applied"]),
    "ppo_clip_loss_mask_multiply": ("inf_padding", ["NaN at padding", "torch.where"]),
    "ppo_clip_loss_where_output": ("inf_padding_gradient", ["torch.where on the loss does not stop",
                                                            "mask the log-ratio", "before exp"]),
    "ppo_clip_loss_no_detach": ("gradient", ["gradient flows through the old log-probs", "detach"]),
    "aggregation_token_mean": ("ragged", ["token-mean vs sequence-mean", "loss changes when one sequence gets longer"]),
    "aggregation_unmasked": ("ragged", ["padding tokens change the loss"]),
    "aggregation_empty_rows": ("empty_row", ["all-padding row counts as a sequence"]),
    "gae_bootstrap_padding": ("padding", ["bootstrap from the value at the padding position"]),
    "gae_discounted_returns": ("one_row", ["discounted sum of rewards", "A + V"]),
    "gae_walks_tool_tokens": ("tool_tokens", ["treated as time steps", "skipping mask-0 positions"]),
    "k3_flipped": ("values", ["κ has the wrong sign"]),
    "k3_unclamped": ("extreme", ["no clamp on κ"]),
    "dpo_loss_swapped": ("pairs", ["swapped", "wrong sign of h"]),
    "dpo_loss_no_detach": ("gradient", ["gradient flows through the reference log-probs", "stop-gradient"]),
    "dpo_loss_log_sigmoid": ("extreme", ["overflows", "logsigmoid"]),
    "bradley_terry_loss_swapped": ("pairs", ["swapped"]),
    "bradley_terry_loss_margin_added": ("margin", ["margin is added instead of subtracted"]),
    "ppo_clip_loss_mutates_mask": ("clip_grid", ["changes its input `mask` in place"]),
    "grpo_advantages_inplace_ids": ("unsorted_ids", ["changes its input `group_ids` in place"]),
    "grpo_advantages_inplace_result": ("worked_example", ["changes its input `rewards` in place"]),
    "gae_off_by_one": ("one_row", ["off by one token", "NEXT loss token"]),
    "gae_gamma_lambda_swapped": ("one_row", ["γ and λ are swapped in δ", "λ·V_{t+1}"]),
    "aggregation_wrong_axis": ("ragged", ["averaged over the wrong axis", "over the batch (dim 0)"]),
    "rloo_advantages_whole_sum": ("worked_example", ["sum of the WHOLE group", "(Σ_j R_j − R_i) / (G−1)"]),
    "dpo_loss_ref_added": ("pairs", ["added instead of subtracted", "log-RATIO"]),
}


def _check(stem: str):
    path = SOLUTIONS / f"{stem}.py"
    return check_file(path, EXERCISES[exercise_of_file(path, EXERCISES)])


@pytest.mark.parametrize("name", list(EXERCISES))
def test_correct_solution_passes(name):
    report = _check(f"{name}_correct")
    assert report.ok, report.text()
    assert "pass:" in report.text()


@pytest.mark.parametrize("stem", list(PLANTED))
def test_planted_mistake_fails_naming_its_symptom(stem):
    probe, words = PLANTED[stem]
    report = _check(stem)
    assert not report.ok and report.error is None, report.text()
    assert report.mismatch.probe == probe, report.text()
    for word in words:
        assert word in report.mismatch.symptom, report.text()
    text = report.text()
    assert "expected:" in text and "got:" in text and "input:" in text


def test_every_exercise_has_a_planted_mistake_and_its_own_file():
    planted = {exercise_of_file(SOLUTIONS / f"{stem}.py", EXERCISES) for stem in PLANTED}
    assert planted == set(EXERCISES)
    assert len({words[0] for _, words in PLANTED.values()}) >= 6


def test_the_references_are_the_library_functions():
    refs = {"grpo_advantages": ADVANTAGES.get("grpo"), "rloo_advantages": ADVANTAGES.get("rloo"),
            "ppo_clip_loss": POLICY_LOSSES.get("ppo_clip"), "aggregation": AGGREGATIONS.get("seq_mean_token_mean"),
            "gae": TOKEN_ADVANTAGES.get("gae"), "k3": KL_ESTIMATORS.get("k3"), "dpo_loss": PREFERENCE_LOSSES.get("dpo"),
            "bradley_terry_loss": bradley_terry_loss}
    assert {name: ex.reference for name, ex in EXERCISES.items()} == refs


@pytest.mark.parametrize("name", list(EXERCISES))
def test_the_reference_passes_its_own_probes(name):
    exercise = EXERCISES[name]
    assert check_function(exercise.reference, exercise, "reference").ok


def test_the_population_std_mistake_matches_the_worked_example():
    # ALGORITHMS.md: sample std gives 1.17833, population std 1.36062 for the first reward
    report = _check("grpo_advantages_population_std")
    assert "1.1783" in report.mismatch.expected and "1.3606" in report.mismatch.got


def test_user_exception_is_reported_with_its_line(capsys):
    assert main(["exercise", "check", str(SOLUTIONS / "grpo_advantages_raises.py")]) == 1
    out = capsys.readouterr().out
    assert "IndexError" in out and "grpo_advantages_raises.py:8: return centered[:, 0]" in out


def test_syntax_error_is_reported_not_raised(tmp_path, capsys):
    bad = tmp_path / "k3.py"
    bad.write_text("# lmpo exercise: k3\ndef k3(logprobs, ref_logprobs):\n    return (\n")
    assert main(["exercise", "check", str(bad)]) == 1
    assert "SyntaxError" in capsys.readouterr().out


def test_cli_exit_codes(capsys):
    assert main(["exercise", "check", str(SOLUTIONS / "k3_correct.py")]) == 0
    assert main(["exercise", "check", str(SOLUTIONS / "k3_flipped.py")]) == 1
    out = capsys.readouterr().out
    assert "pass:" in out and "FAIL  values" in out


def test_list_names_every_exercise(capsys):
    assert main(["exercise", "list"]) == 0
    out = capsys.readouterr().out
    for name in EXERCISES:
        assert name in out


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("name", list(EXERCISES))
def test_starter_is_python_with_signature_formula_and_todo(name, lang):
    exercise = EXERCISES[name]
    text = starter_text(exercise, lang)
    compile(text, f"{name}.py", "exec")
    assert exercise.signature in text and "raise NotImplementedError" in text
    assert f"# lmpo exercise: {name}" in text
    assert "[B" in text or "[N]" in text  # the tensor shapes
    if lang == "zh":
        assert any("\u4e00" <= ch <= "\u9fff" for ch in text)


def test_start_then_check_says_not_implemented_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "mine.py"
    assert main(["exercise", "start", "ppo_clip_loss", "--out", str(out), "--lang", "zh"]) == 0
    assert main(["exercise", "check", str(out)]) == 1
    assert "尚未实现" in capsys.readouterr().out  # a starter written in Chinese is checked in Chinese
    assert main(["exercise", "check", str(out), "--lang", "en"]) == 1
    assert "not implemented yet" in capsys.readouterr().out
    out.write_text("# my work\n")
    assert main(["exercise", "start", "ppo_clip_loss", "--out", str(out)]) == 2
    assert out.read_text() == "# my work\n"
    assert "--force" in capsys.readouterr().err
    assert main(["exercise", "start", "ppo_clip_loss", "--out", str(out), "--force"]) == 0
    assert "def ppo_clip_loss(" in out.read_text()


def test_write_starter_refuses_existing_file(tmp_path):
    path = tmp_path / "g.py"
    path.write_text("x = 1\n")
    with pytest.raises(FileExistsError):
        write_starter(EXERCISES["gae"], path)


def test_which_exercise_a_file_is(tmp_path):
    plain = tmp_path / "a.py"
    plain.write_text("def rloo_advantages(rewards, group_ids):\n    return rewards\n")
    assert exercise_of_file(plain, EXERCISES) == "rloo_advantages"
    both = tmp_path / "b.py"
    both.write_text("def k3(a, b):\n    pass\n\ndef gae(r, m, *, values):\n    pass\n")
    with pytest.raises(ExerciseFileError, match="--name"):
        exercise_of_file(both, EXERCISES)


def test_plugged_leaves_the_registry_as_it_was():
    before = ADVANTAGES.names()
    reference = TOKEN_ADVANTAGES.get("gae")
    with plugged(ADVANTAGES, lambda rewards, group_ids: rewards) as name:
        assert name in ADVANTAGES and name not in before
    assert ADVANTAGES.names() == before
    with pytest.raises(RuntimeError):
        with plugged(TOKEN_ADVANTAGES, lambda *a, **k: None, "gae"):
            assert TOKEN_ADVANTAGES.get("gae") is not reference
            raise RuntimeError("boom")
    assert TOKEN_ADVANTAGES.get("gae") is reference


def test_ppo_wrapper_gives_the_registry_convention():
    from lmpo.teach.exercise.ppo import wrap_policy_loss

    fn = lambda lp, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.2: (lp - old) * adv * mask  # noqa: E731
    logprobs = torch.tensor([[0.0, -2.0]])
    loss, indicators = wrap_policy_loss(fn)(logprobs, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))
    assert loss.shape == (1, 2) and indicators["clipped"].tolist() == [[0.0, 0.0]]
    _, ind = wrap_policy_loss(fn)(torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))
    assert ind["clipped"].tolist() == [[1.0, 0.0]]  # ratio e > 1.2 with A > 0: the clipped term wins


def test_train_takes_eval_problems_with_an_underscore_as_every_other_flag_and_the_old_hyphen():
    from lmpo.cli.main import make_parser
    for flag in ("--eval_problems", "--eval-problems"):
        args = make_parser().parse_args(["exercise", "train", "f.py", flag, "7"])
        assert args.eval_problems == 7


def test_check_of_a_directory_says_it_is_one(tmp_path, capsys):
    assert main(["exercise", "check", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a directory" in err and "no such file" not in err
    with pytest.raises(ExerciseFileError, match="is a directory"):
        check_file(tmp_path, EXERCISES["gae"])


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_grpo_starter_worked_example_is_what_check_prints(lang):
    # the starter quoted ALGORITHMS.md's values without eps (−0.55816, −1.05430) beside "eps = 1e-6"
    from lmpo.teach.exercise.core import fmt

    text = starter_text(EXERCISES["grpo_advantages"], lang)
    advantages = ADVANTAGES.get("grpo")(torch.tensor([0.9, 0.6, 0.2, 0.0]), torch.tensor([0, 0, 0, 0]))
    printed = fmt(advantages).strip("[]").replace("-", "−")  # as check's expected: line, in the starter's minus sign
    assert "0.0 →\n    " + printed in text


def test_the_float64_probe_shows_its_rewards_at_full_precision():
    """Shown with 5 digits, 1 ± 1e-9 read as four equal rewards with a nonzero expected result."""
    report = _check("grpo_advantages_no_eps")
    assert "rewards=[1.000000001, 1, 0.999999999, 1]" in report.mismatch.inputs
