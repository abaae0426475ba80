"""Agent trajectories: reading, terminal viewer, `lmpo trajectories`, and the report."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console
from rich.style import Style

from lmpo.reports import write_report
from lmpo.reports.panels import PANELS, panels_for, termination_panel
from lmpo.reports.trajectories import (
    STYLES, find_trajectories, html_section, read_trajectories, render_terminal,
)

OLD_RL_PLOTS = ["reward", "accuracy", "kl", "entropy", "length", "zero_var",
                "optim", "phase_time", "loss"]


def traj(step: int, phase: str = "train", index: int = 0, correct: bool | None = True,
         env: str = "31415", **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "step": step, "phase": phase, "index": index, "prompt": "<|user|>vault K=4821?",
        "answer": "11345", "reward": None if correct is None else float(bool(correct)),
        "correct": correct, "termination": "answered" if correct else "max_turns",
        "turns": 2, "tool_calls": 1, "parse_errors": 0 if correct else 1,
        "num_tokens": 40, "num_model_tokens": 12, "future_key": {"x": 1},
        "segments": [
            {"source": "prompt", "text": "<|user|>vault K=4821?"},
            {"source": "template", "text": "<|assistant|>"},
            {"source": "model", "text": "lookup(4821)<eos>", "turn": 0},
            {"source": "template", "text": "<|tool|>"},
            {"source": "env", "text": env},
            {"source": "template", "text": "<|assistant|>"},
            {"source": "model", "text": f"s{step}i{index}<eos>", "turn": 1},
        ],
    }
    return {**row, **extra}


def traj_rows() -> list[dict[str, Any]]:
    rows = [traj(s, index=i, correct=(i == 0)) for s in (1, 2, 3) for i in (0, 1)]
    rows += [traj(3, "eval", i, correct=[True, False, None][i]) for i in range(3)]
    return rows


def agent_metric_rows(n: int = 12) -> list[dict[str, Any]]:
    rows = []
    for step in range(n):
        row: dict[str, Any] = {
            "step": step, "reward_mean": 0.1 * step, "tool_calls_mean": 1 + 0.1 * step,
            "parse_errors_mean": 0.5 / (step + 1), "turns_mean": 2.0, "obs_token_frac": 0.4,
            "termination_answered": 0.7, "termination_max_turns": 0.2,
            "termination_new_reason": 0.1,
        }
        if step % 4 == 0:
            row |= {"eval_tool_call_rate": 0.8, "eval_turns_mean": 2.1,
                    "eval_termination_answered": 0.9, "eval_termination_max_turns": 0.1}
        rows.append(row)
    return rows


@pytest.fixture
def run(tmp_path: Path, rh: SimpleNamespace) -> Path:
    rh.write_jsonl(tmp_path / "run" / "trajectories.jsonl", traj_rows())
    return tmp_path / "run"


@pytest.fixture
def pipeline(tmp_path: Path, rh: SimpleNamespace) -> Path:
    pipe = tmp_path / "pipe"
    rh.write_jsonl(pipe / "agent1" / "trajectories.jsonl", [traj(1, index=7)])
    rh.write_jsonl(pipe / "agent2" / "trajectories.jsonl", [traj(9, index=5)])
    (pipe / "sft").mkdir()
    summary = {"stages": [
        {"name": "init", "accuracy": 0.1},
        {"name": "agent1", "accuracy": 0.3, "run_dir": "agent1", "tool_call_rate": 0.5,
         "terminations": {"answered": 0.6, "max_turns": 0.3, "env_error": 0.1, "tool_timeout": 0.0}},
        {"name": "agent2", "accuracy": 0.5, "run_dir": "agent2", "tool_call_rate": 0.9,
         "terminations": {"answered": 0.95, "parse_error_limit": 0.05}},
        {"name": "sft", "accuracy": 0.4, "run_dir": "sft"},
    ]}
    (pipe / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return pipe


# ------------------------------------------------------------------ reading


def test_read_and_filter(run: Path) -> None:
    rows = read_trajectories(run)
    assert len(rows) == 9 and rows == read_trajectories(run / "trajectories.jsonl")
    assert rows[0]["future_key"] == {"x": 1}  # unknown keys are kept
    assert [(r["step"], r["index"]) for r in read_trajectories(run, step=2)] == [(2, 0), (2, 1)]
    assert {r["phase"] for r in read_trajectories(run, phase="eval")} == {"eval"}
    failed = read_trajectories(run, phase="eval", failed_only=True)
    assert [r["correct"] for r in failed] == [False, None]  # unscorable counts as failed
    assert read_trajectories(run, step=3, phase="train", failed_only=True)[0]["index"] == 1


@pytest.mark.parametrize("bad, reason", [
    ("{not json", "invalid JSON"),
    ('["a list"]', "expected a JSON object"),
    (json.dumps({k: v for k, v in traj(1).items() if k != "turns"}), "missing key 'turns'"),
    (json.dumps(traj(1, tool_calls="1")), "'tool_calls' must be an integer"),
    (json.dumps({**traj(1), "step": True}), "'step' must be an integer"),
    (json.dumps(traj(1, reward="high")), "'reward' must be a number or null"),
    (json.dumps(traj(1, segments=[{"source": "user", "text": "x"}])), "segments[0]: 'source'"),
    (json.dumps(traj(1, segments=[{"source": "env", "text": 3}])), "segments[0]: 'text'"),
])
def test_malformed_line_is_located(tmp_path: Path, bad: str, reason: str) -> None:
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps(traj(1)) + "\n\n" + bad + "\n" + json.dumps(traj(2)) + "\n")
    with pytest.raises(ValueError) as info:
        read_trajectories(tmp_path)
    assert str(info.value).startswith(f"{path}:3: ") and reason in str(info.value)


def test_unterminated_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps(traj(1)) + "\n" + '{"step": 2, "pha')
    with pytest.warns(RuntimeWarning, match=":2: invalid JSON"):
        assert len(read_trajectories(path)) == 1


def test_missing_file_and_stage_lookup(tmp_path: Path, pipeline: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "trajectories.jsonl")):
        read_trajectories(tmp_path)
    assert find_trajectories(pipeline) == pipeline / "agent2" / "trajectories.jsonl"
    assert find_trajectories(pipeline, "agent1") == pipeline / "agent1" / "trajectories.jsonl"
    with pytest.raises(ValueError, match="no such stage.*agent1, agent2"):
        find_trajectories(pipeline, "nope")
    with pytest.raises(FileNotFoundError, match="is not a pipeline"):
        find_trajectories(tmp_path, "agent1")
    # the file itself (as `lmpo eval --out` writes one): it looked for FILE/trajectories.jsonl
    own = pipeline / "agent1" / "trajectories.jsonl"
    assert find_trajectories(own) == own
    with pytest.raises(FileNotFoundError, match="nowhere does not exist"):
        find_trajectories(tmp_path / "nowhere")


# ----------------------------------------------------------------- terminal


def test_terminal_with_colour(run: Path) -> None:
    console = Console(record=True, force_terminal=True, color_system="truecolor",
                      width=200, file=io.StringIO())
    render_terminal(read_trajectories(run, step=3, phase="train"), console)
    ansi = console.export_text(styles=True, clear=False)
    text = console.export_text()
    assert text.startswith("legend: prompt · template · model · env\n")
    assert "«" not in text and "⟦" not in text  # colour does the work
    for source, sample in [("model", "lookup(4821)<eos>"), ("env", "31415"),
                           ("template", "<|tool|>"), ("prompt", "<|user|>vault K=4821?")]:
        assert Style.parse(STYLES[source]).render(sample) in ansi, source
    styles = {str(Style.parse(s)) for s in STYLES.values()}
    assert len(styles) == 4  # four visibly different styles
    assert Style.parse(STYLES["env"]).bgcolor is not None  # env sits on a dark background
    head = "step 3 · train · #0 · reward 1 · correct · answered · 2 turns · 1 tool call · "
    assert head + "0 parse errors · tokens 12/40 model/total" in text
    assert "step 3 · train · #1 · reward 0 · wrong · max_turns" in text


@pytest.mark.parametrize("force_terminal, no_color", [(False, False), (True, True)])
def test_terminal_without_colour_uses_markers(run: Path, force_terminal: bool,
                                              no_color: bool) -> None:
    out = io.StringIO()  # not a terminal (as when piped), unless forced
    console = Console(file=out, force_terminal=force_terminal, no_color=no_color)
    render_terminal(read_trajectories(run, step=1), console)
    text = out.getvalue()
    assert ("\x1b[" in text) == force_terminal  # bold/dim only when forced
    assert "\x1b[3" not in text and "\x1b[4" not in text  # no colour codes
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert "«model» · ⟦env⟧" in text and "«…» model, ⟦…⟧ environment" in text
    assert "<|assistant|>«lookup(4821)<eos>»<|tool|>⟦31415⟧<|assistant|>«s1i0<eos>»" in text


def test_no_color_env_and_empty(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    out = io.StringIO()
    console = Console(force_terminal=True, file=out)
    render_terminal([], console, width=60)
    assert "no trajectories match" in out.getvalue()
    render_terminal(read_trajectories(run, step=1), console)
    assert "⟦31415⟧" in out.getvalue() and "\x1b[3" not in out.getvalue()


EVIL_ENV = "\x1b[31mRED\x1b[0m \x1b]0;pwned title\x07 and\nnext"


def test_control_characters_in_logged_text_are_shown_escaped(tmp_path: Path, rh: SimpleNamespace) -> None:
    """A tool's output with `ESC[2J` or an OSC title sequence cleared and retitled the reader's
    terminal: `lmpo trajectories` wrote them raw, to the terminal and to files."""
    rh.write_jsonl(tmp_path / "trajectories.jsonl", [traj(1, env=EVIL_ENV, tool_crashes=["boom\x1b[2J"])])
    for colour in (True, False):
        out = io.StringIO()
        console = Console(file=out, force_terminal=colour, color_system="truecolor" if colour else None, width=200)
        render_terminal(read_trajectories(tmp_path), console)
        text = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())  # lmpo's own styles
        assert "\x1b" not in text and "\x07" not in text
        assert "\\x1b[31mRED\\x1b[0m \\x1b]0;pwned title\\x07 and\nnext" in text
        assert "tool crashed: boom\\x1b[2J" in text
        assert ("\x1b[1;32m" in out.getvalue()) == colour  # lmpo's colours still work
    body = "\n".join(html_section(tmp_path))
    assert "\x1b" not in body and "\x07" not in body and "\\x1b]0;pwned title\\x07" in body


# ---------------------------------------------------------------------- CLI


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from lmpo.cli.main import main

    code = main(["trajectories", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_shows_last_k(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli([str(run)], capsys)
    assert code == 0 and "showing 3 of 9 matching" in out
    assert out.count("\nstep 3 · eval") == 3 and "step 2" not in out
    assert "⟦31415⟧" in out and "«s3i2<eos>»" in out  # piped output: markers
    code, out, _ = cli([str(run), "--step", "2", "--phase", "train", "--failed", "--last", "0"], capsys)
    assert code == 0 and "showing 1 of 1" in out and "«s2i1<eos>»" in out


def test_cli_says_which_steps_were_saved_when_none_was_for_the_step_asked(run: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """QA: `--step 99` on a run without that step printed "showing 0 of 0" and exited 0."""
    path = run / "trajectories.jsonl"
    code, out, err = cli([str(run), "--step", "99"], capsys)
    assert code == 2 and out == ""
    assert err.strip() == f"lmpo: error: --step 99: no trajectories were saved for step 99 in {path}; saved steps: 1-3"
    code, _, err = cli([str(run), "--step", "1", "--phase", "eval"], capsys)
    assert code == 2 and f"no eval trajectories were saved for step 1 in {path}; saved eval steps: 3" in err
    only_train = tmp_path / "train_only"
    only_train.mkdir()
    rows = [json.dumps(traj(step, correct=True)) + "\n" for step in (0, 2, 4, 5)]
    (only_train / "trajectories.jsonl").write_text("".join(rows))
    code, _, err = cli([str(only_train), "--phase", "eval"], capsys)
    assert code == 2 and "--phase eval: no eval trajectories were saved in" in err and "(saved: train)" in err
    code, _, err = cli([str(only_train), "--step", "3"], capsys)
    assert code == 2 and err.strip().endswith("saved steps: 0, 2, 4-5")
    code, out, _ = cli([str(only_train), "--step", "2", "--failed"], capsys)  # saved, and none failed: no error
    assert code == 0 and "showing 0 of 0 matching" in out


def test_cli_pipeline_dir(pipeline: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli([str(pipeline)], capsys)
    assert code == 0 and "step 9 · train · #5" in out
    code, out, _ = cli([str(pipeline), "--stage", "agent1"], capsys)
    assert code == 0 and "step 1 · train · #7" in out


def test_cli_errors(tmp_path: Path, pipeline: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli([str(tmp_path / "nope")], capsys)
    assert code == 2 and out == ""
    assert err.startswith("lmpo: error: ") and f"{tmp_path / 'nope'} does not exist" in err
    (tmp_path / "trajectories.jsonl").write_text(json.dumps(traj(1)) + "\nnope\n")
    code, _, err = cli([str(tmp_path)], capsys)
    assert code == 2 and f"{tmp_path / 'trajectories.jsonl'}:2: invalid JSON" in err
    code, _, err = cli([str(pipeline), "--stage", "sft"], capsys)
    assert code == 2 and str(pipeline / "sft" / "trajectories.jsonl") in err


# ------------------------------------------------------------------- report


@pytest.fixture(scope="module")
def agent_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An agent run (metrics + trajectories, one bad line) reported once."""
    run = tmp_path_factory.mktemp("agent") / "agent"
    run.mkdir()
    lines = [json.dumps(r) for r in agent_metric_rows()]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    rows = traj_rows() + [traj(4, env="<script>alert(1)</script> & more")]
    lines = [json.dumps(r) for r in rows[:3]] + ['{"step": "bad"}'] + [json.dumps(r) for r in rows[3:]]
    (run / "trajectories.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.warns(RuntimeWarning, match=r"trajectories.jsonl:4: 'step' must be an integer"):
        return write_report(run)


def test_report_has_agent_panels(agent_report: Path, rh: SimpleNamespace) -> None:
    srcs = rh.img_srcs(agent_report)
    assert srcs == ["reward.png", "agent.png", "obs_tokens.png", "termination.png"]
    for src in srcs:
        rh.assert_png(agent_report.parent / src)
    text = agent_report.read_text(encoding="utf-8")
    assert "<td>tool_calls_mean</td>" in text and "<td>termination_new_reason</td>" in text


def test_report_trajectory_section(agent_report: Path) -> None:
    text = agent_report.read_text(encoding="utf-8")
    assert "<h2>Agent trajectories</h2>" in text and "10 trajectories" in text
    assert "<script" not in text  # the env text is escaped
    assert '<span class="seg-env" title="env">&lt;script&gt;alert(1)&lt;/script&gt; &amp; more</span>' in text
    assert '<span class="seg-model" title="model">lookup(4821)&lt;eos&gt;</span>' in text
    for source in ("prompt", "template", "model", "env"):
        assert f".seg-{source} {{" in text  # legend and colour coding
    section = text.split("Latest training episodes")[1]
    assert section.count('class="traj-text"') == 6 + 3  # 6 train, then max(1, 6 // 2) eval
    assert "Latest held-out episodes" in section
    assert section.split("Latest held-out episodes")[1].count('class="traj-text"') == 3


def test_html_section_limits(run: Path) -> None:
    body = "\n".join(html_section(run, n=2))
    assert body.count('class="traj-text"') == 2 + 1
    assert "s3i1&lt;eos&gt;" in body and "s2i1" not in body


def test_old_run_report_is_unchanged(rl_report: Path, rh: SimpleNamespace) -> None:
    assert rh.img_srcs(rl_report) == [f"{name}.png" for name in OLD_RL_PLOTS]
    assert "trajectories" not in rl_report.read_text(encoding="utf-8").lower()
    for name in ("agent", "obs_tokens", "termination"):
        assert not (rl_report.parent / f"{name}.png").exists()


def test_termination_panel_specs() -> None:
    assert termination_panel(["reward_mean", "termination_"]) is None
    assert panels_for(["reward_mean", "loss"]) == list(PANELS)
    panel = termination_panel(["termination_zzz", "termination_max_turns",
                               "termination_answered", "eval_termination_tool_timeout"])
    assert panel is not None
    train, held_out = panel.axes
    assert [c.label for c in train.curves] == ["answered", "max_turns", "zzz"] and train.stacked
    assert [c.key for c in held_out.curves] == ["eval_termination_tool_timeout"]


def test_pipeline_table_agent_columns(pipeline: Path, tmp_path: Path) -> None:
    text = write_report(pipeline).read_text(encoding="utf-8")
    assert "<th>tool-call rate</th><th>episode endings</th><th>run</th>" in text
    assert '<td class="num">50.0%</td>' in text
    assert "<td>answered 60.0%, max_turns 30.0%, env_error 10.0%</td>" in text
    assert "<td>answered 95.0%, parse_error_limit 5.0%</td>" in text
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "summary.json").write_text(json.dumps({"stages": [{"name": "a", "accuracy": 0.5, "tool_call_rate": 0.0}]}))
    text = write_report(plain).read_text(encoding="utf-8")
    assert "<th>time</th><th>run</th>" in text and "tool-call" not in text


def test_a_large_file_is_read_a_row_at_a_time(tmp_path):
    """`lmpo trajectories` and the report read the whole file, then every row, into memory: a
    168 MB file of a long run took 1.9 GB to show its last 2 episodes. Now only those are held."""
    import tracemalloc

    from lmpo.reports.trajectories import last_trajectories

    path = tmp_path / "trajectories.jsonl"
    with path.open("w") as f:
        for step in range(3000):
            f.write(json.dumps(traj(step, env="9" * 1000)) + "\n")  # ~2 KB a row, 6 MB in all
    tracemalloc.start()
    shown, matching = last_trajectories(path, 2, phase="train")
    peak = tracemalloc.get_traced_memory()[1]
    html = html_section(tmp_path, n=2)
    peak = max(peak, tracemalloc.get_traced_memory()[1])
    tracemalloc.stop()
    assert matching == 3000 and [r["step"] for r in shown] == [2998, 2999]
    assert "3000 trajectories in trajectories.jsonl." in "".join(html)
    assert peak < 1_000_000, peak  # a few rows, not the file's 6 MB


def masked_and_trained(rh: SimpleNamespace, tmp_path: Path) -> Path:
    """A masked turn_length episode next to a trained one, as a run writes them now."""
    rows = [traj(1, index=0, termination_action="train", trained_tokens=12),
            traj(1, index=1, correct=False, termination="turn_length", termination_action="mask", trained_tokens=0)]
    rh.write_jsonl(tmp_path / "run" / "trajectories.jsonl", rows)
    return tmp_path / "run"


def test_untrained_model_text_is_marked_and_styled_apart(tmp_path: Path, rh: SimpleNamespace) -> None:
    """A masked episode's model text read exactly like trained text (QA F1)."""
    run = masked_and_trained(rh, tmp_path)
    out = io.StringIO()
    render_terminal(read_trajectories(run), Console(file=out, no_color=True))
    text = out.getvalue()
    assert "not trained: turn_length → masked" in text
    assert "«s1i0<eos>»" in text and "‹s1i1<eos>›" in text and "«s1i1" not in text
    assert "‹untrained model›" in text
    html = "\n".join(html_section(run))
    assert 'class="seg-untrained"' in html and html.count("not trained: turn_length → masked") == 1
    assert '<span class="seg-model" title="model">s1i0&lt;eos&gt;</span>' in html


def test_a_file_without_the_training_fields_reads_as_before(run: Path) -> None:
    out = io.StringIO()
    render_terminal(read_trajectories(run, step=1), Console(file=out, no_color=True))
    assert "not trained" not in out.getvalue() and "‹" not in out.getvalue()
    assert "seg-untrained" not in "\n".join(html_section(run)).split("</style>")[1]
