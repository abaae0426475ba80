"""Wall time of the agent loop with slow tools, against a task's `env_workers`.

    .venv/bin/python bench/env_workers.py [--episodes 32] [--workers 1,4,16]

Each episode has three turns: two tool calls, then an answer. The model is a scripted engine
(every episode says the same thing each turn), so the time is the environments' alone. Two
tools: one that waits 0.2 s (as a web request or a remote sandbox would) and the `python`
sandbox tool running `print(1)`. Prints a Markdown table; docs/agents.md shows its figures.
"""

from __future__ import annotations

import argparse
import time

from lmpo.envs import Problem
from lmpo.envs.parsing import CompactFormat
from lmpo.envs.tool_env import ToolEnv
from lmpo.envs.tools import tool
from lmpo.envs.tools.python_tool import make_python_tool
from lmpo.models import build_char_tokenizer
from lmpo.rollout import EpisodeLimits, Sample, SamplingParams, run_episodes
from lmpo.rollout.render import ChatRenderer


class _Scripted:
    """Turn k of every episode is `turns[k]`, ended with EOS."""

    def __init__(self, tokenizer, turns: list[str]):
        self.tokenizer, self.turns, self.calls = tokenizer, turns, 0

    def generate(self, prompts, params, max_new_tokens=None):
        ids = self.tokenizer(self.turns[self.calls], add_special_tokens=False).input_ids + [self.tokenizer.eos_token_id]
        self.calls += 1
        return [Sample(list(ids), [0.0] * len(ids), "eos") for _ in prompts]


def wait(key: str) -> str:
    """Wait 0.2 s.

    Args:
        key: anything.
    """
    time.sleep(0.2)
    return "1"


def seconds(tokenizer, the_tool, call: str, episodes: int, workers: int) -> float:
    make_env = lambda: ToolEnv(lambda p: [{"role": "user", "content": p.prompt}], lambda p: [the_tool],
                               CompactFormat())
    problems = [Problem(prompt=f"q{i}", answer="1") for i in range(episodes)]
    start = time.perf_counter()
    trajs = run_episodes(_Scripted(tokenizer, [call, call, "1"]), make_env, problems, SamplingParams(max_new_tokens=64),
                         EpisodeLimits(max_turns=3, max_tokens=64), ChatRenderer(tokenizer), tokenizer,
                         env_workers=workers)
    elapsed = time.perf_counter() - start
    assert all(t.termination == "answered" and t.tool_calls == 2 for t in trajs), {t.termination for t in trajs}
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--workers", default="1,4,16", help="comma-separated env_workers values")
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    tokenizer = build_char_tokenizer()
    tools = [("waits 0.2 s", tool(wait), "wait(1)"), ("the `python` sandbox tool, `print(1)`",
                                                       make_python_tool(), "python(print(1))")]
    print(f"| tool ({args.episodes} episodes) | " + " | ".join(f"`env_workers` {w}" for w in workers) + " |")
    print("|---|" + "---|" * len(workers))
    for name, the_tool, call in tools:
        times = [seconds(tokenizer, the_tool, call, args.episodes, w) for w in workers]
        print(f"| {name} | " + " | ".join(f"{t:.2f} s" for t in times) + " |")


if __name__ == "__main__":
    main()
