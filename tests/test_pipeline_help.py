"""`lmpo pipeline --help` shows the values the default pipeline runs with (`resolve_pipeline`),
not the stage dataclasses' own defaults: it said `--rl_stage.beta` 0.0 while the grpo preset runs
0.04, `--cpt.stop_patience` 0 while the adaptive budgets run 3. The help says which layer set each
and that another --task or --rl changes them."""

from __future__ import annotations

import re

import pytest

from lmpo.cli.main import main
from lmpo.trainers.pipeline import PipelineConfig, flat_options, resolve_pipeline


@pytest.fixture(scope="module")
def help_text() -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["pipeline", "--help"])
    return out.getvalue()


def _shown_defaults(text: str) -> dict[str, str]:
    shown = {}
    for block in re.split(r"\n  (?=--)", text.split("\noptions:", 1)[1]):
        name = re.match(r"--([a-z_.]+)", block)
        default = re.search(r"\(default: (.*?)(?:, set by [^)]*)?\)$", " ".join(block.split()))
        if name and default:
            shown[name.group(1)] = default.group(1)
    return shown


def test_every_default_shown_is_the_one_the_pipeline_runs_with(help_text):
    runs = flat_options(resolve_pipeline(PipelineConfig()))
    shown = _shown_defaults(help_text)
    assert len(shown) > 100
    # compared without spaces: argparse wraps a long value at a hyphen ('all- linear')
    wrong = {name: (value, repr(runs[name])) for name, value in shown.items()
             if value.replace(" ", "") != repr(runs[name]).replace(" ", "")}
    assert not wrong, wrong


def test_the_help_names_the_layer_that_set_a_default(help_text):
    flat = " ".join(help_text.split())
    assert "(default: 0.04, set by the --rl grpo preset)" in flat
    assert "(default: 3, set by the adaptive budgets)" in flat
    assert "--task sort_digits, --rl grpo, --adaptive true" in flat
    assert "the option's own default < the adaptive budgets < the task's suggested settings < the --rl preset" in flat
    assert "lmpo presets --show NAME --task TASK" in flat
