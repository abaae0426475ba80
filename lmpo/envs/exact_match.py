"""A task for users' own prompt files: the grader compares the completion with the row's
`answer` column. It has no embedded data; its prompts come from a file (`lmpo train rl
--prompts FILE --eval_prompts FILE --task exact_match`)."""

from __future__ import annotations

from lmpo.envs.answers import EXTRACTORS, same_answer
from lmpo.envs.base import Grade, Problem


class ExactMatch:
    """Correct when the completion, terminated by EOS, equals the answer (surrounding
    whitespace ignored, and case too with `ignore_case=1`).

    Where the answer is, on each side:
    - `answer_after=</think>`: a reasoning model's answer is what follows the last `</think>`; a
      completion without the marker is malformed, hence wrong.
    - `extract=boxed` / `extract=last_number`: the answer is the content of the completion's last
      `\\boxed{...}` / its last number (after `answer_after`'s marker, if given); a completion
      without one is malformed. `last_number` compares as `math=1` does.
    - `reference_after=####`: the row's answer is what follows its last `####` (GSM8K's answers
      end with `#### 42` after the worked solution); `reference_extract=boxed` (a MATH solution)
      or `last_number`: the row's answer read as the completion's is. A reference without the
      marker or the box is used whole.

    How answers compare: `math=1` compares numbers as numbers (`1,000` = `1000.0`, `1/2` =
    `\\frac{1}{2}`, `$18` = `18\\text{ dollars}` = `x = 18` = `18`, `50%` = `50`) and other answers
    with spaces and LaTeX spacing removed (`lmpo.envs.answers`)."""

    def __init__(self, ignore_case: int = 0, answer_after: str = "", reference_after: str = "",
                 extract: str = "", reference_extract: str = "", math: int = 0):
        self.ignore_case = bool(ignore_case)
        for option, value, example in (("answer_after", answer_after, "</think>"), ("reference_after", reference_after, "####")):
            if not isinstance(value, str):
                raise ValueError(f"exact_match: {option} must be the text the answer follows, such as {example}; "
                                 f"got {value!r}")
        for option, value in (("extract", extract), ("reference_extract", reference_extract)):
            if value and value not in EXTRACTORS:
                raise ValueError(f"exact_match: {option} must be one of {', '.join(EXTRACTORS)}; got {value!r}")
        if reference_after and reference_extract:
            raise ValueError("exact_match: give reference_after or reference_extract, not both")
        self.answer_after, self.reference_after = answer_after, reference_after
        self.extract, self.reference_extract = extract, reference_extract
        self.math = bool(math) or extract == "last_number"
        details = [text for on, text in ((self.ignore_case, "ignoring case"),
                                         (answer_after, f"the answer after {answer_after}"),
                                         (extract, f"the answer by {extract}"),
                                         (reference_after, f"the reference after {reference_after}"),
                                         (reference_extract, f"the reference by {reference_extract}"),
                                         (self.math, "compared as math")) if on]
        self.name = "exact_match" + (f" ({', '.join(details)})" if details else "")

    def grade(self, problem: Problem, completion: str, terminated: bool) -> Grade:
        well_formed = terminated
        if self.answer_after:
            _, marker, completion = completion.rpartition(self.answer_after)
            well_formed = well_formed and bool(marker)
        if self.extract:
            completion = EXTRACTORS[self.extract](completion)
            well_formed = well_formed and completion is not None
        want = problem.answer
        if self.reference_after:
            want = want.rpartition(self.reference_after)[2]
        elif self.reference_extract:
            want = EXTRACTORS[self.reference_extract](want) or want
        if not well_formed or not want.strip():
            return Grade(correct=False, well_formed=well_formed)
        got = completion
        if self.ignore_case:
            got, want = got.lower(), want.lower()
        return Grade(correct=same_answer(got, want, self.math), well_formed=well_formed)

    def is_heldout(self, problem: Problem) -> bool:
        return False

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        raise ValueError("task exact_match has no embedded prompts: give a prompt file (--prompts FILE)")

    def heldout_problems(self, n: int) -> list[Problem]:
        raise ValueError("task exact_match has no embedded held-out prompts: give --eval_prompts FILE "
                         "or --eval_problems 0")
