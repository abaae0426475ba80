"""`lmpo presets --show NAME [--task T]`: every RL option as the preset resolves it."""

from __future__ import annotations

import dataclasses
import re

from lmpo.cli.main import main
from lmpo.trainers.presets import RL_PRESETS
from lmpo.trainers.rl_config import RLConfig


def _sections(text: str) -> dict[str, dict[str, str]]:
    """Section title → option → the printed value."""
    sections: dict[str, dict[str, str]] = {}
    current = None
    for line in text.splitlines()[1:]:
        if line.endswith(":") and not line.startswith(" "):
            current = sections.setdefault(line.split(" (")[0].rstrip(":"), {})
        elif line.strip():
            option, value = re.match(r"\s+(\w+)\s+(.*)", line).groups()
            current[option] = value
    return sections


def test_every_option_once_with_the_presets_own_marked(capsys):
    assert main(["presets", "--show", "dapo"]) == 0
    sections = _sections(capsys.readouterr().out)
    assert list(sections) == ["set by the preset dapo", "defaults"]
    shown = [o for options in sections.values() for o in options]
    assert sorted(shown) == sorted(f.name for f in dataclasses.fields(RLConfig))  # each option exactly once
    preset = sections["set by the preset dapo"]
    assert set(preset) == set(RL_PRESETS["dapo"].settings)
    assert preset["dynamic_sampling"] == "True  (default False)" and preset["clip_eps_high"].startswith("0.28")
    assert sections["defaults"]["lr"] == repr(RLConfig().lr)


def test_a_tasks_suggested_settings_sit_under_the_preset(capsys):
    assert main(["presets", "--show", "grpo", "--task", "vault"]) == 0
    sections = _sections(capsys.readouterr().out)
    task = sections["suggested by the task vault"]
    assert task["max_new_tokens"] == "48  (default 12)" and task["task"].startswith("'vault'")
    assert "max_new_tokens" not in sections["defaults"]


def test_an_unknown_preset_or_task_is_an_error_listing_the_choices(capsys):
    assert main(["presets", "--show", "grpoo"]) == 2
    err = capsys.readouterr().err
    assert "unknown RL preset 'grpoo'" in err and all(name in err for name in RL_PRESETS)
    assert main(["presets", "--show", "grpo", "--task", "no_such_task"]) == 2
    assert "no_such_task" in capsys.readouterr().err
