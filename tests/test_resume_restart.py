"""`--resume` of a run killed before its first checkpoint: nothing it trained is kept, so it starts
over as the run now asked for (a longer one too, whatever its schedule), and its run directory reads
as that one run."""

from __future__ import annotations

import json

from lmpo.cli.main import main
from tests.test_length_extension import SFT
from tests.test_max_minutes_resume import _same_model
from tests.test_resume import _run, launcher  # noqa: F401 (a fixture)
from tests.test_steps_extension import _rows


def test_a_cosine_run_killed_before_its_first_checkpoint_goes_on_with_more_epochs(launcher, start_model,  # noqa: F811
                                                                                 tmp_path):
    argv = [*SFT, "--model", start_model]  # the default cosine schedule
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main([*argv, "--epochs", "3", "--out", str(full)]) == 0
    assert _run(launcher, [*argv, "--epochs", "1", "--out", str(cut)], cut, kill="step_end:1") == -9
    assert not (cut / "checkpoints").exists() or not any((cut / "checkpoints").iterdir())
    # started over as the 3-epoch run, killed after its checkpoint of step 4, resumed without --epochs
    assert _run(launcher, ["train", "sft", "--resume", str(cut), "--epochs", "3"], cut, kill="step_end:5") == -9
    assert json.loads((cut / "run.json").read_text())["config"]["epochs"] == 3
    assert main(["train", "sft", "--resume", str(cut)]) == 0
    assert _same_model(full, cut) and _rows(cut) == _rows(full)
