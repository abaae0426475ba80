"""`lmpo eval`: a model's held-out accuracy without training it (see `lmpo.trainers.eval_model`)."""

from __future__ import annotations

import argparse

HELP = "evaluate a model on held-out prompts with a task's grader, as the trainers do, without training it"
DESCRIPTION = """Greedily answer the task's held-out problems (or the rows of --eval_prompts) with MODEL and grade
them with the task's grader, exactly as every trainer evaluates: a stage's final model scores here what its run
reported. With --samples K, K sampled episodes per problem, and pass@1 ... pass@K. Prints accuracy, format
accuracy and how the episodes ended, then the first episodes (failed ones first); --out DIR also writes eval.json
and every episode to DIR/trajectories.jsonl (`lmpo trajectories DIR --failed`). The task's suggested budgets (an
agent task's turns and tokens) apply, under --config and flags."""

# a prompt's last characters shown per episode: its question, not a chat template's system turn with
# the tools' schemas (~800 characters, the same in every episode; `lmpo trajectories` shows it whole)
SHOWN_PROMPT_CHARS = 300
# the task's suggestions for the RL stage that an evaluation takes, by the eval option they set
SUGGESTED = {"eval_max_new_tokens": "max_new_tokens", "max_turns": "max_turns", "max_turn_tokens": "max_turn_tokens",
             "max_parse_errors": "max_parse_errors"}


def cmd_eval(args: argparse.Namespace, flags: dict) -> int:
    from rich.console import Console

    from lmpo.cli.config import build
    from lmpo.reports.trajectories import render_terminal
    from lmpo.trainers.eval_model import EvalConfig, eval_model
    from lmpo.trainers.presets import task_settings

    task = build(EvalConfig, yaml_file=args.config, flags=flags).task  # the file's or the flag's
    suggested = task_settings(task, "rl") if isinstance(task, str) else {}
    preset = {ours: suggested[theirs] for theirs, ours in SUGGESTED.items() if theirs in suggested}
    cfg = build(EvalConfig, preset=preset, yaml_file=args.config, flags=flags)
    run = eval_model(cfg)
    result = run.result
    correct = sum(g.correct for g in result.grades)
    ended = ", ".join(f"{reason} {100 * share:.1f}%" for reason, share in result.terminations.items())
    agent = (f", {100 * result.tool_call_rate:.1f}% called a tool, {result.turns_mean:.2f} turns per episode"
             if result.tool_call_rate or result.turns_mean != 1.0 else "")
    of = f"{correct} of {result.n}" + (f" episodes, {cfg.samples} per problem" if cfg.samples else "")
    print(f"eval: accuracy {100 * result.accuracy:.1f}% ({of}), format accuracy "
          f"{100 * result.format_accuracy:.1f}%{agent}; ended: {ended}; {run.seconds:.1f} s")
    if result.pass_at:
        print("eval: " + ", ".join(f"pass@{k} {100 * v:.1f}%" for k, v in result.pass_at.items()))
    if cfg.out:
        print(f"eval: figures in {cfg.out}/eval.json, every episode in {cfg.out}/trajectories.jsonl")
    if cfg.show:
        shown = sorted(run.rows, key=lambda row: row["correct"] is True)[: cfg.show]  # failed first, in order
        render_terminal(shown, Console(highlight=False), prompt_chars=SHOWN_PROMPT_CHARS)
    return 0


def add_parser(sub) -> None:
    from lmpo.cli.config import add_arguments
    from lmpo.trainers.eval_model import EvalConfig

    p = sub.add_parser("eval", help=HELP, description=DESCRIPTION)
    add_arguments(p, EvalConfig)
    p.set_defaults(func=cmd_eval, config_cls=EvalConfig)
