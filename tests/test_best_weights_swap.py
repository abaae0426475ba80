"""`BestWeights.keep` replaces `RUN_DIR/best/` with the newer best model. Before, it deleted best/
and then renamed the new copy into place: a kill between the two left the run with no best/, and
the resumed run ended with its last weights as the stage's model though it said it kept the best."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from lmpo.trainers.run_dir import tidy_interrupted_swaps
from lmpo.trainers.stopping import BestWeights


class Killed(BaseException):
    """Where the process would die (a BaseException: nothing in `keep` catches it)."""


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _kill_when_renamed_to(target: Path, monkeypatch) -> None:
    rename = Path.rename

    def dying(self, to):
        if Path(to) == target:
            raise Killed(f"killed before {self} became {target}")
        return rename(self, to)

    monkeypatch.setattr(Path, "rename", dying)


@pytest.mark.parametrize("kill", ["new_into_place", "while_writing"])
def test_a_kill_while_a_better_model_is_kept_leaves_the_earlier_best(kill, tiny_llama, char_tokenizer, tmp_path,
                                                                   monkeypatch):
    model, run = copy.deepcopy(tiny_llama), tmp_path / "run"
    run.mkdir()
    best = BestWeights(run / "best")
    best.keep(model, char_tokenizer)
    first = _weights(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    with monkeypatch.context() as m:
        if kill == "new_into_place":
            _kill_when_renamed_to(run / "best", m)
        else:  # dies inside save_model, the new copy half written
            m.setattr("lmpo.trainers.stopping.save_model", lambda *a, **k: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            best.keep(model, char_tokenizer)
    tidy_interrupted_swaps(run)  # what the resumed run's start does (open_run_dir)
    assert sorted(p.name for p in run.iterdir()) == ["best"]
    restored = copy.deepcopy(tiny_llama)
    assert best.restore(restored)
    assert all(torch.equal(first[k], v) for k, v in restored.state_dict().items())
