"""The `lmpo` command: a table of command → typed function; flags come from config dataclasses."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Callable

from lmpo.cli.config import FILE_PATHS, ConfigError, add_arguments, from_config_file
from lmpo.cli.errors import RunDirError, error_line, one_line, runtime_errors
from lmpo.envs.data.report import ON_COMMAND_LINE
from lmpo.cli.parser import Parser
from lmpo.cli.pipeline import PIPELINE_OWNED, cmd_pipeline
from lmpo.cli.train import cmd_train
from lmpo.teach.refusals import error_prefix

DESCRIPTION = """lmpo — language-model policy optimisation.

Post-train language models with RL and preference optimisation. `lmpo pipeline` runs
continued pre-training → SFT → GRPO on the embedded task and model, on a CPU, in minutes."""


def _quiet_transformers() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def cmd_report(args: argparse.Namespace, flags: dict) -> int:
    from lmpo.reports import write_report
    from lmpo.reports.report import unfinished_note

    try:
        print(write_report(args.run_dir))
    except OSError as err:
        if err.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or not err.filename:
            raise
        from lmpo.trainers.fs_faults import fs_error

        # the report lives beside the metrics it reads: an archived or shared run is reported from a copy
        print(f"lmpo: error: {fs_error(err.filename, err)}; lmpo report writes its report/ inside the run directory: "
              f"copy the run somewhere writable (cp -r {args.run_dir} /tmp/) and report the copy", file=sys.stderr)
        return 1
    note = unfinished_note(Path(args.run_dir))
    if note:
        print(f"note: {note}")
    return 0


def cmd_trajectories(args: argparse.Namespace, flags: dict) -> int:
    """Print the last --last trajectories of a run (or a pipeline's stage), sources colour-coded."""
    from rich.console import Console

    from lmpo.reports.trajectories import find_trajectories, last_trajectories, render_terminal, unsaved_filter

    if args.last < 0:
        raise ValueError(f"--last must be 0 (all) or more, got {args.last}")
    path = find_trajectories(args.run_dir, stage=args.stage)
    shown, matching = last_trajectories(path, args.last, step=args.step, phase=args.phase, failed_only=args.failed)
    if not matching and (unsaved := unsaved_filter(path, args.step, args.phase)):
        raise ValueError(unsaved)  # a step or phase the run never saved is the user's slip, not an empty result
    console = Console()
    console.print(f"{path}: showing {len(shown)} of {matching} matching trajectories",
                  style="dim", highlight=False, markup=False, soft_wrap=True)
    render_terminal(shown, console)
    return 0


def cmd_doctor(args: argparse.Namespace, flags: dict) -> int:
    """What limits training in a run: each finding with its metric, value, threshold and remedy."""
    from lmpo.reports.doctor import format_findings
    from lmpo.cli.pipeline import in_pipeline_flags
    from lmpo.reports.doctor_runs import diagnose_run, unfinished_notes

    findings = in_pipeline_flags(diagnose_run(args.run_dir), Path(args.run_dir))
    text = format_findings(findings)
    print(text or f"no problems found in: {', '.join(findings)}")
    healthy = [stage for stage, items in findings.items() if not items]
    if text and healthy:
        print(f"nothing to report in: {', '.join(healthy)}")
    for stage, note in unfinished_notes(args.run_dir).items():
        print(f"note: {stage}: {note}")
    unreadable = [stage for stage, items in findings.items() if any(f.severity == "error" for f in items)]
    if unreadable:  # the other runs were diagnosed; these were not, an error of the input as for one run
        print(f"lmpo: error: could not diagnose: {', '.join(unreadable)}", file=sys.stderr)
        return 2
    return 0


def cmd_presets(args: argparse.Namespace, flags: dict) -> int:
    from lmpo.trainers.presets import RL_PRESETS

    if args.show:
        return _show_preset(args.show, args.task)
    if args.task:
        raise ConfigError("--task goes with --show NAME: the task's settings under that preset")
    for name, preset in RL_PRESETS.items():
        parts = ", ".join(f"{k}={v}" for k, v in preset.settings.items())
        print(f"{name:10s} {parts}\n{'':10s} source: {preset.source}")
    return 0


def _show_preset(name: str, task: str | None) -> int:
    """Every option of `lmpo train NAME [--task T]` as resolved before the user's own flags:
    RLConfig's defaults < the task's suggested settings < the preset; grouped by where each came from."""
    import dataclasses

    from lmpo.trainers.presets import rl_preset, task_settings
    from lmpo.trainers.rl_config import RLConfig

    preset = rl_preset(name)
    suggested = {}
    if task:
        from lmpo.envs import make_task

        make_task(task)  # a bad task spec is an error here, not an empty list of settings
        suggested = {k: v for k, v in task_settings(task, "rl").items() if k in RLConfig.__dataclass_fields__}
        suggested = {"task": task, **suggested}
    default = RLConfig()
    shared = {f.name for base in RLConfig.__bases__ for f in dataclasses.fields(base)}
    names = [f.name for f in dataclasses.fields(RLConfig)]
    names = [n for n in names if n not in shared] + [n for n in names if n in shared]  # the RL options first
    groups = [(f"set by the preset {name} ({preset.source})", [n for n in names if n in preset.settings]),
              (f"suggested by the task {task}" + (" (the preset wins over it)" if task else ""),
               [n for n in names if n in suggested and n not in preset.settings]),
              ("defaults (RLConfig)", [n for n in names if n not in preset.settings and n not in suggested])]
    print(f"every option of `lmpo train {name}{f' --task {task}' if task else ''}` before your own flags:")
    for title, group in groups:
        if not group:
            continue
        print(f"\n{title}:")
        for option in group:
            value = preset.settings.get(option, suggested.get(option, getattr(default, option)))
            changed = "" if value == getattr(default, option) else f"  (default {getattr(default, option)!r})"
            print(f"  {option:<28} {value!r}{changed}")
    return 0


# Commands that live in a module of their own; each module has `HELP` and `add_parser(subparsers)`,
# and keeps its heavy imports inside `add_parser` and the command function.
COMMAND_MODULES: dict[str, str] = {
    "exercise": "lmpo.cli.exercise",
    "explain": "lmpo.cli.explain",
    "factcheck": "lmpo.cli.factcheck",
    "compare": "lmpo.cli.compare",
    "data": "lmpo.cli.data",
    "eval": "lmpo.cli.evaluate",
}


TRAINING_COMMANDS = ("pipeline", "train")
"""Their options come from the config dataclasses, whose modules import torch and transformers (seconds)."""


def make_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command table. Options are added to `command` only (None: to every command):
    many come from config dataclasses whose modules import torch and transformers, seconds that
    `lmpo --help`, `lmpo doctor` or `lmpo report` would otherwise spend first."""
    parser = Parser(prog="lmpo", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    if command is None or command in TRAINING_COMMANDS:
        _add_training_commands(sub)
    else:
        sub.add_parser("pipeline", help=PIPELINE_HELP)
        sub.add_parser("train", help=TRAIN_HELP)
    _add_run_commands(sub)
    for name, path in COMMAND_MODULES.items():
        module = importlib.import_module(path)
        if command is None or command == name:
            module.add_parser(sub)
        else:
            sub.add_parser(name, help=module.HELP)
    return parser


PIPELINE_HELP = "CPT → SFT → RL on the embedded task; prints held-out accuracy per stage"
TRAIN_HELP = "run one training stage"
PIPELINE_DESCRIPTION = (
    "Run continued pre-training, SFT and an RL preset; write summary.json and a report. Each option's "
    "default below is the value the default pipeline runs with (--task sort_digits, --rl grpo, --adaptive "
    "true), resolved in layers, each over the one before: the option's own default < the adaptive budgets "
    "< the task's suggested settings < the --rl preset < your options. Another --task, --rl or --adaptive "
    "false can change a default shown; `lmpo presets --show NAME --task TASK` prints the RL options a "
    "preset and a task resolve to.")


def pipeline_defaults() -> tuple[dict, dict[str, str]]:
    """The options `lmpo pipeline` runs with when given none, each that is not its field's default
    with the layer that set it (`resolve_pipeline`)."""
    from lmpo.trainers.pipeline import ADAPTIVE_BUDGETS, PipelineConfig, flat_options, resolve_pipeline
    from lmpo.trainers.presets import pipeline_task_settings, rl_preset

    base = PipelineConfig()
    own, resolved = flat_options(base), flat_options(resolve_pipeline(base))
    layers = [(f"set by the --rl {base.rl} preset", {f"rl_stage.{k}" for k in rl_preset(base.rl).settings}),
              (f"set by task {base.task}", set(pipeline_task_settings(base.task))),
              ("set by the adaptive budgets", set(ADAPTIVE_BUDGETS))]  # the later layer wins: first here
    sources = {name: next((said for said, names in layers if name in names), "resolved")
               for name, value in resolved.items() if value != own[name]}
    return resolved, sources


def _add_training_commands(sub) -> None:
    from lmpo.trainers.online_dpo import unlisted as online_dpo_unlisted
    from lmpo.trainers.pipeline import PipelineConfig
    from lmpo.trainers.presets import RL_PRESETS
    from lmpo.trainers.rl_config import RLConfig
    from lmpo.trainers.supervised import CPTConfig, SFTConfig

    p = sub.add_parser("pipeline", help=PIPELINE_HELP, description=PIPELINE_DESCRIPTION)
    # the options the pipeline sets for every stage are refused inside a section: not offered either,
    # nor those the online DPO stage refuses
    defaults, sources = pipeline_defaults()
    add_arguments(p, PipelineConfig, defaults=defaults, sources=sources,
                  unlisted=lambda name: name.partition(".")[2] in PIPELINE_OWNED or (
                      name.partition(".")[0] == "online_dpo" and online_dpo_unlisted(name.partition(".")[2])))
    p.set_defaults(func=cmd_pipeline, config_cls=PipelineConfig)

    train = sub.add_parser("train", help=TRAIN_HELP, description="Run one training stage.")
    train_sub = train.add_subparsers(dest="stage", metavar="STAGE", required=True)
    stages = {"cpt": (CPTConfig, "continued pre-training on the task's corpus (loss on every token)"),
              "sft": (SFTConfig, "supervised fine-tuning on demonstrations (loss on completion tokens only)")}
    for name, (cls, text) in stages.items():
        sp = train_sub.add_parser(name, help=text, description=text)
        add_arguments(sp, cls)
        sp.set_defaults(func=cmd_train(name), config_cls=cls)
    from lmpo.trainers.reward_model import RewardModelConfig

    text = "reward model (Bradley–Terry) on the task's preference pairs; held-out pairwise accuracy"
    sp = train_sub.add_parser("rm", help=text, description=text)
    add_arguments(sp, RewardModelConfig)
    sp.set_defaults(func=cmd_train("rm"), config_cls=RewardModelConfig)
    from lmpo.trainers.preference import PreferenceConfig

    text = ("offline preference optimisation (--loss dpo|ipo|simpo|..., 16 losses and weighted sums of them) "
            "on the task's preference pairs")
    sp = train_sub.add_parser("dpo", help=text, description=text)
    add_arguments(sp, PreferenceConfig)
    sp.set_defaults(func=cmd_train("dpo"), config_cls=PreferenceConfig)
    from lmpo.trainers.online_dpo import OnlineDPOConfig

    text = "online (iterative) DPO: sample, rank by verifier or reward model, best vs worst pairs, train, repeat"
    sp = train_sub.add_parser("online_dpo", help=text, description=text)
    add_arguments(sp, OnlineDPOConfig, unlisted=online_dpo_unlisted)  # parsed, so that the refusal says why
    sp.set_defaults(func=cmd_train("online_dpo"), config_cls=OnlineDPOConfig)
    from lmpo.trainers.rft import RFTConfig

    text = "rejection-sampling fine-tuning (RAFT / expert iteration): sample n, keep what the verifier accepts, SFT, repeat"
    sp = train_sub.add_parser("rft", help=text, description=text)
    add_arguments(sp, RFTConfig)
    sp.set_defaults(func=cmd_train("rft"), config_cls=RFTConfig)
    from lmpo.trainers.kto import KTOConfig
    from lmpo.trainers.orpo import ORPOConfig

    for name, cls, text in (("kto", KTOConfig, "KTO on unpaired desirable / undesirable completions, against a reference"),
                            ("orpo", ORPOConfig, "ORPO: SFT plus an odds-ratio preference term on pairs, no reference")):
        sp = train_sub.add_parser(name, help=text, description=text)
        add_arguments(sp, cls)
        sp.set_defaults(func=cmd_train(name), config_cls=cls)
    for name, preset in {**RL_PRESETS, "rl": None}.items():
        text = (f"RL with the {name} preset ({preset.source})" if preset
                else "RL with any preset (--preset NAME) and any part overridden")
        sp = train_sub.add_parser(name, help=text, description=text)
        if preset is None:
            sp.add_argument("--preset", default=argparse.SUPPRESS, choices=list(RL_PRESETS),
                            help="preset to start from (default: grpo, whose values the defaults below show)")
        # `lmpo train rl` starts from grpo unless given --preset: its help shows grpo's defaults
        add_arguments(sp, RLConfig, defaults=(preset or RL_PRESETS["grpo"]).settings)
        sp.set_defaults(func=cmd_train(name), config_cls=RLConfig)


MODEL_FREE = ("report", "trajectories", "doctor", "presets")
"""Commands that load no model: transformers is not imported for them."""


def _add_run_commands(sub) -> None:
    """The commands that read a run directory."""
    p = sub.add_parser("report", help="draw a run's curves to PNG files and an HTML page",
                       description="Write RUN_DIR/report/report.html and PNG plots from metrics.jsonl / summary.json.")
    p.add_argument("run_dir", help="a run directory (or a pipeline directory)")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("trajectories", help="print an agent run's saved trajectories, sources colour-coded",
                       description="Print trajectories from RUN_DIR/trajectories.jsonl: prompt, template, model "
                                   "and environment text told apart (by colour, or by «model» and ⟦env⟧ markers "
                                   "without colour).")
    p.add_argument("run_dir", help="a run directory (or a pipeline directory: its last stage with trajectories)")
    p.add_argument("--step", type=int, default=None, metavar="N", help="only trajectories of this RL step")
    p.add_argument("--last", type=int, default=3, metavar="K", help="show the last K matching ones (0: all; default 3)")
    p.add_argument("--phase", choices=["train", "eval"], default=None, help="only training or only evaluation episodes")
    p.add_argument("--failed", action="store_true", help="only episodes not graded correct")
    p.add_argument("--stage", default=None, metavar="NAME", help="in a pipeline directory, the stage to show")
    p.set_defaults(func=cmd_trajectories)
    p = sub.add_parser("doctor", help="say what limits training in a run, with evidence and remedies",
                       description="Read RUN_DIR's metrics (a stage directory, every stage of a pipeline "
                                   "directory, or every run under a directory of runs: lmpo compare's "
                                   "SEED/METHOD/STAGE, lmpo factcheck's runs/NAME; every run up to four levels down) and name what limits training: no signal, too sparse or easy a "
                                   "reward, entropy collapse, KL runaway, length growth or truncation, reward "
                                   "hacking, a run getting worse, high clip fraction, a loss or KL gone to inf/NaN, non-finite skips, unscorable rewards.")
    p.add_argument("run_dir", help="a run directory (or a pipeline directory, or one holding runs further in)")
    p.set_defaults(func=cmd_doctor)
    p = sub.add_parser("presets", help="list the RL presets, their parts and their sources",
                       description="List the RL presets, what each sets, and the paper it comes from; "
                                   "--show NAME prints every option of one preset, resolved.")
    p.add_argument("--show", metavar="NAME", default=None,
                   help="print every RL option as the preset NAME resolves it, marking what the preset sets")
    p.add_argument("--task", metavar="TASK", default=None,
                   help="with --show: also apply TASK's suggested settings (under the preset), as `lmpo train` does")
    p.set_defaults(func=cmd_presets)


def _plain_lmpo_warnings(lang: Callable[[], str] = lambda: "en") -> None:
    """lmpo's own warnings (a metrics file's truncated last line, ...) as one `lmpo: warning:` line
    (its prefix in the command's language, `lang()`), not Python's file, line number and source
    line; other libraries' warnings stay as they are."""
    package = str(Path(__file__).resolve().parent.parent) + os.sep
    default = getattr(warnings.showwarning, "python_default", warnings.showwarning)

    def show(message, category, filename, lineno, file=None, line=None):
        if str(filename).startswith(package):
            print(f"{error_prefix(lang(), 'warning')}{message}", file=file or sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    show.python_default = default
    warnings.showwarning = show


NEGATIVE_NUMBER = re.compile(r"^-(inf(inity)?|(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)$", re.IGNORECASE)
"""A negative number argparse takes for an option: in scientific notation (`-1e-4`, `-.5e3`) or
infinite (`-inf`, as `--accept_threshold -inf`)."""


def _joined_negatives(argv: list[str]) -> list[str]:
    """`--lr -1e-4` as `--lr=-1e-4`, so the option's own check says what is wrong with the value
    (argparse reads only `-4` and `-0.5` as numbers: `-1e-4` and `-inf` made the option "expected
    one argument")."""
    out: list[str] = []
    for arg in argv:
        if NEGATIVE_NUMBER.match(arg) and out and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    FILE_PATHS.clear()  # main() is called again in tests: a file's values are this command's only
    on_command_line = ON_COMMAND_LINE.set(True)
    try:
        return _main(argv)
    finally:
        ON_COMMAND_LINE.reset(on_command_line)


def _main(argv: list[str] | None) -> int:
    args = None
    try:  # Ctrl-C in the first seconds (building the parser imports torch) is said as any other
        argv = _joined_negatives(sys.argv[1:] if argv is None else list(argv))
        args = make_parser(argv[0] if argv else "").parse_args(argv)
        flags = {k: v for k, v in vars(args).items()
                 if k not in ("func", "config_cls", "command", "stage", "config", "run_dir")}
        if args.command not in MODEL_FREE:
            _quiet_transformers()
        _plain_lmpo_warnings(lambda: _lang(args))
        return args.func(args, flags)
    except (ConfigError, ValueError, FileNotFoundError, RunDirError) as err:
        print(error_line(err, _lang(args), from_config_file(str(err))), file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before runtime_errors(), which imports torch: perhaps the import interrupted
        print(error_prefix(_lang(args), "interrupted"), file=sys.stderr)
        return 130
    except SystemExit:  # --help or a usage error: not worth importing torch for runtime_errors()
        raise
    except BrokenPipeError:  # `lmpo ... | head` closed the pipe: nothing is wrong, and nothing more is read
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error as Python exits
        return 141  # 128 + SIGPIPE, as a command killed by it
    except runtime_errors() as err:  # a fault met while training (a reward that never scores, a full disk)
        print(error_line(err, _lang(args), one_line(err)), file=sys.stderr)
        return 1


def _lang(args: argparse.Namespace | None) -> str:
    """The language the command answers in: its --lang (a teaching command's; `lmpo exercise check`
    sets it from the file's `# lang:` line), else English."""
    return getattr(args, "lang", None) or "en"


if __name__ == "__main__":
    sys.exit(main())
