"""A task for users' own prompt files: the grader compares the completion with the row's
`answer` column. It has no embedded data; its prompts come from a file (`lmpo train rl
--prompts FILE --eval_prompts FILE --task exact_match`)."""

from __future__ import annotations

from lmpo.envs.base import Grade, Problem


class ExactMatch:
    """Correct when the completion, terminated by EOS, equals the answer (surrounding
    whitespace ignored, and case too with `ignore_case=1`). `answer_after=</think>`: a reasoning
    model's answer is what follows the last `</think>`; a completion without the marker is
    malformed, hence wrong. `reference_after=####`: the row's answer is what follows its last
    `####` (GSM8K's answers end with `#### 42` after the worked solution); an answer without the
    marker is used whole."""

    def __init__(self, ignore_case: int = 0, answer_after: str = "", reference_after: str = ""):
        self.ignore_case = bool(ignore_case)
        for option, value, example in (("answer_after", answer_after, "</think>"), ("reference_after", reference_after, "####")):
            if not isinstance(value, str):
                raise ValueError(f"exact_match: {option} must be the text the answer follows, such as {example}; "
                                 f"got {value!r}")
        self.answer_after, self.reference_after = answer_after, reference_after
        details = [text for on, text in ((self.ignore_case, "ignoring case"),
                                         (answer_after, f"the answer after {answer_after}"),
                                         (reference_after, f"the reference after {reference_after}")) if on]
        self.name = "exact_match" + (f" ({', '.join(details)})" if details else "")

    def grade(self, problem: Problem, completion: str, terminated: bool) -> Grade:
        well_formed = terminated
        if self.answer_after:
            _, marker, completion = completion.rpartition(self.answer_after)
            well_formed = well_formed and bool(marker)
        want = problem.answer.rpartition(self.reference_after)[2] if self.reference_after else problem.answer
        got, want = completion.strip(), want.strip()
        if self.ignore_case:
            got, want = got.lower(), want.lower()
        return Grade(correct=well_formed and bool(want) and got == want, well_formed=well_formed)

    def is_heldout(self, problem: Problem) -> bool:
        return False

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        raise ValueError("task exact_match has no embedded prompts: give a prompt file (--prompts FILE)")

    def heldout_problems(self, n: int) -> list[Problem]:
        raise ValueError("task exact_match has no embedded held-out prompts: give --eval_prompts FILE "
                         "or --eval_problems 0")
