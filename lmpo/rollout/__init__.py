"""Rollout: engines behind one protocol, the agent loop, and the typed records they return."""

from lmpo.models.padding import left_pad, right_pad
from lmpo.rollout.engine import generate, make_decoder
from lmpo.rollout.types import FINISH_EOS, FINISH_LENGTH, Rollout, SamplingParams, concat_rollouts
from lmpo.rollout.trajectory import ENV, MODEL, PROMPT, TEMPLATE, Sample, Trajectory, to_rollout
from lmpo.rollout.engines import Engine, LocalEngine
from lmpo.rollout.agent_loop import EpisodeLimits, EpisodeRunner, run_episodes

__all__ = ["ENV", "FINISH_EOS", "FINISH_LENGTH", "MODEL", "PROMPT", "TEMPLATE", "Engine", "EpisodeLimits",
           "EpisodeRunner", "LocalEngine", "Rollout", "Sample", "SamplingParams", "Trajectory", "concat_rollouts",
           "generate", "left_pad", "make_decoder", "right_pad", "run_episodes", "to_rollout"]
