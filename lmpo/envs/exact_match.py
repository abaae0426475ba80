"""A task for users' own prompt files: the grader compares the completion with the row's
`answer` column. It has no embedded data; its prompts come from a file (`lmpo train rl
--prompts FILE --eval_prompts FILE --task exact_match`)."""

from __future__ import annotations

from lmpo.envs.base import Grade, Problem


class ExactMatch:
    """Correct when the completion, terminated by EOS, equals the answer (surrounding
    whitespace ignored, and case too with `ignore_case=1`)."""

    def __init__(self, ignore_case: int = 0):
        self.ignore_case = bool(ignore_case)
        self.name = "exact_match" + (" (ignoring case)" if self.ignore_case else "")

    def grade(self, problem: Problem, completion: str, terminated: bool) -> Grade:
        got, want = completion.strip(), problem.answer.strip()
        if self.ignore_case:
            got, want = got.lower(), want.lower()
        return Grade(correct=terminated and bool(want) and got == want, well_formed=terminated)

    def is_heldout(self, problem: Problem) -> bool:
        return False

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        raise ValueError("task exact_match has no embedded prompts: give a prompt file (--prompts FILE)")

    def heldout_problems(self, n: int) -> list[Problem]:
        raise ValueError("task exact_match has no embedded held-out prompts: give --eval_prompts FILE "
                         "or --eval_problems 0")
