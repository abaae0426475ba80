"""The records of an exercise, and how a user's function is compared with the library's.

An `Exercise` names the library function it is checked against (taken from `lmpo.algos`, through
its registry where it has one), the text of the starter file, a generator of random inputs and a
list of `Probe`s. A probe feeds both functions the same inputs and, on a difference, names the
mistake's symptom in words; the first difference stops the check.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

from lmpo.teach.exercise.lang import Text, both, msg, tr
from lmpo.teach.exercise.plug import Plug


@dataclass(frozen=True)
class Case:
    """One input to both functions: positional arguments by name, then keyword options."""

    label: Text
    """What this input is, in words (shown when the user's function differs on it), per language."""
    args: dict[str, Any]
    """Positional arguments, by the parameter names of the starter's signature."""
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments (e.g. ``beta``, ``clip_eps_low``)."""
    digits: int = 5
    """Significant digits the input is shown with: more where 5 would hide what the case is about."""

    def value(self, name: str) -> Any:
        return self.args[name] if name in self.args else self.options[name]

    def call(self, fn: Callable, grad: tuple[str, ...] = (),
             passed: dict[str, Any] | None = None) -> tuple[Any, dict[str, Tensor]]:
        """``fn`` on fresh copies of the inputs, those named in ``grad`` as leaves needing grad;
        ``passed``, when given, receives the copies by name (to see what ``fn`` did to them)."""
        leaves = {name: self.value(name).detach().clone().requires_grad_(True) for name in grad}
        inputs = {name: leaves.get(name, _copy(value)) for name, value in (*self.args.items(), *self.options.items())}
        if passed is not None:
            passed.update(inputs)
        args = [inputs[name] for name in self.args]
        options = {name: inputs[name] for name in self.options}
        return fn(*args, **options), leaves

    def mutated(self, passed: dict[str, Any]) -> str | None:
        """The first input tensor that differs, after the call, from the case's own (never passed) copy."""
        for name, after in passed.items():
            before = self.value(name)
            if isinstance(before, Tensor) and not _unchanged(before, after):
                return name
        return None


def _unchanged(before: Tensor, after: Any) -> bool:
    if not isinstance(after, Tensor) or after.shape != before.shape or after.dtype != before.dtype:
        return False
    a, b = after.detach(), before.detach()
    same = a == b
    if a.dtype.is_floating_point:
        same |= a.isnan() & b.isnan()
    return bool(same.all())


def _copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, Tensor) else value


Explainer = Callable[[Case, Any, Any], "Text | None"]
"""(the case, the reference's output, the user's output) -> the symptom in words (per language), or None."""


@dataclass(frozen=True)
class Probe:
    """A named check that detects one kind of mistake."""

    name: str
    checks: Text
    """What the probe checks, one line (per language)."""
    cases: Callable[[], list[Case]]
    explain: Explainer | None = None
    """Names the symptom of a difference; None, or returning None, falls back to generic wording."""
    grad: tuple[str, ...] = ()
    """If set, the probe compares gradients of the output with respect to these arguments."""
    grad_messages: dict[str, Text] = field(default_factory=dict)
    """Per argument, the symptom when gradient reaches it although the reference's does not."""
    grad_nan_messages: dict[str, Text] = field(default_factory=dict)
    """Per argument, the symptom when the values agree but its gradient is NaN/inf where the reference's is not."""


@dataclass(frozen=True)
class Exercise:
    """One function to write, checked against the library's."""

    name: str
    summary: Text
    """One line, for `lmpo exercise list` and the starter's header (per language)."""
    function: str
    """The name of the function the user writes."""
    signature: str
    """Its `def` line, as in the starter file."""
    reference: Callable
    """The library's function (the registry's entry where there is a registry)."""
    reference_label: Text
    """How the reference is named in reports, e.g. ``lmpo.algos.ADVANTAGES.get("grpo")``."""
    doc: dict[str, str]
    """The starter's docstring body per language ("en", "zh"): formula, shapes, masks."""
    random_case: Callable[[torch.Generator], Case]
    probes: tuple[Probe, ...]
    outputs: tuple[str, ...] = ("output",)
    """Names of the compared outputs (one, or several when the function returns a tuple)."""
    project: Callable[[Any], Any] = lambda out: out
    """The comparable part of an output (e.g. the loss of a ``(loss, figures)`` pair)."""
    rtol: float = 1e-4
    atol: float = 1e-5
    plug: Plug | None = None
    """How `lmpo exercise train` plugs the function into a training stage."""
    preamble: str = ""
    """Helper imports the starter needs besides torch."""


@dataclass(frozen=True)
class Mismatch:
    """The first input on which the user's function differs from the reference (its texts in the
    language of the check)."""

    probe: str
    symptom: str
    case: str
    inputs: str
    expected: str
    got: str
    where: str = ""


@dataclass(frozen=True)
class UserCodeError:
    """An exception raised by the user's code, located in the user's file."""

    probe: str
    case: str
    exception: str
    location: str
    not_implemented: bool = False


def user_error(err: BaseException, filename: str, probe: str = "", case: str = "") -> UserCodeError:
    """The exception with the deepest traceback line that lies in the user's file."""
    frames = traceback.extract_tb(err.__traceback__)
    own = [f for f in frames if f.filename == filename] or frames[-1:]
    location = ""
    if own:
        f = own[-1]
        location = f"{f.filename}:{f.lineno}: {(f.line or '').strip()}"
    if isinstance(err, SyntaxError) and err.lineno:
        location = f"{err.filename}:{err.lineno}: {(err.text or '').strip()}"
    return UserCodeError(probe, case, f"{type(err).__name__}: {err}", location,
                         isinstance(err, NotImplementedError))


# ---------------------------------------------------------------- formatting


def fmt(value: Any, digits: int = 5) -> str:
    """A short, exact-enough rendering of a tensor, number or tuple."""
    if isinstance(value, tuple):
        return "(" + ", ".join(fmt(v, digits) for v in value) + ")"
    if isinstance(value, Tensor):
        if value.dtype == torch.bool or not value.dtype.is_floating_point:
            return str(value.tolist())
        return _fmt_list(value.detach().double().tolist(), digits)
    if isinstance(value, float):
        return f"{value + 0.0:.{digits}g}"
    return repr(value)


def _fmt_list(x: Any, digits: int) -> str:
    if isinstance(x, list):
        return "[" + ", ".join(_fmt_list(v, digits) for v in x) + "]"
    return f"{x + 0.0:.{digits}g}"  # + 0.0 turns -0.0 into 0.0


def fmt_case(case: Case) -> str:
    shown = {**case.args, **case.options}
    parts = [f"{k}={fmt(v, case.digits)}" for k, v in shown.items()]
    return ", ".join(parts)


# ---------------------------------------------------------------- comparing


@dataclass(frozen=True)
class Difference:
    kind: str
    """"type", "shape", "dtype", "nan" or "value"."""
    output: str
    where: Text


def as_tuple(out: Any) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def difference(expected: Any, got: Any, names: tuple[str, ...], rtol: float, atol: float) -> Difference | None:
    """The first way `got` differs from `expected` (outputs compared in order), or None."""
    exp_parts, got_parts = as_tuple(expected), as_tuple(got)
    if len(got_parts) != len(exp_parts):
        return Difference("type", names[0], _both("diff.count", n=len(exp_parts), names=", ".join(names),
                                                  got=len(got_parts)))
    for name, e, g in zip(names, exp_parts, got_parts):
        if not isinstance(g, Tensor):
            return Difference("type", name, _both("diff.type", name=name, got=type(g).__name__))
        if g.shape != e.shape:
            return Difference("shape", name, _both("diff.shape", name=name, expected=tuple(e.shape),
                                                   got=tuple(g.shape)))
        if g.dtype != e.dtype:
            return Difference("dtype", name, _both("diff.dtype", name=name, expected=e.dtype, got=g.dtype))
        ed, gd = e.detach().double(), g.detach().double()
        bad_nan = ~torch.isfinite(gd) & torch.isfinite(ed)
        if bad_nan.any():
            return Difference("nan", name, _both("diff.value", name=name, index=_index(bad_nan),
                                                 expected=fmt(ed[bad_nan][0].item()), got=gd[bad_nan][0].item()))
        close = torch.isclose(gd, ed, rtol=rtol, atol=atol, equal_nan=True)
        if not close.all():
            return Difference("value", name, _both("diff.value", name=name, index=_index(~close),
                                                   expected=fmt(ed[~close][0].item()),
                                                   got=fmt(gd[~close][0].item())))
    return None


def _both(key: str, **fields) -> dict[str, str]:
    """The message `key` in every language."""
    return both(msg(key, "en", **fields), msg(key, "zh", **fields))


def _index(flags: Tensor) -> str:
    if flags.dim() == 0:
        return ""
    return "[" + ", ".join(str(int(i)) for i in flags.nonzero()[0]) + "]"


def is_close(a: Any, b: Any, rtol: float = 1e-4, atol: float = 1e-5) -> bool:
    """Every output of `a` equals `b`'s within the tolerances (shapes must agree)."""
    pa, pb = as_tuple(a), as_tuple(b)
    return len(pa) == len(pb) and all(
        isinstance(x, Tensor) and isinstance(y, Tensor) and x.shape == y.shape
        and bool(torch.isclose(x.detach().double(), y.detach().double(), rtol=rtol, atol=atol).all())
        for x, y in zip(pa, pb))


def generic_symptom(diff: Difference, expected: Any, got: Any, exercise: Exercise) -> Text:
    """Wording for a difference no probe-specific explainer recognised."""
    where = {lang: tr(diff.where, lang) for lang in ("en", "zh")}
    if diff.kind in ("type", "shape", "dtype", "nan"):
        return {lang: msg(f"generic.{diff.kind}", lang, where=where[lang]) for lang in where}
    e, g = as_tuple(expected), as_tuple(got)
    if is_close(tuple(-x for x in g), e, exercise.rtol, exercise.atol):
        return _both("generic.sign")
    ratio = _constant_ratio(e, g)
    if ratio is not None:
        return _both("generic.ratio", ratio=f"{ratio:.4g}")
    return {lang: msg("generic.value", lang, where=where[lang]) for lang in where}


def _constant_ratio(expected: tuple, got: tuple) -> float | None:
    e = torch.cat([x.detach().double().flatten() for x in expected])
    g = torch.cat([x.detach().double().flatten() for x in got])
    big = e.abs() > 1e-6
    if int(big.sum()) < 2:  # one number is always "the reference times a constant": nothing learnt from it
        return None
    ratios = g[big] / e[big]
    r = ratios[0].item()
    if torch.isclose(ratios, ratios[0], rtol=1e-3).all() and torch.isclose(g[~big], torch.zeros(()).double(),
                                                                            atol=1e-5).all():
        return r
    return None

