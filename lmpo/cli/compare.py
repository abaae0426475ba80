"""`lmpo compare`: RL presets and DPO variants from the same SFT start, at a matched budget."""

from __future__ import annotations

import argparse
import re
import shlex
import sys

from lmpo.cli.config import ConfigError, add_arguments, build
from lmpo.teach.refusals import refusal

HELP = "compare PPO, GRPO, DPO, online DPO (or any presets) from the same SFT start at a matched budget"
DESCRIPTION = """Run each method from the task's SFT checkpoint of each seed, at the same number of samples
(--budget samples, the default: completions trained on) or the same wall time (--budget time --minutes M);
print a table of held-out accuracy (mean ± std over seeds), wall time, peak memory, models held and samples
used, and a recommendation computed from it; write compare.json, compare.md, compare.html and plots to --out.
Finished runs are kept: the same command continues an interrupted comparison. See docs/compare.md."""


def cmd_compare(args: argparse.Namespace, flags: dict) -> int:
    from lmpo.teach.compare import CompareConfig, run_compare
    from lmpo.teach.compare.execute import RunFailed
    from lmpo.teach.refusals import error_prefix
    from lmpo.teach.compare.texts import tx
    from lmpo.trainers.preemption import Terminated, sigterm_interrupts

    try:
        cfg = build(CompareConfig, yaml_file=args.config, flags=flags)
    except ConfigError as err:  # a value of the wrong kind, refused before --lang is read into cfg
        if (flags.get("lang") or _config_lang(args.config)) != "zh":
            raise
        args.lang = "zh"  # the prefix too (`main._lang`)
        raise ConfigError(value_error_zh(str(err))) from None
    args.lang = cfg.lang  # `lang: zh` in --config: its error lines in Chinese as well (`main._lang`)
    try:
        with sigterm_interrupts():
            run_compare(cfg, command="lmpo " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    except RunFailed as err:  # the run's own traceback is in its log; the comparison's would say nothing more
        print(f"{error_prefix(cfg.lang)}{err}", file=sys.stderr)
        return 1
    except Terminated:  # the run in progress was stopped and waited for (execute.launch)
        print(tx("terminated", cfg.lang, out=cfg.out), file=sys.stderr)
        return 143
    return 0


def _config_lang(path: str | None) -> str | None:
    """The `lang:` of a --config file, for its own errors: a file that says `lang: zh` is refused in
    Chinese, as the runs it configures report."""
    from lmpo.cli.config import read_yaml

    try:
        lang = read_yaml(path)[0].get("lang") if path else None
    except (ConfigError, OSError, ValueError, AttributeError):
        return None
    return lang if isinstance(lang, str) else None


VALUE_ERRORS_ZH = [(re.compile(pattern), zh) for pattern, zh in [
    (r"^(?P<where>.+?): expected one of (?P<choices>.*), got (?P<value>.*)$", "{where}：{value} 不是可选的值；可选：{choices}"),
    (r"^(?P<where>.+?): expected an integer, got (?P<value>.*)$", "{where}：{value} 不是整数"),
    (r"^(?P<where>.+?): expected a number, got (?P<value>.*)$", "{where}：{value} 不是数"),
    (r"^(?P<where>.+?): expected true or false, got (?P<value>.*)$", "{where}：{value} 不是 true 或 false"),
    (r"^(?P<where>.+?): unknown option(?: \(did you mean (?P<near>.*)\?\))?; valid options: (?P<names>.*)$",
     "{where}：没有这个选项{near}；可用的选项：{names}"),
]]
"""`lmpo.cli.config.coerce`'s refusals of an option's value, in Chinese (as `usage_zh` says argparse's)."""


def value_error_zh(message: str) -> str:
    """`--threads: expected an integer, got 'abc'` in Chinese; another message stays as it is."""
    for pattern, zh in VALUE_ERRORS_ZH:
        if found := pattern.match(message):
            fields = {k: v or "" for k, v in found.groupdict().items()}
            if fields.get("near"):  # the teaching refusals' words for it
                fields["near"] = refusal("did_you_mean", "zh", near=fields["near"])
            return zh.format(**fields)
    return message


def add_parser(sub) -> None:
    from lmpo.teach.compare.plan import CompareConfig

    p = sub.add_parser("compare", help=HELP, description=DESCRIPTION)
    add_arguments(p, CompareConfig)
    p.set_defaults(func=cmd_compare, config_cls=CompareConfig)
