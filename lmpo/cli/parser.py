"""The command line's parser: argparse, with unknown flags reported by the command they were given to.

Plain argparse reports `lmpo train grpo --stepz 10` with the top-level usage (`usage: lmpo [-h]
COMMAND ...`) and no hint. Here the innermost command's parser reports it, with its usage and the
closest flags it does take (`did you mean --steps?`)."""

from __future__ import annotations

import argparse
import contextvars
import difflib
import sys

from lmpo.cli.usage_zh import in_chinese, wants_chinese
from lmpo.names import did_you_mean

_INNERMOST = "_lmpo_innermost_parser"
_ARGV: contextvars.ContextVar[list[str]] = contextvars.ContextVar("lmpo_argv", default=[])


class Parser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` whose sub-commands' parsers are of this class too. A flag is taken
    only whole (`--sft.epoch` is not `--sft.epochs`, as in a YAML config), and an error after a
    usage of more than a screen gives a one-line usage instead (the pipeline's is 340 lines)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        usage = self.format_usage()
        if usage.count("\n") > 12:
            usage = f"usage: {self.prog} [options]  (`{self.prog} --help` lists them)\n"
        if self._speaks_chinese():
            self.exit(2, f"{usage}{self.prog}：错误：{in_chinese(message)}\n")
        self.exit(2, f"{usage}{self.prog}: error: {message}\n")

    def _check_value(self, action, value):
        """argparse's `invalid choice` of a command, stage, action or option value, with the
        closest choice (`lmpo trian`: did you mean 'train'?)."""
        if action.choices is None or value in action.choices:
            return
        choices = ", ".join(map(repr, action.choices))
        hint = did_you_mean(str(value), [str(c) for c in action.choices])
        raise argparse.ArgumentError(action, f"invalid choice: {value!r}{hint} (choose from {choices})")

    def _speaks_chinese(self) -> bool:
        """Given `--lang zh`, and a command that takes it (a teaching command, or one whose
        actions do: `lmpo exercise chek F --lang zh`), or `lmpo` itself (`lmpo explian --lang zh`)."""
        return wants_chinese(_ARGV.get()) and (self.prog == "lmpo" or _takes_lang(self) or any(
            _takes_lang(sub) for action in self._actions if isinstance(action, argparse._SubParsersAction)
            for sub in action.choices.values()))

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if not hasattr(namespace, _INNERMOST):  # a sub-command's parser returned first and set it
            setattr(namespace, _INNERMOST, self)
        return namespace, extras

    def parse_args(self, args=None, namespace=None):
        argv = _ARGV.set(list(sys.argv[1:] if args is None else args))  # the language of an error
        try:
            namespace, extras = self.parse_known_args(args, namespace)
            parser = vars(namespace).pop(_INNERMOST, self)
            if extras:
                parser.error(unrecognized(extras, parser))
            return namespace
        finally:
            _ARGV.reset(argv)


def _takes_lang(parser: argparse.ArgumentParser) -> bool:
    return any("--lang" in action.option_strings for action in parser._actions)


OTHER_NAMES = {
    "num_generations": "group_size", "rloo_k": "group_size", "max_completion_length": "max_new_tokens",
    "response_length": "max_new_tokens", "learning_rate": "lr", "lr_scheduler_type": "lr_schedule",
    "max_grad_norm": "grad_clip", "epsilon": "clip_eps_low", "cliprange": "clip_eps_low",
    "epsilon_high": "clip_eps_high", "steps_per_generation": "num_minibatches",
    "num_mini_batches": "num_minibatches", "num_ppo_epochs": "num_iterations", "kl_coef": "beta",
    "max_steps": "steps", "num_train_epochs": "epochs", "output_dir": "out", "model_name_or_path": "model",
    "lam": "gae_lambda", "cliprange_value": "clip_eps_value",
}
"""Flags TRL (and its older releases) spell differently, for the hint (docs/porting.md has the rest)."""


def unrecognized(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """`unrecognized arguments: ...`, with lmpo's name for a flag TRL spells differently, or else
    the closest known flag, for each unknown one."""
    known = [s for action in parser._actions for s in action.option_strings if s.startswith("--")]
    hints = []
    for arg in extras:
        flag = arg.partition("=")[0]
        if not flag.startswith("--") or flag in known:
            continue
        if hint := suggestion(flag, known, "--"):
            hints.append(f"{flag}: {hint}")
    if any("lmpo calls it" in hint for hint in hints):
        hints.append("docs/porting.md maps TRL's and verl's options to lmpo's")
    more = f" ({'; '.join(hints)})" if hints else ""
    return f"unrecognized arguments: {' '.join(extras)}{more}"


def suggestion(name: str, known: list[str], prefix: str = "") -> str:
    """`lmpo calls it X` for a name TRL spells differently, `did you mean X?` for a near miss, or ''.
    `prefix` is what every known name starts with (`--` for flags); a dotted section (`rl_stage.`)
    carries over to the suggestion."""
    section, _, leaf = name[len(prefix):].rpartition(".")
    ours = prefix + (f"{section}." if section else "") + OTHER_NAMES.get(leaf, "\0")
    if ours in known:
        return f"lmpo calls it {ours}"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
    if close:
        return f"did you mean {close[0]}?"
    same_leaf = [k for k in known if section and k.endswith(f".{leaf}")]  # `--grpo.steps`: the section is wrong
    return f"did you mean {' or '.join(same_leaf[:4])}?" if same_leaf else ""
