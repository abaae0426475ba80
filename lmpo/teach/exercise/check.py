"""`lmpo exercise check`: load the user's file, run every probe, report the first difference."""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch
from torch import Tensor

from lmpo.teach.exercise.core import (Case, Exercise, Mismatch, Probe, UserCodeError, as_tuple, difference, fmt,
                                      fmt_case, generic_symptom, user_error)

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

    @property
    def ok(self) -> bool:
        return self.mismatch is None and self.error is None

    def text(self) -> str:
        lines = [f"exercise {self.exercise}: checking {self.function} against {self.reference}"]
        lines += [f"  ok    {name}" for name in self.passed]
        if self.error is not None:
            e = self.error
            where = f" (probe {e.probe}, input: {e.case})" if e.probe else ""
            if e.not_implemented:
                lines.append(f"  TODO  {e.probe or 'import'}: not implemented yet — replace `raise "
                             f"NotImplementedError` with your code{where}")
            else:
                lines.append(f"  ERROR your code raised {e.exception}{where}")
                if e.location:
                    lines.append(f"        at {e.location}")
            return "\n".join(lines)
        if self.mismatch is not None:
            m = self.mismatch
            lines += [f"  FAIL  {m.probe}", "", f"symptom:  {m.symptom}", f"input:    {m.case}",
                      f"          {m.inputs}", f"expected: {m.expected}", f"got:      {m.got}"]
            if m.where:
                lines.append(f"first difference: {m.where}")
            return "\n".join(lines)
        lines.append(f"pass: {self.function} agrees with {self.reference} on every probe")
        return "\n".join(lines)


class ExerciseFileError(ValueError):
    """A file that cannot be checked: missing, or without the exercise's function."""


def load_module(path: Path) -> ModuleType:
    """Import the user's file under a name of its own (exceptions propagate to the caller)."""
    name = f"lmpo_exercise_user_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ExerciseFileError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


def exercise_of_file(path: Path, exercises: dict[str, Exercise]) -> str:
    """The exercise a file is for: its `# lmpo exercise: NAME` line, else the one function it defines."""
    text = path.read_text()
    header = HEADER.search(text)
    if header:
        if header.group(1) not in exercises:
            raise ExerciseFileError(f"{path}: unknown exercise {header.group(1)!r} in its header; "
                                    f"choose one of: {', '.join(exercises)}")
        return header.group(1)
    found = [name for name, ex in exercises.items() if re.search(rf"^def {ex.function}\(", text, re.MULTILINE)]
    if len(found) == 1:
        return found[0]
    raise ExerciseFileError(f"{path}: cannot tell which exercise it is ({'several' if found else 'no'} exercise "
                            f"functions found); pass --name, one of: {', '.join(exercises)}")


def user_function(path: Path, exercise: Exercise) -> Callable | UserCodeError:
    """The user's function from `path`, or the error its import raised."""
    if not path.is_file():
        raise ExerciseFileError(f"{path}: no such file (write one with `lmpo exercise start {exercise.name}`)")
    try:
        module = load_module(path)
    except Exception as err:  # the user's code: reported, not a crash of lmpo
        return user_error(err, str(path), "import", "importing the file")
    fn = getattr(module, exercise.function, None)
    if not callable(fn):
        raise ExerciseFileError(f"{path}: defines no function `{exercise.function}` (exercise {exercise.name})")
    return fn


def check_file(path: str | Path, exercise: Exercise) -> CheckReport:
    path = Path(path).resolve()
    report = CheckReport(exercise.name, f"{path.name}:{exercise.function}", exercise.reference_label)
    fn = user_function(path, exercise)
    if isinstance(fn, UserCodeError):
        report.error = fn
        return report
    return check_function(fn, exercise, str(path), report)


def check_function(fn: Callable, exercise: Exercise, filename: str, report: CheckReport | None = None) -> CheckReport:
    """Run every probe of `exercise` (then random inputs) on `fn`; stop at the first finding."""
    report = report or CheckReport(exercise.name, exercise.function, exercise.reference_label)
    for probe in (*exercise.probes, random_probe(exercise)):
        finding = run_probe(exercise, probe, fn, filename)
        if isinstance(finding, UserCodeError):
            report.error = finding
            return report
        if finding is not None:
            report.mismatch = finding
            return report
        report.passed.append(f"{probe.name:<22} {probe.checks}")
    return report


def random_probe(exercise: Exercise) -> Probe:
    def cases() -> list[Case]:
        gen = torch.Generator().manual_seed(1234)
        return [exercise.random_case(gen) for _ in range(RANDOM_DRAWS)]

    return Probe("random", f"{RANDOM_DRAWS} random inputs of varied sizes", cases)


def run_probe(exercise: Exercise, probe: Probe, fn: Callable, filename: str) -> Mismatch | UserCodeError | None:
    for case in probe.cases():
        raw_expected, ref_leaves = case.call(exercise.reference, probe.grad)
        expected = exercise.project(raw_expected)
        try:
            raw_got, leaves = case.call(fn, probe.grad)
        except Exception as err:  # the user's code: reported, not a crash of lmpo
            return user_error(err, filename, probe.name, case.label)
        got = exercise.project(raw_got)
        diff = difference(expected, got, exercise.outputs, exercise.rtol, exercise.atol)
        if diff is not None:
            symptom = None
            if diff.kind not in ("type", "shape", "dtype") and probe.explain is not None:
                symptom = probe.explain(case, expected, got)
            symptom = symptom or generic_symptom(diff, expected, got, exercise)
            return Mismatch(probe.name, symptom, case.label, fmt_case(case), fmt(expected), fmt(got), diff.where)
        if probe.grad:
            try:
                finding = _gradient_finding(exercise, probe, case, expected, ref_leaves, got, leaves)
            except Exception as err:  # a backward through the user's code can raise too
                return user_error(err, filename, probe.name, case.label)
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
                      got: Any, leaves: dict) -> Mismatch | None:
    ref_grads, user_grads = _grads(expected, ref_leaves), _grads(got, leaves)
    for name in probe.grad:
        r, u = ref_grads[name], user_grads[name]
        shown_r = torch.zeros_like(case.value(name)) if r is None else r
        shown_u = torch.zeros_like(case.value(name)) if u is None else u
        if _zero(r) and not _zero(u):
            symptom = probe.grad_messages.get(name) or (
                f"gradient flows through `{name}`, which the reference treats as a constant (missing "
                f"stop-gradient / detach)")
        elif not _zero(r) and _zero(u):
            symptom = (f"no gradient reaches `{name}`: your result does not depend on it through autograd "
                       f"(a `.detach()`, `.item()` or `torch.no_grad()` too many?)")
        elif _zero(r):
            continue
        elif not bool(torch.isfinite(u).all()) and bool(torch.isfinite(r).all()):
            symptom = (f"your gradient with respect to `{name}` has NaN/inf where the reference's is finite: "
                       f"masked-out positions must be removed with torch.where, not multiplied by 0 "
                       f"(0 × inf = NaN)")
        elif not bool(torch.isclose(u.double(), r.double(), rtol=1e-3, atol=1e-6).all()):
            symptom = (f"the values agree but the gradient with respect to `{name}` differs from the "
                       f"reference's (a term computed from a detached copy, or a mask applied after the loss?)")
        else:
            continue
        return Mismatch(probe.name, symptom, case.label, fmt_case(case), f"d/d{name} = {fmt(shown_r)}",
                        f"d/d{name} = {fmt(shown_u)}", "gradient of sum(weights × output), weights 0.5 … 1.5")
    return None
