"""Reward functions: `fn(task, problems, completions, terminated) -> list[float]`.

The built-in ones call the task's grader, the same one that scores evaluation, so a reward can
never disagree with the reported accuracy. A user's own function is named by its import path,
`package.module:function` (each problem's extra data columns are in `problem.meta`). A score
may be None or NaN for a completion the function cannot judge; see `reward_runner`.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
import math
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from lmpo.envs.base import Problem, Task

RewardFn = Callable[[Task, Sequence[Problem], Sequence[str], Sequence[bool]], list[float]]


def correct_reward(task: Task, problems, completions, terminated) -> list[float]:
    """1 if the answer is right and terminated by EOS, else 0."""
    return [float(task.grade(p, c, t).correct) for p, c, t in zip(problems, completions, terminated)]


def format_reward(task: Task, problems, completions, terminated) -> list[float]:
    """1 if the completion is a well-formed answer terminated by EOS, right or wrong."""
    return [float(task.grade(p, c, t).well_formed) for p, c, t in zip(problems, completions, terminated)]


REWARDS: dict[str, RewardFn] = {"correct": correct_reward, "format": format_reward}
GRADE_FIELDS = {"correct": "correct"}
"""The built-in rewards that are a field of the episode's `Grade`: given the episodes' grades (a
task may judge a whole episode, `grade_trajectory`), the trainers take them from there, as
evaluation's accuracy does. `format` judges the final answer's text, as `task.grade` does."""
LEARNED_REWARD = "rm"  # a trained reward model; its directory is given separately


def parse_reward_weights(spec: str) -> dict[str, float]:
    """`"correct=1.0,format=0.1"` → {"correct": 1.0, "format": 0.1}; names checked."""
    weights: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, eq, value = item.partition("=")
        name = name.strip()
        if name not in REWARDS and name != LEARNED_REWARD and ":" not in name:
            raise ValueError(f"unknown reward function {name!r} in {spec!r}; choose from: "
                             f"{', '.join([*REWARDS, LEARNED_REWARD])}, or give your own as module:function")
        if name in weights:
            raise ValueError(f"reward {name!r} is given twice in {spec!r}; give each reward once, with its weight")
        try:
            weights[name] = float(value) if eq else 1.0
        except ValueError:
            raise ValueError(f"weight of reward {name!r} must be a number, got {value!r}") from None
        if not math.isfinite(weights[name]):
            raise ValueError(f"weight of reward {name!r} must be a finite number, got {value.strip()!r}")
    if not weights:
        raise ValueError("at least one reward function is needed, e.g. 'correct=1.0'")
    return weights


def reward_functions(weights: dict[str, float], reward_model: str = "") -> dict[str, RewardFn]:
    """The callable for each named reward; `rm` loads the reward model at `reward_model`."""
    fns: dict[str, RewardFn] = {}
    for name in weights:
        if name == LEARNED_REWARD:
            if not reward_model:
                raise ValueError("reward 'rm' needs reward_model: the directory of a trained reward model")
            directory = Path(reward_model)
            if (directory / "adapter_config.json").is_file() and not (directory / "config.json").is_file():
                _check_reward_adapter(reward_model)
            elif not (directory / "config.json").is_file():
                raise FileNotFoundError(f"reward_model {reward_model!r} is not a model directory (no config.json)")
            else:
                _check_scoring_head(reward_model)
            from lmpo.envs.data.chat import encode_start
            from lmpo.models.reward_scorer import RewardModelReward

            fns[name] = RewardModelReward(reward_model, encode_prompt=encode_start, **chat_rows(reward_model))
        elif name in REWARDS:
            fns[name] = REWARDS[name]
        else:
            fns[name] = import_reward(name)
    return fns


def chat_rows(reward_model: str) -> dict:
    """`encode_row` and `turn_ends` for a reward model `lmpo train rm` trained on chat rows (its
    lmpo_reward_rows.json says so); {} for text rows: prompt, reply and eos, as lmpo trains on a
    task's pairs and on text pairs, and as a reward model without the file is read (one trained
    elsewhere on conversations takes a file {"rows": "chat", "turn_ends": [ids]})."""
    from lmpo.envs.data.reward_rows import REWARD_ROWS_FILE, chat_reward_row

    record = Path(reward_model) / REWARD_ROWS_FILE
    if not record.is_file():
        return {}
    try:
        rows = json.loads(record.read_text())
    except (OSError, ValueError) as err:
        rows, problem = None, f"not readable JSON ({err})"
    else:
        problem = ""
    if isinstance(rows, dict) and rows.get("rows") in ("chat", "text"):
        turn_ends = rows.get("turn_ends", [])
        if not (isinstance(turn_ends, list) and all(type(t) is int and t >= 0 for t in turn_ends)):
            problem = f"'turn_ends' must be a list of token ids, got {json.dumps(turn_ends)[:60]}"
    elif not problem:
        problem = f"expected an object with 'rows': \"chat\" or \"text\", got {json.dumps(rows)[:60]}"
    if problem:
        raise ValueError(f"reward_model {reward_model!r}: {record}: {problem} (what `lmpo train rm` writes: "
                         f"{{\"rows\": \"chat\" or \"text\", \"turn_ends\": [token ids]}})")
    if rows["rows"] == "text":
        return {}
    return {"encode_row": chat_reward_row, "turn_ends": turn_ends}


def _check_scoring_head(reward_model: str) -> None:
    """A directory saved as another kind of model (a causal LM, say) loads as a sequence
    classifier with a freshly initialised head: its rewards would be noise, with no error. A
    classifier with several labels (`config.json`'s `id2label`) would be read as its first
    label's logit."""
    try:
        config = json.loads((Path(reward_model) / "config.json").read_text())
        architectures = config.get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return  # the loader says what is wrong with it
    if architectures and not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        raise ValueError(f"reward_model {reward_model!r} is a {architectures[0]}, not a reward model: loaded as one it "
                         f"would score with an untrained head, so its rewards would be noise; give a directory "
                         f"written by `lmpo train rm` (or any ...ForSequenceClassification model with one label)")
    labels = config.get("id2label")  # absent: transformers' default, two labels (not written out)
    count = len(labels) if isinstance(labels, dict) else config.get("num_labels", 2 if architectures else None)
    if type(count) is int and count != 1:
        kind = architectures[0] if architectures else "sequence classifier"
        names = (", ".join(map(str, labels.values())) if isinstance(labels, dict) else
                 "config.json names none: transformers' default" if "num_labels" not in config else "num_labels")
        raise ValueError(f"reward_model {reward_model!r} is a {kind} with {count} labels ({names[:80]}), not a reward "
                         f"model: a reward is one score, and read as one its reward would be the first label's logit "
                         f"alone; give a directory written by `lmpo train rm` (or any ...ForSequenceClassification "
                         f"model with one label)")


def _check_reward_adapter(reward_model: str) -> None:
    """A LoRA reward model's directory (`lmpo train rm --lora_r N`) holds its adapter, score head
    included; it loads on top of the base model it names, which must be a local directory."""
    try:
        config = json.loads((Path(reward_model) / "adapter_config.json").read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"reward_model {reward_model!r}: adapter_config.json is not readable JSON: {err}") from None
    if config.get("task_type") != "SEQ_CLS":
        task = config.get("task_type") or "another task"
        raise ValueError(f"reward_model {reward_model!r} is an adapter for {task}, not for a reward model "
                         f"(SEQ_CLS): give a directory written by `lmpo train rm`")
    base = config.get("base_model_name_or_path") or ""
    if not (Path(base) / "config.json").is_file() and not (Path(base) / "adapter_config.json").is_file():
        raise ValueError(f"reward_model {reward_model!r} is an adapter on {base!r}, which is not a local model "
                         f"directory, so it cannot be loaded here; train the reward model with --lora_merge true "
                         f"and give its merged/ directory")


def import_reward(path: str) -> RewardFn:
    """`package.module:function` or `path/to/file.py:function` → the function, with errors that
    say which part is wrong. A file is loaded as `--task path/to/file.py:Class` loads one (and the
    reward workers load it again under the same module name)."""
    module_name, _, attr = path.rpartition(":")
    if module_name.endswith(".py"):
        from lmpo.envs.plugins import load_file

        module = load_file(module_name, path, "reward function")
    else:
        from lmpo.envs.plugins import on_module_path

        on_module_path(os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise ValueError(f"reward function {path!r}: cannot import module {module_name!r}: {err}"
                             f"{' (a file is named with its .py)' if '/' in module_name else ''}") from None
        except Exception as err:  # the module's own code failed: a SyntaxError, an error at import
            what = f"{err.msg} ({err.filename}:{err.lineno})" if isinstance(err, SyntaxError) else str(err)
            raise ValueError(f"reward function {path!r}: importing module {module_name!r} failed: "
                             f"{type(err).__name__}: {what}") from None
    if not hasattr(module, attr):
        raise ValueError(f"reward function {path!r}: module {module_name!r} has no function {attr!r}"
                         f"{_suggestion(module, attr)}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise ValueError(f"reward function {path!r}: {attr!r} in module {module_name!r} is "
                         f"{_article(type(fn).__name__)} {type(fn).__name__}, not a function")
    _check_signature(fn, path)
    return fn


def _suggestion(module, attr: str) -> str:
    """`(did you mean 'ok'?); its functions: ...` for a name the module lacks."""
    names = sorted(name for name, value in vars(module).items() if not name.startswith("_") and callable(value)
                   and not isinstance(value, type) and _defined_in(value, module))
    if not names:
        return "; it defines no functions"
    close = difflib.get_close_matches(attr, names, n=1)
    shown = ", ".join(names[:30]) + (f" and {len(names) - 30} more" if len(names) > 30 else "")
    return f"{f' (did you mean {close[0]!r}?)' if close else ''}; its functions: {shown}"


def _defined_in(value, module) -> bool:
    """Defined in `module`, not imported into it (`from math import sqrt`); a callable instance
    counts where its class is defined."""
    owner = value if inspect.isfunction(value) else type(value)
    return getattr(owner, "__module__", None) == module.__name__


def _article(noun: str) -> str:
    return "an" if noun[:1].lower() in "aeiou" else "a"


def _check_signature(fn: Callable, path: str) -> None:
    """Refuse, before training, a callable that cannot take the four arguments every call
    passes: each call would raise TypeError, and every completion of the run would be unscorable."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a built-in without a signature: its first call will say
        return
    try:
        signature.bind(None, None, None, None)
    except TypeError as err:
        if isinstance(fn, type):
            what = (f"{fn.__name__} is a class, and calling it makes an instance (its constructor takes "
                    f"{signature}); define an instance in the module, `scorer = {fn.__name__}()`, and name that")
        else:
            what = f"it takes {signature} ({err})"
        raise ValueError(f"reward function {path!r} cannot be called as fn(task, problems, completions, "
                         f"terminated): {what}") from None
