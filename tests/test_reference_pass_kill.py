"""A DPO run SIGKILLed in its reference log-prob pass (the OOM killer, a lost node: no handler
runs). Before, only SIGTERM, Ctrl-C and the cap saved the pass so far, so `--resume` scored every
batch again; now the pass is saved as it goes, and the resumed run reads it and ends as the
uninterrupted one, bit for bit."""

from __future__ import annotations

from lmpo.cli.main import main
from tests.test_length_extension import DPO
from tests.test_max_minutes_resume import _same_model
from tests.test_resume import _run, launcher  # noqa: F401 (a fixture)
from tests.test_steps_extension import _rows


def test_a_dpo_run_killed_in_its_reference_pass_keeps_the_batches_scored(launcher, start_model, tmp_path,  # noqa: F811
                                                                          capsys):
    argv = ["train", "dpo", "--model", start_model, *DPO, "--epochs", "2"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main([*argv, "--out", str(full)]) == 0
    assert _run(launcher, [*argv, "--out", str(cut)], cut, kill="reference_batch:2") == -9
    capsys.readouterr()
    assert main(["train", "dpo", "--resume", str(cut)]) == 0
    said = capsys.readouterr().out
    assert "reference log-probs of 1 of 6 batches read from" in said or \
        "reference log-probs of 2 of 6 batches read from" in said, said
    assert _same_model(full, cut) and _rows(cut) == _rows(full)
