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
