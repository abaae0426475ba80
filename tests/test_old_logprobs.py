"""π_old of an RL update: with one update per batch, the loss forward's own (the ratio is exactly 1,
tests/test_packed.py); with several, the trainer's forward before the first update."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from lmpo.models import completion_outputs

from test_packed import batch, tiny


@pytest.mark.parametrize("iterations,minibatches", [(2, 1), (1, 2)])
def test_several_updates_take_pi_old_from_the_trainers_forward(iterations, minibatches):
    """With several updates per batch π_old is the trainer's forward before the first update, not
    the sampler's log-probs (which differ by float error, in bf16 by ~1e-2): the first update's
    ratio is 1 up to the float error between two forwards of the trainer."""
    from lmpo.trainers.rl import old_log_probs_and_values
    from lmpo.trainers.rl_batch import Batch
    from lmpo.trainers.rl_config import RLConfig

    model = tiny(Qwen2ForCausalLM, Qwen2Config, False, "sdpa")
    prompt, prompt_mask, completion, lengths = batch()
    loss_mask = (torch.arange(9) < lengths[:, None]).float()
    trainer = completion_outputs(model, prompt, prompt_mask, completion).logprobs.detach()
    sampler = trainer + 1e-2  # the sampler's own kernels and precision
    cfg = RLConfig(beta=0.0, num_iterations=iterations, num_minibatches=minibatches)
    part = Batch(prompt, prompt_mask, completion, loss_mask, sampler.clone(), on_policy=True)
    old_log_probs_and_values(part, None, None, model, cfg)
    torch.testing.assert_close(part.old_logprobs * loss_mask, trainer * loss_mask, atol=1e-5, rtol=0)
    once = Batch(prompt, prompt_mask, completion, loss_mask, sampler.clone(), on_policy=True)
    old_log_probs_and_values(once, None, None, model, RLConfig(beta=0.0))  # one update: its own forward serves
    assert torch.equal(once.old_logprobs, sampler) and once.policy_logprobs is None
