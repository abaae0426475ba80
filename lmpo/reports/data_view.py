"""`lmpo data FILE`: a data file as a trainer will read it, before any training. The loader's
report (shape, rows kept, skipped and cut), token counts against the limit, and the first
examples decoded token by token, the tokens that carry loss told apart (bold green; `«…»`
without colour): the place to see that a chat template's turns, BOS and end-of-turn tokens land
where the model should learn them."""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass

from rich.console import Console
from rich.text import Text

from lmpo.envs.data import DataError, load_preferences, load_prompts, load_sft, read_records
from lmpo.envs.data.unpaired import load_unpaired
from lmpo.reports.trajectories import MARKERS, STYLES
from lmpo.rollout.render import TextRenderer

KINDS = ("sft", "pairs", "kto", "prompts")
"""What trains on each kind: sft (SFT and CPT), pairs (DPO and its kin, ORPO, the reward model),
kto, prompts (RL, online DPO and RFT, any --eval_prompts)."""


@dataclass
class Shown:
    """One example as parts of (token ids, whether they carry loss, a label or "")."""

    parts: list[tuple[list[int], bool, str]]
    length: int | None = None
    """The example's length as its trainer counts it, where that is not every part's (a pair: its
    prompt and its longer reply)."""

    @property
    def tokens(self) -> int:
        return self.length if self.length is not None else sum(len(ids) for ids, _, _ in self.parts)

    @property
    def loss_tokens(self) -> int:
        return sum(len(ids) for ids, loss, _ in self.parts if loss)


def guess_kind(path: str, columns: dict[str, str] | None = None) -> str:
    """The kind of file from its first row's fields (read under lmpo's names, {column: name})."""
    first = read_records(path)[:1]
    fields = {(columns or {}).get(f, f) for f in first[0].fields} if first else set()
    if {"chosen", "rejected"} <= fields:
        return "pairs"
    if "label" in fields or "kto_tag" in fields:
        return "kto"
    if fields & {"messages", "conversations", "text", "completion", "output"}:
        return "sft"
    return "prompts"


def load_shown(path: str, kind: str, tokenizer, max_length: int, limit_name: str = "", prompt_field: str = "prompt",
               answer_field: str = "answer", columns: dict[str, str] | None = None,
               overlong: str = "error", task: str = "") -> tuple[list[Shown], str, int, str]:
    """Every example of `path` read as `kind` under the trainers' `overlong` policy, except that
    "error" counts the rows over `max_length` and leaves them out instead of stopping; the
    loader's summary line, how many rows were over (skipped or cut to nothing), and a warning or "".
    `columns`: pairs' and KTO rows' other columns read as lmpo's names ({column: name}), as the
    trainers' options give; `task`: prompts' rows checked as the trainers' --task does."""
    policy = "skip" if overlong == "error" else overlong
    if kind == "sft":
        examples, report = load_sft(path, tokenizer, max_length=max_length, overlong=policy,
                                     limit_name=limit_name, prompt_field=prompt_field, answer_field=answer_field)
        shown = [Shown(_runs(e.input_ids, e.loss_mask)) for e in examples]
    elif kind == "pairs":
        pairs, report = load_preferences(path, tokenizer, max_length=max_length, overlong=policy,
                                         limit_name=limit_name, columns=columns)
        shown = [Shown([(p.prompt_ids, False, ""), (p.chosen_ids, True, "chosen"), (p.rejected_ids, True, "rejected")],
                       len(p.prompt_ids) + max(len(p.chosen_ids), len(p.rejected_ids))) for p in pairs]
    elif kind == "kto":
        examples, report = load_unpaired(path, tokenizer, max_length=max_length, overlong=policy,
                                         limit_name=limit_name, columns=columns)
        shown = [Shown([(e.prompt_ids, False, ""), (e.completion_ids, True, "desirable" if e.desirable else "undesirable")])
                 for e in examples]
    else:
        problems, note = _prompts(path, prompt_field, answer_field, tokenizer, task)
        renderer = TextRenderer(tokenizer)  # as the agent loop reads a prompt file's rows
        shown = [Shown([(renderer.prompt([{"role": "user", "content": p.prompt}])[0], False, ""),
                        ([], False, f"answer: {p.answer!r}" if p.answer else "")]) for p in problems]
        summary = f"{path}: {len(problems)} prompts, as the policy reads them (sampling writes the rest)"
        if any(p.answer for p in problems):  # SFT reads the same rows as demonstrations
            summary += "; --kind sft shows them as SFT trains on them, the answer as the completion"
        return shown, summary, 0, note
    report.overlong = overlong
    return shown, report.summary(), report.skipped_overlong, ""


def _prompts(path: str, prompt_field: str, answer_field: str, tokenizer, task: str) -> tuple[list, str]:
    """The prompts as the trainers read them with `task` (their --task); without one, a warning
    when rows have no answer (absent, null or empty), which a task that grades against answers
    refuses, unless no row has the answer field at all."""
    from lmpo.trainers.preflight import grades_against_answers

    read = functools.partial(load_prompts, path, prompt_field=prompt_field, answer_field=answer_field,
                             tokenizer=tokenizer)
    if task:
        return read(require_answer=grades_against_answers(task)), ""
    try:
        return read(require_answer=True), ""
    except DataError as err:
        if err.field != answer_field:
            raise
        refused = err
    problems = read()
    missing = sum(not p.answer.strip() for p in problems)  # absent, null and "" alike
    if missing == len(problems) and not any(answer_field in r.fields for r in read_records(path)):
        return problems, ""  # a prompt set for a task with its own grader; an answer column left empty is not one
    return problems, (f"warning: {missing} of {len(problems)} rows have no answer: a task that grades against answers "
                      f"refuses the file (--task exact_match checks it as its trainer does): {refused}")


def _runs(ids: list[int], mask: list[int]) -> list[tuple[list[int], bool, str]]:
    runs: list[tuple[list[int], bool, str]] = []
    for token, m in zip(ids, mask):
        if runs and runs[-1][1] == bool(m):
            runs[-1][0].append(token)
        else:
            runs.append(([token], bool(m), ""))
    return runs


def counts_line(shown: list[Shown], limit: str) -> str:
    tokens = sorted(s.tokens for s in shown)
    loss = sum(s.loss_tokens for s in shown)
    if not tokens:
        return "no examples"
    p95 = tokens[min(len(tokens) - 1, round(0.95 * (len(tokens) - 1)))]
    share = f"; {100 * loss / max(sum(_all(s) for s in shown), 1):.1f}% of the tokens carry loss" if loss else ""
    median = statistics.median(tokens)  # x.5 between two middle counts
    median_text = f"{median:.0f}" if median == int(median) else f"{median:.1f}"
    return (f"tokens per example: min {tokens[0]}, median {median_text}, p95 {p95}, max {tokens[-1]}; "
            f"limit: {limit}{share}")


def _all(example: Shown) -> int:
    return sum(len(ids) for ids, _, _ in example.parts)


def render(shown: list[Shown], tokenizer, console: Console, first: int) -> None:
    """The first `first` examples, each token run decoded, loss-carrying runs styled as a
    trajectory's model text (or marked `«…»` without colour)."""
    plain = console.no_color or console.color_system is None
    for i, example in enumerate(shown[:first]):
        console.print()
        if example.length is None:
            said = f"{example.tokens} tokens, {example.loss_tokens} with loss"
        else:  # a pair: its length against the limit is the prompt and its longer reply
            said = f"{example.tokens} tokens with the longer reply; the two replies' {example.loss_tokens} carry loss"
        console.print(f"example {i + 1} ({said})", style="bold", highlight=False, markup=False)
        body = Text(overflow="fold")
        for ids, loss, label in example.parts:
            if label:
                body.append(f"\n[{label}] ", style="dim")
            text = tokenizer.decode(ids, skip_special_tokens=False)
            if loss and plain:
                text = f"{MARKERS['model'][0]}{text}{MARKERS['model'][1]}"
            body.append(text, style=STYLES["model"] if loss else STYLES["prompt"])
        console.print(body, soft_wrap=plain)
