"""`lmpo exercise`: write a core function of post-training yourself, check it against the library's
own (with a diagnosis of the first difference, in words), and train with it.

Each exercise is an `Exercise` record (core.py): the reference function from `lmpo.algos` (via its
registry where there is one), the starter text, random inputs, and probes that each detect one
known mistake by its symptom. Every text shown to the user exists in English and Chinese (lang.py).
"""

from __future__ import annotations

from lmpo.teach.exercise.advantages import GRPO, RLOO
from lmpo.teach.exercise.aggregation import AGGREGATION
from lmpo.teach.exercise.check import CheckReport, ExerciseFileError, check_file, check_function, exercise_of_file
from lmpo.teach.exercise.core import Case, Exercise, Mismatch, Probe, UserCodeError
from lmpo.teach.exercise.gae import GAE
from lmpo.teach.exercise.kl import K3
from lmpo.teach.exercise.lang import LANGUAGES, language_of_file
from lmpo.teach.exercise.plug import Plug, plugged
from lmpo.teach.exercise.ppo import PPO_CLIP
from lmpo.teach.exercise.preference import BRADLEY_TERRY, DPO
from lmpo.teach.exercise.starter import starter_text, write_starter
from lmpo.teach.names import did_you_mean
from lmpo.teach.refusals import refusal

EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in (GRPO, RLOO, PPO_CLIP, AGGREGATION, GAE, K3, DPO,
                                                          BRADLEY_TERRY)}


def get_exercise(name: str, lang: str = "en") -> Exercise:
    if name not in EXERCISES:
        raise ValueError(refusal("exercise.unknown", lang, name=name, hint=did_you_mean(name, EXERCISES, lang),
                                 names=", ".join(EXERCISES)))
    return EXERCISES[name]


__all__ = ["EXERCISES", "LANGUAGES", "Case", "CheckReport", "Exercise", "ExerciseFileError", "Mismatch", "Plug", "Probe",
           "UserCodeError", "check_file", "check_function", "exercise_of_file", "get_exercise", "language_of_file", "plugged",
           "starter_text", "write_starter"]
