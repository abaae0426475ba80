"""Agent trajectories (``RUN_DIR/trajectories.jsonl``): read, print, and show in HTML.

Each line is one saved episode: counters (turns, tool calls, parse errors,
tokens), how it ended, its reward, and ``segments`` — the text in order, each
tagged with its ``source``: ``prompt``, ``model`` (sampled by the policy),
``template`` (chat-template glue) or ``env`` (tool / environment output).
A training episode also records what the loss made of it: ``termination_action``
(the termination policy's train / mask / penalise / exclude for its ending) and
``trained_tokens``; files written before these fields existed say nothing about it.
Viewers keep the sources visibly apart, and model text that was not trained
(a masked or excluded episode) apart from trained model text; without colour,
model text is wrapped in ``«…»``, untrained model text in ``‹…›`` and
environment text in ``⟦…⟧``.
"""

from __future__ import annotations

import json
import warnings
from collections import deque
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console
from rich.text import Text

from . import page
from .trajectory_files import TRAJECTORIES_FILE, find_trajectories, step_ranges  # noqa: F401 (re-exported)
from .metrics import json_error

SOURCES = ("prompt", "model", "template", "env")
PHASES = ("train", "eval")

# Terminal styles (rich) per segment source.
STYLES: dict[str, str] = {
    "prompt": "dim",
    "template": "dim bright_black",
    "model": "bold green",
    "env": "cyan on grey19",
}
# Markers used when colour is off (NO_COLOR, output piped to a file).
MARKERS: dict[str, tuple[str, str]] = {"model": ("«", "»"), "env": ("⟦", "⟧")}
# Model text of an episode the loss left out: sampled, but not learnt from.
UNTRAINED = "untrained"
UNTRAINED_STYLE = "dim italic green"
UNTRAINED_MARKERS = ("‹", "›")
ACTION_WORDS = {"mask": "masked", "exclude": "excluded"}
HTML_SEGMENT_CHARS = 4000  # longer segments are cut in the HTML report

_INT, _NUM, _STR, _BOOL, _NONE = "an integer", "a number", "a string", "a boolean", "null"
REQUIRED: dict[str, tuple[str, ...]] = {
    "step": (_INT,), "phase": (_STR,), "index": (_INT,),
    "reward": (_NUM, _NONE), "correct": (_BOOL, _NONE), "termination": (_STR,),
    "turns": (_INT,), "tool_calls": (_INT,), "parse_errors": (_INT,),
    "num_tokens": (_INT,), "num_model_tokens": (_INT,),
}
OPTIONAL: dict[str, tuple[str, ...]] = {"prompt": (_STR,), "answer": (_STR, _NONE), "error": (_STR,),
                                        "termination_action": (_STR,), "trained_tokens": (_INT,)}

Row = dict[str, Any]


def _is(value: Any, kind: str) -> bool:
    if kind == _NONE:
        return value is None
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _STR:
        return isinstance(value, str)
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if kind == _INT else isinstance(value, (int, float))


def validate(row: Any) -> Row:
    """Return ``row`` if it is a well-formed trajectory, else raise ``ValueError``.

    Unknown keys are allowed; ``answer`` and ``prompt`` may be missing.
    """
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    for key, kinds in {**REQUIRED, **OPTIONAL}.items():
        if key not in row:
            if key in REQUIRED:
                raise ValueError(f"missing key {key!r}")
            continue
        if not any(_is(row[key], k) for k in kinds):
            want = " or ".join(kinds)
            raise ValueError(f"{key!r} must be {want}, got {json.dumps(row[key])[:60]}")
    if "segments" not in row:
        raise ValueError("missing key 'segments'")
    segments = row["segments"]
    if not isinstance(segments, list):
        raise ValueError("'segments' must be a list")
    for i, seg in enumerate(segments):
        if not isinstance(seg, dict):
            raise ValueError(f"segments[{i}] must be an object")
        if seg.get("source") not in SOURCES:
            raise ValueError(f"segments[{i}]: 'source' must be one of {', '.join(SOURCES)}, "
                             f"got {json.dumps(seg.get('source'))[:60]}")
        if not isinstance(seg.get("text"), str):
            raise ValueError(f"segments[{i}]: 'text' must be a string")
    return row


def trajectories_path(path_or_run_dir: str | Path) -> Path:
    """``path_or_run_dir`` itself, or ``<dir>/trajectories.jsonl`` for a directory."""
    path = Path(path_or_run_dir)
    return path / TRAJECTORIES_FILE if path.is_dir() else path


def _rows(path: Path, strict: bool) -> Iterator[Row]:
    """Parse and validate each line, one at a time (a file of a long run or a sampled evaluation
    runs to gigabytes). A bad line raises (``strict``) or is skipped with a warning; a bad
    unterminated last line (a write in progress) is always skipped with a warning."""
    if not path.is_file():
        raise FileNotFoundError(f"no trajectories file: {path}")
    with path.open("rb") as lines:
        for lineno, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                yield validate(json.loads(raw.decode("utf-8")))
            except (ValueError, UnicodeDecodeError) as exc:
                reason = (json_error(exc, f"column {exc.colno}")
                          if isinstance(exc, json.JSONDecodeError) else str(exc))
                message = f"{path}:{lineno}: {reason}"
                in_progress = not raw.endswith(b"\n")  # only the last line can lack its newline
                if strict and not in_progress:
                    raise ValueError(message) from None
                warnings.warn(f"skipping {message}", RuntimeWarning, stacklevel=3)


def is_failed(row: Row) -> bool:
    """True unless the episode was graded correct (wrong or unscorable)."""
    return row.get("correct") is not True


def read_trajectories(
    path_or_run_dir: str | Path,
    *,
    step: int | None = None,
    phase: str | None = None,
    failed_only: bool = False,
) -> list[Row]:
    """Trajectories from a ``trajectories.jsonl`` (or a run directory holding one),
    in file order, optionally only those of one ``step``, one ``phase``, or
    the failed ones (see :func:`is_failed`).

    Raises ``FileNotFoundError`` naming the path if it is missing, and
    ``ValueError("<path>:<line>: <reason>")`` for a malformed line.
    """
    return list(matching_trajectories(path_or_run_dir, step=step, phase=phase, failed_only=failed_only))


def matching_trajectories(path_or_run_dir: str | Path, *, step: int | None = None, phase: str | None = None,
                          failed_only: bool = False) -> Iterator[Row]:
    """As :func:`read_trajectories`, one row at a time."""
    for r in _rows(trajectories_path(path_or_run_dir), strict=True):
        if ((step is None or r["step"] == step) and (phase is None or r["phase"] == phase)
                and (not failed_only or is_failed(r))):
            yield r


def last_trajectories(path_or_run_dir: str | Path, last: int, **where) -> tuple[list[Row], int]:
    """(The last ``last`` matching trajectories, or all with 0; how many matched), holding no
    more than those in memory."""
    kept: deque[Row] = deque(maxlen=last or None)
    count = 0
    for row in matching_trajectories(path_or_run_dir, **where):
        kept.append(row)
        count += 1
    return list(kept), count


def unsaved_filter(path_or_run_dir: str | Path, step: int | None, phase: str | None) -> str | None:
    """Why a `--step` or `--phase` that matched nothing matched nothing: no trajectory of that step
    (or phase) was saved; what was. None when some were, and only `--failed` left none."""
    path, saved = trajectories_path(path_or_run_dir), {}
    for row in _rows(path, strict=True):
        saved.setdefault(row["phase"], set()).add(row["step"])
    if phase is not None and phase not in saved:
        return f"--phase {phase}: no {phase} trajectories were saved in {path} (saved: {', '.join(saved) or 'none'})"
    steps = saved.get(phase, set()) if phase else set().union(*saved.values())
    if step is None or step in steps:
        return None
    kind = f"{phase} " if phase else ""
    return f"--step {step}: no {kind}trajectories were saved for step {step} in {path}; saved {kind}steps: " \
           f"{step_ranges(sorted(steps)) or 'none'}"


# ------------------------------------------------------------------ terminal


def _fmt_num(x: Any) -> str:
    return "n/a" if x is None else f"{x:g}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def untrained(row: Row) -> str | None:
    """Why a training episode's model text got no loss (`not trained: turn_length → masked`), or
    None: trained, an evaluation, or a file that does not record it."""
    action, tokens = row.get("termination_action"), row.get("trained_tokens")
    if row["phase"] != "train" or (action is None and tokens is None):
        return None
    if action in ("mask", "exclude"):
        return f"not trained: {row['termination']} → {ACTION_WORDS[action]}"
    if tokens == 0:
        return "not trained: no token carried loss"
    return None


def _training_field(row: Row) -> tuple[str, str] | None:
    if (why := untrained(row)) is not None:
        return why, "warn"
    if row.get("termination_action") == "penalise":
        return f"trained, penalised: {row['termination']}", "warn"
    return None


def header_fields(row: Row) -> list[tuple[str, str]]:
    """``(text, kind)`` pieces of a trajectory's one-line summary; ``kind`` is
    ``good``, ``bad``, ``warn`` or ``""`` (plain)."""
    correct = row.get("correct")
    ended = row["termination"]
    fields = [
        (f"step {row['step']}", ""), (row["phase"], ""), (f"#{row['index']}", ""),
        (f"reward {_fmt_num(row['reward'])}", ""),
        ("correct" if correct else "ungraded" if correct is None else "wrong",
         "good" if correct else "bad"),
        (ended, "" if ended in ("answered", "env_done") else "warn"),
        (_plural(row["turns"], "turn"), ""), (_plural(row["tool_calls"], "tool call"), ""),
        (_plural(row["parse_errors"], "parse error"), "bad" if row["parse_errors"] else ""),
        (f"tokens {row['num_model_tokens']}/{row['num_tokens']} model/total", ""),
    ]
    if (training := _training_field(row)) is not None:
        fields.append(training)
    if row.get("answer") is not None:
        fields.append((f"expected {row['answer']!r}", ""))
    if row.get("error"):
        fields.append((f"error: {row['error']}", "bad"))
    crashes = row.get("tool_crashes")
    if isinstance(crashes, list) and crashes:  # a tool raised: perhaps the tool's own bug, not the model's call
        fields.append((f"tool crashed: {crashes[0]}", "bad"))
    return fields


_HEADER_STYLES = {"": "bold", "good": "bold green", "bad": "bold red", "warn": "bold yellow"}


def _colourless(console: Console) -> bool:
    return console.no_color or console.color_system is None


def segment_kind(row: Row, source: str) -> str:
    """The segment's source, or :data:`UNTRAINED` for model text the loss left out."""
    return UNTRAINED if source == "model" and untrained(row) is not None else source


def _style(kind: str) -> str:
    return UNTRAINED_STYLE if kind == UNTRAINED else STYLES[kind]


def _segment_text(kind: str, text: str, plain: bool) -> str:
    markers = UNTRAINED_MARKERS if kind == UNTRAINED else MARKERS.get(kind)
    if plain and markers:
        return f"{markers[0]}{text}{markers[1]}"
    return text


def legend(plain: bool, with_untrained: bool = False) -> Text:
    """One line naming each source in its own style (and markers when ``plain``); untrained
    model text too when some episode shown has it."""
    out = Text()
    out.append("legend: ", style="bold")
    kinds = ("prompt", "template", "model", *((UNTRAINED,) if with_untrained else ()), "env")
    for i, kind in enumerate(kinds):
        if i:
            out.append(" · ", style="dim")
        name = "untrained model" if kind == UNTRAINED else kind
        out.append(_segment_text(kind, name, plain), style=_style(kind))
    if plain:
        untrained_key = " ‹…› untrained model," if with_untrained else ""
        out.append(f"  (no colour: «…» model,{untrained_key} ⟦…⟧ environment)")
    return out


def render_terminal(rows: list[Row], console: Console, *, width: int | None = None,
                    prompt_chars: int | None = None) -> None:
    """Print a legend, then each trajectory: a header line and its text, the
    sources styled as in :data:`STYLES`; when the console has no colour, model
    and environment text are wrapped in :data:`MARKERS` instead, and (unless
    ``width`` is given) lines are not re-wrapped, so the text stays exact. Control characters
    in the logged text (an ESC from a tool's output) are shown escaped, never sent to the terminal.
    `prompt_chars`: show only the last that many characters of a longer prompt (a chat
    template's system turn with its tool schemas, the same in every episode), saying how many
    were left out."""
    plain = _colourless(console)
    soft = plain and width is None
    console.print(legend(plain, any(untrained(r) is not None for r in rows)), width=width, soft_wrap=soft)
    if not rows:
        console.print("no trajectories match", width=width, soft_wrap=soft)
        return
    for row in rows:
        console.print()
        head = Text()
        for i, (text, kind) in enumerate(header_fields(row)):
            if i:
                head.append(" · ", style="dim")
            head.append(page.show_controls(text), style=_HEADER_STYLES[kind])
        console.print(head, width=width, soft_wrap=soft)
        body = Text(overflow="fold")
        for i, seg in enumerate(row["segments"]):
            text = seg["text"]
            if i == 0 and seg["source"] == "prompt" and prompt_chars is not None and len(text) > prompt_chars:
                body.append(f"[{len(text) - prompt_chars} earlier characters of the prompt not shown]…", style="dim")
                text = text[len(text) - prompt_chars:]
            text = page.show_controls(text)
            kind = segment_kind(row, seg["source"])
            body.append(_segment_text(kind, text, plain), style=_style(kind))
        console.print(body, width=width, soft_wrap=soft)


# ---------------------------------------------------------------------- HTML

HTML_STYLE = """<style>
.traj-text { white-space: pre-wrap; overflow-wrap: anywhere; background: #fafafa;
             border: 1px solid #ddd; padding: 0.6em; font-size: 0.85em; }
.traj-meta { font-size: 0.9em; } .traj-meta .good { color: #1a7f37; }
.traj-meta .bad { color: #b42318; } .traj-meta .warn { color: #9a6700; }
.seg-prompt { color: #777; } .seg-template { color: #999; font-style: italic; }
.seg-model { color: #1a7f37; font-weight: bold; }
.seg-untrained { color: #6b8f75; font-style: italic; text-decoration: line-through #b0b0b0; }
.seg-env { color: #7fe3ff; background: #1f2b36; }
</style>"""


def _span(kind: str, text: str) -> str:
    title = "model (sampled, not trained)" if kind == UNTRAINED else kind
    return f'<span class="seg-{kind}" title="{title}">{page.esc(text)}</span>'


def _html_trajectory(row: Row) -> str:
    meta = " · ".join(f'<span class="{kind}">{page.esc(t)}</span>' if kind else page.esc(t)
                      for t, kind in header_fields(row))
    parts = []
    for seg in row["segments"]:
        text = seg["text"]
        if len(text) > HTML_SEGMENT_CHARS:
            text = text[:HTML_SEGMENT_CHARS] + f"… ({len(text) - HTML_SEGMENT_CHARS} more characters)"
        parts.append(_span(segment_kind(row, seg["source"]), text))
    return f'<p class="traj-meta">{meta}</p>\n<pre class="traj-text">{"".join(parts)}</pre>'


def html_section(run_dir: str | Path, n: int = 6) -> list[str]:
    """HTML fragments for the report: the last ``n`` train trajectories and the
    last ``max(1, n // 2)`` eval ones, colour-coded by source, with a legend.

    Malformed lines are skipped with a ``RuntimeWarning``; an unreadable file
    gives a note instead of the trajectories.
    """
    path = trajectories_path(run_dir)
    body = [page.heading("Agent trajectories"), HTML_STYLE]
    wanted = {"train": (n, "Latest training episodes"), "eval": (max(1, n // 2), "Latest held-out episodes")}
    latest = {phase: deque(maxlen=max(count, 0)) for phase, (count, _) in wanted.items()}
    total = 0
    try:
        for row in _rows(path, strict=False):  # one at a time: the file can be large
            total += 1
            if row["phase"] in latest:
                latest[row["phase"]].append(row)
    except OSError as exc:
        warnings.warn(f"could not read {path}: {exc}", RuntimeWarning, stacklevel=2)
        return body + [page.paragraph(f"could not read {path.name}: {exc}", "note")]
    legend_html = " ".join(_span(s, s) for s in ("prompt", "template", "model", "env"))
    if any(untrained(r) is not None for rows in latest.values() for r in rows):
        legend_html += " " + _span(UNTRAINED, "untrained model (masked or excluded: no loss)")
    body.append(f"<p>{page.esc(f'{total} trajectories in {path.name}.')} "
                f"Text by source: {legend_html}</p>")
    for phase, (_, title) in wanted.items():
        if latest[phase]:
            body.append(page.heading(title, 3))
            body += [_html_trajectory(r) for r in latest[phase]]
    if not total:
        body.append(page.paragraph("No valid trajectories logged yet.", "note"))
    return body
