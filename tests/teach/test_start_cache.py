"""The cached SFT start is reused only when it was trained with the settings `lmpo pipeline` would
use now. Before, any `start.json` was reused, so after an upgrade of lmpo that changed the CPT or
SFT stage, `lmpo compare`, `lmpo factcheck` and `lmpo exercise` trained from a stale model."""

import json
from pathlib import Path

import lmpo.teach.start as start
from lmpo.trainers.result import StageResult


def _fake_stages(monkeypatch) -> list[str]:
    trained = []

    def fake(name):
        def train(cfg):
            trained.append(name)
            model = Path(cfg.out) / "model"
            model.mkdir(parents=True)
            return StageResult(name=name, seconds=1.0, model_dir=str(model), run_dir=cfg.out, accuracy=0.5)
        return train
    monkeypatch.setattr(start, "train_cpt", fake("cpt"))
    monkeypatch.setattr(start, "train_sft", fake("sft"))
    return trained


def test_the_start_is_trained_again_when_its_settings_changed(monkeypatch, tmp_path, capsys):
    trained = _fake_stages(monkeypatch)
    assert not start.is_cached(cache=tmp_path)
    first = start.sft_start(cache=tmp_path, threads=1)
    assert trained == ["cpt", "sft"] and start.is_cached(cache=tmp_path)
    assert start.sft_start(cache=tmp_path, threads=2) == first  # the thread count is not a setting
    assert trained == ["cpt", "sft"]

    done = Path(first.directory) / "start.json"
    saved = json.loads(done.read_text())
    assert saved["settings"]["cpt"]["model"] == "tiny" and "out" not in saved["settings"]["sft"]
    saved["settings"]["cpt"]["steps"] += 1  # as an earlier lmpo with another CPT budget wrote it
    done.write_text(json.dumps(saved))
    assert not start.is_cached(cache=tmp_path)
    capsys.readouterr()
    start.sft_start(cache=tmp_path)
    assert trained == ["cpt", "sft"] * 2
    assert "was trained with other settings (cpt.steps" in capsys.readouterr().out

    del saved["settings"]  # a start.json from before the settings were recorded
    done.write_text(json.dumps(saved))
    start.sft_start(cache=tmp_path)
    assert trained == ["cpt", "sft"] * 3
    assert "not recorded: trained by an earlier lmpo" in capsys.readouterr().out
