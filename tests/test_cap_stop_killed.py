"""A run killed right after the checkpoint it wrote at its wall-time cap (before its model and
result.json) and resumed with the same options ends where the uninterrupted capped run did: at
that step, not one step later. The clock is test_max_minutes_resume's: one second an update."""

from __future__ import annotations

import shutil

import pytest

import lmpo.trainers.offline as offline
import lmpo.trainers.online_dpo as online_dpo
from lmpo.cli.main import main
from tests.test_cap_continue import DPO, _step_rows
from tests.test_max_minutes_resume import CAP, _same_model, _stopped, clock  # noqa: F401 (a fixture)


class Killed(BaseException):
    """The process dying at a fault point (SIGKILL would end pytest too)."""


ONLINE = ["train", "online_dpo", "--rounds", "8", "--prompts_per_round", "8", "--samples_per_prompt", "4",
          "--max_new_tokens", "48", "--batch_size", "2", "--lr", "1e-3", "--rewards", "reward_fns:count_sevens=1.0",
          "--reward_timeout", "0", "--eval_problems", "0", "--save_every", "3", "--threads", "1"]


@pytest.mark.parametrize("trainer", ["dpo", "online_dpo"])
def test_a_run_killed_after_its_cap_checkpoint_ends_at_that_step(trainer, start_model, clock, tmp_path,  # noqa: F811
                                                                 monkeypatch, capsys):
    module, args = (offline, DPO[2:]) if trainer == "dpo" else (online_dpo, ONLINE[2:])
    argv = ["train", trainer, "--model", start_model, *args, "--max_minutes", CAP]
    capped, cut = tmp_path / "capped", tmp_path / "cut"
    assert main([*argv, "--out", str(capped)]) == 0
    stop = _stopped(capped)[0]["step"]
    real = module.fault_point

    def killed_there(name, step):
        if (name, step) == ("step_end", stop):
            raise Killed
        real(name, step)

    monkeypatch.setattr(module, "fault_point", killed_there)
    with pytest.raises(Killed):
        main([*argv, "--out", str(cut)])
    monkeypatch.setattr(module, "fault_point", real)
    assert (cut / "checkpoints" / f"step_{stop:06d}").is_dir() and not (cut / "result.json").exists()
    capsys.readouterr()
    assert main(["train", trainer, "--resume", str(cut)]) == 0
    assert "minutes trained before this resume; --max_minutes 0.0583333 counts them, so no time is left: it ends " \
           "at this checkpoint, where it stopped at its cap" in capsys.readouterr().out
    assert _same_model(capped, cut) and [r["step"] for r in _stopped(cut)] == [stop]
    if trainer == "dpo":
        assert _step_rows(cut) == _step_rows(capped)


def test_a_capped_run_whose_checkpoint_is_gone_is_refused_saying_so(start_model, clock, tmp_path, capsys):  # noqa: F811
    capped = tmp_path / "capped"
    assert main(["train", "dpo", "--model", start_model, *DPO[2:], "--max_minutes", CAP, "--out", str(capped)]) == 0
    shutil.rmtree(capped / "checkpoints" / "step_000004")
    capsys.readouterr()
    assert main(["train", "dpo", "--resume", str(capped), "--max_minutes", "0"]) == 2
    err = capsys.readouterr().err
    assert f"its checkpoint of that step is no longer in {capped / 'checkpoints'}, so it cannot go on" in err
    assert "--save_every 0" not in err
