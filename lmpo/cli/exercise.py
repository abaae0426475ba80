"""`lmpo exercise`: list the exercises, write a starter file, check a solution against the library,
train with it."""

from __future__ import annotations

import argparse
import importlib.util
import traceback
from pathlib import Path

DESCRIPTION = """Write a core function of post-training yourself (GRPO or RLOO advantages, the PPO clip loss,
loss aggregation, GAE, the k3 KL estimator, the DPO or Bradley–Terry loss), check it against
lmpo's own implementation — the first difference is explained in words, with the input where it
appears — and train with it to see whether it learns.

  lmpo exercise list [--lang zh]
  lmpo exercise start grpo_advantages --out grpo.py [--lang zh]
  lmpo exercise check grpo.py
  lmpo exercise train grpo.py --steps 60

check and train answer in the starter's language (a `# lang: zh` line in the file means Chinese,
none means English); --lang en|zh overrides it."""

LANG_HELP = "language of the report (default: the file's `# lang:` line, else en)"


HELP = "write a core function yourself, check it against lmpo's, train with it"


def add_parser(sub) -> None:
    p = sub.add_parser("exercise", help=HELP,
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    a = actions.add_parser("list", help="the exercises, one line each")
    a.add_argument("--lang", default="en", choices=["en", "zh"], help="language of the summaries")
    a.set_defaults(func=cmd_list)
    a = actions.add_parser("start", help="write the starter file of an exercise",
                           description="Write a Python file with the function's signature, a docstring with the "
                                       "formula, tensor shapes and masks, and `raise NotImplementedError`.")
    a.add_argument("name", help="the exercise (see `lmpo exercise list`)")
    a.add_argument("--out", default=None, metavar="FILE", help="where to write it (default: NAME.py)")
    a.add_argument("--lang", default="en", choices=["en", "zh"], help="language of the explanations")
    a.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    a.set_defaults(func=cmd_start)
    a = actions.add_parser("check", help="test your function against lmpo's; explain the first difference",
                           description="Import FILE's function and compare it with the library's on worked "
                                       "examples, edge cases (equal-reward groups, padding, extreme ratios, empty "
                                       "and single-element groups, float64) and gradients. Exit code 0 when it "
                                       "agrees everywhere, 1 otherwise.")
    a.add_argument("file", help="your Python file")
    a.add_argument("--name", default=None, help="the exercise (default: from the file's `# lmpo exercise:` line)")
    a.add_argument("--lang", default=None, choices=["en", "zh"], help=LANG_HELP)
    a.set_defaults(func=cmd_check)
    a = actions.add_parser("train", help="a short run with your function, and the same with lmpo's",
                           description="Plug your function into its training stage (GRPO-family RL, PPO for gae, "
                                       "DPO for the preference losses), train from the task's SFT checkpoint, and "
                                       "print held-out accuracy before → after, next to the same run with lmpo's "
                                       "function.")
    a.add_argument("file", help="your Python file")
    a.add_argument("--name", default=None, help="the exercise (default: from the file)")
    a.add_argument("--steps", type=int, default=60, help="optimizer steps of each run (default 60)")
    a.add_argument("--seed", type=int, default=0, help="seed of the runs and of the SFT checkpoint (default 0)")
    a.add_argument("--out", default=None, metavar="DIR", help="run directory (default runs/exercise/NAME)")
    a.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    a.add_argument("--eval_problems", "--eval-problems", type=int, default=500,
                   help="held-out problems evaluated (default 500)")
    a.add_argument("--lang", default=None, choices=["en", "zh"], help=LANG_HELP)
    a.set_defaults(func=cmd_train)


def cmd_list(args: argparse.Namespace, flags: dict) -> int:
    from lmpo.teach.exercise import EXERCISES
    from lmpo.teach.exercise.lang import tr

    width = max(len(name) for name in EXERCISES)
    for name, ex in EXERCISES.items():
        print(f"{name:<{width}}  {tr(ex.summary, args.lang)}  [{ex.plug.stage}]")
    return 0


def cmd_start(args: argparse.Namespace, flags: dict) -> int:
    from lmpo.teach.exercise import get_exercise, write_starter
    from lmpo.teach.exercise.lang import msg
    from lmpo.teach.exercise.starter import starter_path

    exercise = get_exercise(args.name, args.lang)
    path = starter_path(exercise, args.out or f"{exercise.name}.py", lang=args.lang, force=args.force)
    write_starter(exercise, path, lang=args.lang, force=True)
    print(msg("start.wrote", args.lang, path=path, function=exercise.function))
    return 0


def _exercise_for(file: str, name: str | None, lang: str):
    from lmpo.teach.exercise import EXERCISES, exercise_of_file, get_exercise
    from lmpo.teach.refusals import refusal

    path = Path(file)
    if path.is_dir():
        raise ValueError(refusal("exercise.is_dir", lang, path=path, example=path / "grpo.py"))
    if not path.is_file():
        raise FileNotFoundError(refusal("exercise.no_file", lang, path=path))
    if importlib.util.spec_from_file_location("lmpo_exercise_probe", path) is None:  # a file Python cannot import
        raise ValueError(refusal("exercise.not_python", lang, path=path))
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:  # said with the file, not as the codec's bare words
        raise ValueError(refusal("exercise.not_utf8", lang, path=path, byte=f"0x{err.object[err.start]:02x}",
                                 offset=err.start)) from None
    return get_exercise(name or exercise_of_file(path, EXERCISES, lang), lang)


def _lang_for(args: argparse.Namespace) -> str:
    """--lang, else the language the file's starter was written in; kept in `args.lang`, the
    language `main` says an error in."""
    from lmpo.teach.exercise.lang import language_of_file

    args.lang = args.lang or language_of_file(args.file)
    return args.lang


def cmd_check(args: argparse.Namespace, flags: dict) -> int:
    from lmpo.teach.exercise import check_file

    lang = _lang_for(args)
    exercise = _exercise_for(args.file, args.name, lang)
    report = check_file(args.file, exercise, lang=lang)
    print(report.text())
    return 0 if report.ok else 1


def cmd_train(args: argparse.Namespace, flags: dict) -> int:
    from lmpo.teach.exercise import check_file
    from lmpo.teach.exercise.check import user_function
    from lmpo.teach.exercise.core import UserCodeError, user_error
    from lmpo.teach.exercise.lang import msg
    from lmpo.teach.exercise.train import TrainOptions, failed_note, figures_table, train_exercise, verdict

    from lmpo.teach.refusals import ready_out

    lang = _lang_for(args)
    exercise = _exercise_for(args.file, args.name, lang)
    opts = TrainOptions(steps=args.steps, seed=args.seed, out=args.out or f"runs/exercise/{exercise.name}",
                        threads=args.threads, eval_problems=args.eval_problems)
    opts.validate(lang)
    ready_out(opts.out, lang)  # before the check and the minutes of training
    report = check_file(args.file, exercise, lang=lang)
    if report.error is not None:
        print(report.text())
        return 1
    if report.ok:
        print(msg("train.check_pass", lang, n=len(report.passed)))
    else:
        print(msg("train.check_fail", lang, probe=report.mismatch.probe, symptom=report.mismatch.symptom))
    path = Path(args.file).resolve()
    fn = user_function(path, exercise, lang)
    if isinstance(fn, UserCodeError):
        print(report.text())
        return 1
    try:
        runs = train_exercise(exercise, fn, opts, lang=lang)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # sys.exit() in the user's code is their failure, not a run that passed
        in_yours = any(frame.filename == str(path) for frame in traceback.extract_tb(err.__traceback__))
        if in_yours:
            error = user_error(err, str(path))
            print(msg("train.user_error", lang, exception=error.exception, location=error.location))
            return 1
        if report.ok or not isinstance(err, Exception):
            raise  # lmpo's own error, reported by main()
        # what the failed check found (a wrong shape, say) broke the trainer that called your function
        cause = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(msg("train.stopped", lang, error=f"{type(err).__name__}: {cause}", symptom=report.mismatch.symptom))
        return 1
    print(figures_table(runs, lang))
    print(verdict(*runs, lang=lang))
    if not report.ok:
        print(failed_note(*runs, steps=opts.steps, lang=lang))
    return 0
