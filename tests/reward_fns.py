"""Reward functions that misbehave, for tests/test_reward_failures.py. Kept free of heavy
imports: the reward worker processes import this module by name."""

from __future__ import annotations

import math
import os
import signal
import time


def raises(task, problems, completions, terminated):
    raise ValueError("the grader crashed")


def raises_on_seven(task, problems, completions, terminated):
    if any("7" in c for c in completions):
        raise ValueError("cannot grade a 7")
    return [1.0] * len(completions)


def hangs(task, problems, completions, terminated):
    entered = os.environ.get("LMPO_TEST_IN_CALL")
    if entered:  # tell the test that the call has begun, so it need not guess with a sleep
        with open(entered, "w") as f:
            f.write(str(os.getpid()))
    time.sleep(3600)


def hangs_on_seven(task, problems, completions, terminated):
    if any("7" in c for c in completions):
        while True:  # busy, never yields to a signal handler that could stop it politely
            pass
    return [float(len(c)) for c in completions]


def none_and_nan(task, problems, completions, terminated):
    return [None if c == "a" else math.nan if c == "b" else 2.0 for c in completions]


def wrong_length(task, problems, completions, terminated):
    return [1.0] * (len(completions) + 1)


def one_number(task, problems, completions, terminated):
    return 1.0


def a_dict(task, problems, completions, terminated):
    return {"score": 1.0}


def a_string(task, problems, completions, terminated):
    return "11"


def first_only(task, problems, completions, terminated):
    """A likely bug: scores only the first completion (each one alone would seem right)."""
    return [float(len(completions[0]))]


def kills_itself(task, problems, completions, terminated):
    os._exit(3)


def half(task, problems, completions, terminated):
    """Unscorable for every second completion: None, NaN or an exception by turns."""
    return [None if i % 2 else 1.0 for i in range(len(completions))]


def returns_strings(task, problems, completions, terminated):
    """Numbers written as strings and bools: not numbers (a bug in the function), never converted."""
    return ["0.75" if i % 2 else True for i in range(len(completions))]


def allocates(task, problems, completions, terminated):
    block = bytearray(1 << 30)  # 1 GiB: over a small memory limit
    return [float(len(block) > 0)] * len(completions)


def prints_a_lot(task, problems, completions, terminated):
    for _ in range(4096):
        print("x" * 1024)  # 4 MiB in all
    return [1.0] * len(completions)


def length(task, problems, completions, terminated):
    """A reward that differs within every group of a random model's samples, so GRPO moves."""
    return [len(c) / 10 for c in completions]


def count_sevens(task, problems, completions, terminated):
    """A dense reward any model, even a random one, gets varied scores on (for the doctor's tests)."""
    return [float(c.count("7")) for c in completions]


def exits(task, problems, completions, terminated):
    raise SystemExit(0)


def past_float32(task, problems, completions, terminated):
    return [1e39 if "7" in c else 2.0 for c in completions]


def segfaults(task, problems, completions, terminated):
    os.kill(os.getpid(), signal.SIGSEGV)


def fails_on_batches(task, problems, completions, terminated):
    if len(completions) > 1:
        raise RuntimeError("batch too large")
    return [1.0]
