"""`lmpo data FILE`: see a data file as a trainer will read it (see `lmpo.reports.data_view`)."""

from __future__ import annotations

import argparse

HELP = "show a data file as a trainer reads it: shape, token counts, examples with the loss tokens marked"
DESCRIPTION = """Read FILE (JSONL, JSON, Parquet, CSV/TSV (those but Parquet also .gz/.bz2/.xz) or a saved `datasets` directory) with the loader of the trainers that
would train on it and the model's tokenizer and chat template: print the loader's report (shape, rows kept, rows over the
limit), tokens per example against the limit, and the first examples decoded, the tokens that carry loss in bold green
(or «marked» without colour). Nothing is trained and no model weights are loaded."""


def cmd_data(args: argparse.Namespace, flags: dict) -> int:
    from rich.console import Console

    from lmpo.envs.registry import make_task
    from lmpo.models import load_tokenizer
    from lmpo.reports.data_view import counts_line, guess_kind, load_shown, render
    from lmpo.trainers.preflight import example_limit

    if args.show < 0:
        raise ValueError(f"--show must be 0 or more, got {args.show}")
    tokenizer = load_tokenizer(args.model, args.trust_remote_code, args.chat_template, args.chat_template_kwargs)
    columns = {args.prompt_field: "prompt", args.chosen_field: "chosen", args.rejected_field: "rejected",
               args.completion_field: "completion", args.label_field: "label"}
    kind = args.kind if args.kind != "auto" else guess_kind(args.file, columns)
    if args.max_new_tokens < 1:
        raise ValueError(f"--max_new_tokens must be 1 or more, got {args.max_new_tokens}")
    max_length, limit_name = example_limit(args.model, tokenizer, args.max_length)
    if kind == "prompts" and args.overlong != "error":
        raise ValueError(f"--overlong {args.overlong}: the prompt trainers have no such option: they refuse a prompt "
                         "over the limit")
    if args.task:
        if kind != "prompts":
            raise ValueError(f"--task: only prompt files are read with a task (--kind prompts), not --kind {kind}")
        make_task(args.task)  # an unknown task or a bad option is refused as the trainers refuse it
    shown, summary, over, note = load_shown(args.file, kind, tokenizer, max_length, limit_name, args.prompt_field,
                                            args.answer_field, columns, args.overlong, args.task)
    limit = limit_name or f"max_length {max_length}"
    if kind == "prompts":
        limit, over = prompt_limit(args.model, tokenizer, args.max_new_tokens, shown)
    console = Console(highlight=False)
    console.print(f"{kind}: {summary}", markup=False, soft_wrap=True)
    if kind == "prompts" and over:  # the trainers have no --overlong for prompts: they refuse the row
        console.print(f"warning: {over} rows are over {limit}: a trainer stops at the first of them (shorten them "
                      "or lower --max_new_tokens)", style="yellow", markup=False)
    elif over and args.overlong == "error":
        console.print(f"warning: {over} rows are over {limit}: a trainer stops at the "
                      "first of them unless given --overlong skip or truncate", style="yellow", markup=False)
    if note:
        console.print(note, style="yellow", markup=False, soft_wrap=True)
    console.print(counts_line(shown, limit), markup=False, soft_wrap=True)
    render(shown, tokenizer, console, args.show)
    return 0


def prompt_limit(model: str, tokenizer, max_new_tokens: int, shown: list) -> tuple[str, int]:
    """The limit the prompt trainers hold a prompt to (the model's context less the completion
    budget, as `lmpo.trainers.preflight.prompts_within_context`), in words, and how many of
    `shown` are over it."""
    from lmpo.trainers.preflight import model_context

    context = model_context(model, tokenizer)
    if context is None:
        return "none (the model's config gives no context length)", 0
    room = context - max_new_tokens
    if room < 1:
        raise ValueError(f"--max_new_tokens {max_new_tokens} leaves no room for a prompt in the model's context of "
                         f"{context} tokens")
    words = f"{room} tokens (the model's context of {context} tokens minus max_new_tokens={max_new_tokens})"
    return words, sum(example.tokens > room for example in shown)


def _boolean(text: str) -> bool:
    """A BOOL flag's value as the trainers read one (lmpo.cli.config.coerce)."""
    from lmpo.cli.config import ConfigError, coerce

    try:
        return coerce(bool, text, "--trust_remote_code")
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--trust_remote_code: ")) from None


def add_parser(sub) -> None:
    from lmpo.reports.data_view import KINDS

    p = sub.add_parser("data", help=HELP, description=DESCRIPTION)
    p.add_argument("file", help="the data file, as given to --data, --prompts or --eval_prompts (DIR::split for a DatasetDict)")
    p.add_argument("--model", default="tiny", help="the model whose tokenizer and chat template read it (default: tiny)")
    p.add_argument("--kind", choices=("auto", *KINDS), default="auto",
                   help="how it is read: sft (SFT, CPT), pairs (DPO and kin, ORPO, the reward model), kto, prompts "
                        "(RL, online DPO, RFT, --eval_prompts); auto: from the first row's fields")
    p.add_argument("--task", default="", metavar="TASK",
                   help="with --kind prompts: check the rows as the trainers' --task TASK does (exact_match: every "
                        "row has an answer); without it, rows lacking an answer among rows with one are a warning")
    p.add_argument("--show", type=int, default=2, metavar="N", help="examples to print (default 2)")
    p.add_argument("--max_length", type=int, default=1024,
                   help="the trainers' --max_length (default 1024; CPT applies none unless given one)")
    p.add_argument("--max_new_tokens", type=int, default=12,
                   help="with --kind prompts: the trainers' --max_new_tokens, kept free of the context (default 12)")
    p.add_argument("--overlong", choices=("error", "skip", "truncate"), default="error",
                   help="as the trainers' --overlong: what becomes of a row over the limit (default error: a trainer "
                        "stops at the first; here they are counted and left out)")
    p.add_argument("--chat_template", default="", metavar="FILE", help="as the trainers' --chat_template")
    p.add_argument("--chat_template_kwargs", default="", metavar="JSON", help="as the trainers' --chat_template_kwargs")
    p.add_argument("--trust_remote_code", default=False, metavar="BOOL", type=_boolean,
                   help="as the trainers' --trust_remote_code (default: false)")
    p.add_argument("--prompt_field", default="prompt", help="the prompt's column (the trainers' --prompt_field)")
    p.add_argument("--answer_field", default="answer", help="with --kind prompts or sft: the answer's column")
    p.add_argument("--chosen_field", default="chosen", help="with --kind pairs: the preferred reply's column")
    p.add_argument("--rejected_field", default="rejected", help="with --kind pairs: the other reply's column")
    p.add_argument("--completion_field", default="completion", help="with --kind kto: the reply's column")
    p.add_argument("--label_field", default="label", help="with --kind kto: the desirable/undesirable column")
    p.set_defaults(func=cmd_data)
