"""`lmpo factcheck --only` and `lmpo explain` refuse what they once resolved in silence: an
`--only` naming no claim ran all twenty (minutes of training), a claim named twice was accepted,
and `explain grpo --all` or `explain --list --all` dropped one of the two requests."""

from __future__ import annotations

import pytest

from lmpo.cli.main import main
from lmpo.teach.factcheck import select


def _no_factcheck_runs(monkeypatch) -> None:
    def run_factcheck(*args, **kwargs):
        raise AssertionError("the claims ran")

    monkeypatch.setattr("lmpo.teach.factcheck.run_factcheck", run_factcheck)


@pytest.mark.parametrize("only", ["", ",", " , "])
def test_factcheck_only_naming_no_claim_is_refused(only, monkeypatch, capsys, tmp_path):
    _no_factcheck_runs(monkeypatch)
    assert main(["factcheck", "--only", only, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--only {only!r} names no claim; give claim names (see --list)" in err


def test_factcheck_only_naming_a_claim_twice_is_refused(capsys, tmp_path):
    name = select(fast=True)[0].name  # an exact computation: seconds, were it run
    assert main(["factcheck", "--only", f"{name},{name}", "--fast", "--threads", "1", "--out", str(tmp_path)]) == 2
    assert f"names {name} twice; name each claim once" in capsys.readouterr().err


def test_select_from_the_python_api():
    assert len(select("")) == len(select()) > 1  # no --only: every claim
    with pytest.raises(ValueError, match="names no claim"):
        select(",")


@pytest.mark.parametrize(("argv", "said"), [
    (["grpo", "--all"], "METHOD (grpo) and --all ask for different things"),
    (["--list", "--all"], "--list and --all ask for different things"),
    (["grpo", "--list"], "METHOD (grpo) and --list ask for different things"),
])
def test_explain_refuses_conflicting_requests(argv, said, capsys, tmp_path):
    assert main(["explain", *argv, "--out", str(tmp_path / "pages")]) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "pages").exists()


@pytest.mark.parametrize(("argv", "said"), [
    (["explain", "grpoo"], "unknown method 'grpoo' (did you mean 'grpo'?)"),
    (["explain", "GRPO"], "unknown method 'GRPO' (did you mean 'grpo'?)"),
    (["explain", "dr-grpo"], "unknown method 'dr-grpo' (did you mean 'dr_grpo'?)"),
    (["exercise", "start", "grpo_advantage"], "unknown exercise 'grpo_advantage' (did you mean 'grpo_advantages'?)"),
    (["factcheck", "--only", "kl_estimator"], "unknown claim(s) kl_estimator (did you mean 'kl_estimators'?)"),
    (["compare", "--methods", "grpo,dpoo"], "unknown method 'dpoo' (did you mean 'dpo'?)"),
])
def test_an_unknown_name_gets_the_nearest_known_one(argv, said, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)  # nothing is written, were a name accepted
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err


def test_a_name_near_nothing_gets_no_suggestion(capsys):
    assert main(["explain", "zzzz"]) == 2
    assert "did you mean" not in capsys.readouterr().err


def test_an_unknown_exercise_in_a_files_header_gets_a_suggestion(tmp_path):
    from lmpo.teach.exercise import EXERCISES, ExerciseFileError, exercise_of_file

    path = tmp_path / "mine.py"
    path.write_text("# lmpo exercise: ppo_clip\ndef ppo_clip_loss(): ...\n")
    with pytest.raises(ExerciseFileError, match="did you mean 'ppo_clip_loss'"):
        exercise_of_file(path, EXERCISES)


def test_factcheck_list_lists_what_only_and_fast_select(capsys):
    """`lmpo factcheck --list --only kl_estimator` listed all twenty claims: the misspelt name (which
    a run refuses) and --only/--fast were ignored in silence."""
    assert main(["factcheck", "--list", "--only", "kl_estimator"]) == 2
    assert "unknown claim(s) kl_estimator (did you mean 'kl_estimators'?)" in capsys.readouterr().err
    assert main(["factcheck", "--list", "--only", "kl_estimators,grpo_no_critic"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["grpo_no_critic", "kl_estimators"]
    assert main(["factcheck", "--list", "--only", "kl_estimators,grpo_no_critic", "--fast", "--lang", "zh"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["kl_estimators"]
    assert main(["factcheck", "--list", "--only", "grpo_no_critic", "--fast"]) == 2
    assert "no claim selected: --fast leaves out grpo_no_critic" in capsys.readouterr().err
    assert main(["factcheck", "--list"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(select())


def test_factcheck_names_the_files_it_wrote_in_the_current_directory(tmp_path, monkeypatch, capsys):
    """`lmpo factcheck --fast --out ''` wrote ./factcheck.html and said `report: /factcheck.html`."""
    monkeypatch.chdir(tmp_path)
    name = select(fast=True)[0].name
    assert main(["factcheck", "--fast", "--only", name, "--threads", "1", "--out", ""]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "report: factcheck.html  data: factcheck.json"
    assert (tmp_path / "factcheck.html").is_file()
