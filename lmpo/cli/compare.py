"""`lmpo compare`: RL presets and DPO variants from the same SFT start, at a matched budget."""

from __future__ import annotations

import argparse
import shlex
import sys

from lmpo.cli.config import add_arguments, build

HELP = "compare PPO, GRPO, DPO, online DPO (or any presets) from the same SFT start at a matched budget"
DESCRIPTION = """Run each method from the task's SFT checkpoint of each seed, at the same number of samples
(--budget samples, the default: completions trained on) or the same wall time (--budget time --minutes M);
print a table of held-out accuracy (mean ± std over seeds), wall time, peak memory, models held and samples
used, and a recommendation computed from it; write compare.json, compare.md, compare.html and plots to --out.
Finished runs are kept: the same command continues an interrupted comparison. See docs/compare.md."""


def cmd_compare(args: argparse.Namespace, flags: dict) -> int:
    from lmpo.teach.compare import CompareConfig, run_compare
    from lmpo.trainers.preemption import Terminated, sigterm_interrupts

    cfg = build(CompareConfig, yaml_file=args.config, flags=flags)
    try:
        with sigterm_interrupts():
            run_compare(cfg, command="lmpo " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    except Terminated:  # the run in progress was stopped and waited for (execute.launch)
        print(f"lmpo compare: terminated (SIGTERM); the unfinished run under {cfg.out} starts again "
              f"when the same command is run", file=sys.stderr)
        return 143
    return 0


def add_parser(sub) -> None:
    from lmpo.teach.compare.plan import CompareConfig

    p = sub.add_parser("compare", help=HELP, description=DESCRIPTION)
    add_arguments(p, CompareConfig)
    p.set_defaults(func=cmd_compare, config_cls=CompareConfig)
