"""`lmpo exercise check`: load the user's file, run every probe, report the first difference."""

from __future__ import annotations

import importlib.util
import re
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch
from torch import Tensor

from lmpo.teach.exercise.core import (Case, Exercise, Mismatch, Probe, UserCodeError, as_tuple, difference, fmt,
                                      fmt_case, generic_symptom, user_error)
from lmpo.teach.exercise.lang import check_lang, msg, tr
from lmpo.teach.refusals import refusal

RANDOM_DRAWS = 20
HEADER = re.compile(r"^#\s*lmpo exercise:\s*(\w+)", re.MULTILINE)


@dataclass
class CheckReport:
    """What `check` found: the probes passed, then the first mismatch or error (if any)."""

    exercise: str
    function: str
    reference: str
    passed: list[str] = field(default_factory=list)
    mismatch: Mismatch | None = None
    error: UserCodeError | None = None
    lang: str = "en"
    """The language of the report's words ("en" or "zh"); also that of `mismatch`'s and `error`'s."""

    @property
    def ok(self) -> bool:
        return self.mismatch is None and self.error is None

    def text(self) -> str:
        say = lambda key, **fields: msg(key, self.lang, **fields)  # noqa: E731
        lines = [say("report.header", exercise=self.exercise, function=self.function, reference=self.reference)]
        lines += [say("report.ok", line=name) for name in self.passed]
        if self.error is not None:
            e = self.error
            where = say("report.where", probe=e.probe, case=e.case) if e.probe else ""
            if e.not_implemented:
                lines.append(say("report.todo", probe=e.probe or "import", where=where))
            else:
                lines.append(say("report.error", exception=e.exception, where=where))
                if e.location:
                    lines.append(say("report.at", location=e.location))
            return "\n".join(lines)
        if self.mismatch is not None:
            m = self.mismatch
            lines += [say("report.fail", probe=m.probe), "", say("report.symptom", text=m.symptom),
                      say("report.input", text=m.case), say("report.inputs", text=m.inputs),
                      say("report.expected", text=m.expected), say("report.got", text=m.got)]
            if m.where:
                lines.append(say("report.first_difference", text=m.where))
            return "\n".join(lines)
        lines.append(say("report.pass", function=self.function, reference=self.reference))
        return "\n".join(lines)


class ExerciseFileError(ValueError):
    """A file that cannot be checked: missing, or without the exercise's function."""


CALL_SECONDS = 10.0
"""Time allowed to one call of the user's code (an import, a call of the function, a backward
through it): the probes' inputs are small, so a call that takes longer is stuck in a loop."""


class TimeLimit(BaseException):
    """The user's code ran past CALL_SECONDS. Not an Exception, so that the user's own `except
    Exception` cannot swallow it."""


@contextmanager
def time_limit(lang: str = "en", seconds: float | None = None):
    """Raise TimeLimit in the code running under it after `seconds` (CALL_SECONDS). Off outside
    the main thread, where no signal can reach it."""
    seconds = CALL_SECONDS if seconds is None else seconds
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum, frame):
        raise TimeLimit(msg("timeout", lang, seconds=f"{seconds:g}"))

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def load_module(path: Path, lang: str = "en") -> ModuleType:
    """Import the user's file under a name of its own (exceptions propagate to the caller)."""
    name = f"lmpo_exercise_user_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ExerciseFileError(refusal("exercise.not_python", lang, path=path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


def exercise_of_file(path: Path, exercises: dict[str, Exercise], lang: str = "en") -> str:
    """The exercise a file is for: its `# lmpo exercise: NAME` line, else the one function it defines."""
    text = path.read_text()
    header = HEADER.search(text)
    names = ", ".join(exercises)
    if header:
        if header.group(1) not in exercises:
            from lmpo.teach.names import did_you_mean

            raise ExerciseFileError(refusal("exercise.header_unknown", lang, path=path, name=header.group(1),
                                            hint=did_you_mean(header.group(1), exercises, lang), names=names))
        return header.group(1)
    found = [name for name, ex in exercises.items() if re.search(rf"^def {ex.function}\(", text, re.MULTILINE)]
    if len(found) == 1:
        return found[0]
    key = "exercise.cannot_tell_several" if found else "exercise.cannot_tell_none"
    raise ExerciseFileError(refusal(key, lang, path=path, names=names))


def user_function(path: Path, exercise: Exercise, lang: str = "en") -> Callable | UserCodeError:
    """The user's function from `path`, or the error its import raised."""
    if path.is_dir():
        raise ExerciseFileError(refusal("exercise.is_dir", lang, path=path, example=path / f"{exercise.name}.py"))
    if not path.is_file():
        raise ExerciseFileError(refusal("exercise.no_file_start", lang, path=path, name=exercise.name))
    try:
        with time_limit(lang):
            module = load_module(path, lang)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # the user's code, sys.exit() included: reported, not a crash or exit of lmpo
        return user_error(err, str(path), "import", msg("case.import", lang))
    fn = getattr(module, exercise.function, None)
    if not callable(fn):
        raise ExerciseFileError(refusal("exercise.no_function", lang, path=path, function=exercise.function,
                                        name=exercise.name))
    return fn


def check_file(path: str | Path, exercise: Exercise, lang: str = "en") -> CheckReport:
    """Check the function of the file at `path`; the report's words in `lang` ("en" or "zh")."""
    path = Path(path).resolve()
    report = CheckReport(exercise.name, f"{path.name}:{exercise.function}", tr(exercise.reference_label, lang),
                         lang=check_lang(lang))
    fn = user_function(path, exercise, lang)
    if isinstance(fn, UserCodeError):
        report.error = fn
        return report
    return check_function(fn, exercise, str(path), report, lang)


def check_function(fn: Callable, exercise: Exercise, filename: str, report: CheckReport | None = None,
                   lang: str = "en") -> CheckReport:
    """Run every probe of `exercise` (then random inputs) on `fn`; stop at the first finding."""
    report = report or CheckReport(exercise.name, exercise.function, tr(exercise.reference_label, lang),
                                   lang=check_lang(lang))
    lang = report.lang
    for probe in (*exercise.probes, random_probe(exercise)):
        finding = run_probe(exercise, probe, fn, filename, lang)
        if isinstance(finding, UserCodeError):
            report.error = finding
            return report
        if finding is not None:
            report.mismatch = finding
            return report
        report.passed.append(f"{probe.name:<22} {tr(probe.checks, lang)}")
    return report


def random_probe(exercise: Exercise) -> Probe:
    def cases() -> list[Case]:
        gen = torch.Generator().manual_seed(1234)
        return [exercise.random_case(gen) for _ in range(RANDOM_DRAWS)]

    return Probe("random", {lang: msg("probe.random", lang, n=RANDOM_DRAWS) for lang in ("en", "zh")}, cases)


def run_probe(exercise: Exercise, probe: Probe, fn: Callable, filename: str,
              lang: str = "en") -> Mismatch | UserCodeError | None:
    for case in probe.cases():
        raw_expected, ref_leaves = case.call(exercise.reference, probe.grad)
        expected = exercise.project(raw_expected)
        passed: dict[str, Any] = {}
        try:
            with time_limit(lang):
                raw_got, leaves = case.call(fn, probe.grad, passed)
        except KeyboardInterrupt:
            raise
        except BaseException as err:  # the user's code, sys.exit() included: reported, not a crash or exit of lmpo
            return user_error(err, filename, probe.name, tr(case.label, lang))
        changed = case.mutated(passed)
        if changed is not None:  # before the outputs: a result returned in the caller's tensor looks right
            return Mismatch(probe.name, msg("mutated", lang, name=changed), tr(case.label, lang), fmt_case(case),
                            f"{changed} = {fmt(case.value(changed))}", f"{changed} = {fmt(passed[changed])}",
                            msg("diff.mutated", lang, name=changed))
        got = exercise.project(raw_got)
        diff = difference(expected, got, exercise.outputs, exercise.rtol, exercise.atol)
        if diff is not None:
            symptom = None
            if diff.kind not in ("type", "shape", "dtype") and probe.explain is not None:
                symptom = probe.explain(case, expected, got)
            symptom = symptom or generic_symptom(diff, expected, got, exercise)
            return Mismatch(probe.name, tr(symptom, lang), tr(case.label, lang), fmt_case(case), fmt(expected),
                            fmt(got), tr(diff.where, lang))
        if probe.grad:
            try:
                with time_limit(lang):
                    finding = _gradient_finding(exercise, probe, case, expected, ref_leaves, got, leaves, lang)
            except KeyboardInterrupt:
                raise
            except BaseException as err:  # a backward through the user's code can raise (or exit) too
                return user_error(err, filename, probe.name, tr(case.label, lang))
            if finding is not None:
                return finding
    return None


def _weights(like: Tensor) -> Tensor:
    """Distinct weights per output element, so that no gradient cancels by symmetry."""
    return torch.linspace(0.5, 1.5, like.numel(), dtype=torch.float64).reshape(like.shape)


def _grads(outputs: Any, leaves: dict[str, Tensor]) -> dict[str, Tensor | None]:
    parts = [o for o in as_tuple(outputs) if isinstance(o, Tensor) and o.requires_grad]
    if not parts:
        return {name: None for name in leaves}
    total = sum((o.double() * _weights(o)).sum() for o in parts)
    grads = torch.autograd.grad(total, list(leaves.values()), allow_unused=True)
    return dict(zip(leaves, grads))


def _zero(g: Tensor | None) -> bool:
    return g is None or not bool((g != 0).any())


def _gradient_finding(exercise: Exercise, probe: Probe, case: Case, expected: Any, ref_leaves: dict,
                      got: Any, leaves: dict, lang: str = "en") -> Mismatch | None:
    ref_grads, user_grads = _grads(expected, ref_leaves), _grads(got, leaves)
    for name in probe.grad:
        r, u = ref_grads[name], user_grads[name]
        shown_r = torch.zeros_like(case.value(name)) if r is None else r
        shown_u = torch.zeros_like(case.value(name)) if u is None else u
        if _zero(r) and not _zero(u):
            given = probe.grad_messages.get(name)
            symptom = tr(given, lang) if given else msg("grad.flows", lang, name=name)
        elif not _zero(r) and _zero(u):
            symptom = msg("grad.none", lang, name=name)
        elif _zero(r):
            continue
        elif not bool(torch.isfinite(u).all()) and bool(torch.isfinite(r).all()):
            given = probe.grad_nan_messages.get(name)
            symptom = tr(given, lang) if given else msg("grad.nan", lang, name=name)
        elif not bool(torch.isclose(u.double(), r.double(), rtol=1e-3, atol=1e-6).all()):
            symptom = msg("grad.differs", lang, name=name)
        else:
            continue
        return Mismatch(probe.name, symptom, tr(case.label, lang), fmt_case(case), f"d/d{name} = {fmt(shown_r)}",
                        f"d/d{name} = {fmt(shown_u)}", msg("diff.gradient", lang))
    return None
