import itertools
from lmpo.envs.env import Step
from lmpo.envs.tool_tasks import Calculator

_count = itertools.count()

class Env:
    def __init__(self):
        self.n = next(_count)
    def reset(self, problem):
        if self.n % 2 == 0:
            raise ConnectionError("my sandbox is unreachable")
        return [{"role": "user", "content": problem.prompt}]
    def step(self, text):
        if self.n % 4 == 1:
            raise ValueError("my backend timed out")
        return Step(done=True, info={"answer": text})

class HalfTask(Calculator):
    def make_env(self): return Env()
