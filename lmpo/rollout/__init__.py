"""Sampling engines; they return typed `Rollout` records."""

from lmpo.rollout.engine import generate, left_pad, make_decoder, right_pad
from lmpo.rollout.types import FINISH_EOS, FINISH_LENGTH, Rollout, SamplingParams, concat_rollouts

__all__ = ["FINISH_EOS", "FINISH_LENGTH", "Rollout", "SamplingParams", "concat_rollouts", "generate", "left_pad", "make_decoder", "right_pad"]
