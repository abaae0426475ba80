"""Token-level advantage estimators: a reward and an advantage per token (PPO, REINFORCE++).

Every estimator has the signature ``fn(token_rewards: Tensor[B,T], mask: Tensor[B,T], *,
values=None, gamma=1.0, lam=1.0) -> (advantages [B,T], returns [B,T])``; both outputs are
exactly 0 where mask is 0. Each accepts all three options (the RL loop passes them all), even
those it ignores; any other keyword is a TypeError. Build ``token_rewards`` with `token_rewards` below.

Trajectory = the mask-1 tokens of a row, in order. Positions with mask 0 between them
(multi-turn tool/observation tokens) are skipped: token t links to the next mask-1 token, so
discounting counts model tokens only and values at observation tokens are never read (the
same convention as verl's masked GAE). The value after a row's last mask-1 token is 0
(terminal), also for completions cut by the length limit.

Inputs are detached and the math is done in float64; the outputs are cast back to
``token_rewards.dtype``. Whatever is at mask-0 positions (even NaN) is ignored.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmpo.algos.registry import Registry

TOKEN_ADVANTAGES = Registry("token advantage estimator")


def _check_2d(mask: Tensor, **tensors: Tensor) -> None:
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    for name, t in tensors.items():
        if t.shape != mask.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != mask shape {tuple(mask.shape)}")


def _check_discount(gamma: float, lam: float) -> None:
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must be in [0, 1], got gamma={gamma}, lam={lam}")


def _float_dtype(t: Tensor) -> torch.dtype:
    return t.dtype if t.dtype.is_floating_point else torch.get_default_dtype()


def _masked_f64(x: Tensor, valid: Tensor) -> Tensor:
    return torch.where(valid, x.detach().to(torch.float64), 0.0)


def _gae_scan(rewards: Tensor, values: Tensor, valid: Tensor, gamma: float, lam: float) -> Tensor:
    """Reverse GAE recursion over T, vectorised over B; mask-0 positions carry the state through.

    ``rewards``/``values`` float64, already 0 off-mask. With values 0 and lam 1 it gives the
    discounted return.
    """
    batch, length = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(batch)
    running = rewards.new_zeros(batch)
    for t in reversed(range(length)):
        v = valid[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * running
        running = torch.where(v, adv_t, running)
        next_value = torch.where(v, values[:, t], next_value)
        advantages[:, t] = torch.where(v, adv_t, 0.0)
    return advantages


def token_rewards(
    sequence_rewards: Tensor,
    mask: Tensor,
    kl: Tensor | None = None,
    beta: float = 0.0,
) -> Tensor:
    """Per-token rewards ``r_t = -beta * kl_t + [t is the last mask-1 token] * R_i`` [B,T].

    The PPO-RLHF reward (Ouyang et al. 2022, InstructGPT, arXiv:2203.02155; Ziegler et al.
    2019, arXiv:1909.08593), also used by REINFORCE++ (Hu 2025, arXiv:2501.03262). ``kl`` is
    the per-token k1 estimate ``log pi_old - log pi_ref``, computed by the caller. A row with no
    mask-1 token is all zeros; mask-0 positions are exactly 0. No detach is done here.
    """
    _check_2d(mask, **({} if kl is None else {"kl": kl}))
    if sequence_rewards.shape != mask.shape[:1]:
        raise ValueError(
            f"sequence_rewards must be [B] = [{mask.shape[0]}], got {tuple(sequence_rewards.shape)}"
        )
    if beta != 0.0 and kl is None:
        raise ValueError("beta != 0 needs the per-token kl")
    valid = mask != 0
    dtype = _float_dtype(sequence_rewards)
    if kl is not None:
        dtype = torch.promote_types(dtype, _float_dtype(kl))
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    last = torch.where(valid, positions, 0).argmax(-1, keepdim=True)
    is_last = torch.zeros_like(valid).scatter_(-1, last, True) & valid
    rewards = torch.where(is_last, sequence_rewards.to(dtype).unsqueeze(-1), 0.0)
    if kl is not None and beta != 0.0:
        rewards = rewards - beta * torch.where(valid, kl.to(dtype), 0.0)
    return rewards


def discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """``G_t = sum_{l>=0} gamma^l r_{t+l}`` over the mask-1 tokens of each row (mask-0 skipped).

    Shape [B,T], 0 where mask is 0, dtype of ``token_rewards``.
    """
    _check_2d(mask, token_rewards=token_rewards)
    _check_discount(gamma, 1.0)
    valid = mask != 0
    r = _masked_f64(token_rewards, valid)
    return _gae_scan(r, torch.zeros_like(r), valid, gamma, 1.0).to(_float_dtype(token_rewards))


def masked_whiten(
    x: Tensor,
    mask: Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    *,
    unbiased: bool = False,
) -> Tensor:
    """``(x - mu) / sqrt(var + eps)`` with mu, var over all mask-1 elements of ``x`` (any shape).

    ``var`` is the population variance (``unbiased=False``, default, as OpenRLHF's
    REINFORCE++) or Bessel's n-1 (``unbiased=True``, as TRL's ``masked_whiten``).
    ``shift_mean=False`` adds mu back (std 1, mean unchanged), as in TRL. Mask-0 positions
    are exactly 0; an empty mask gives all zeros. Differentiable (no detach).
    """
    if x.shape != mask.shape:
        raise ValueError(f"x shape {tuple(x.shape)} != mask shape {tuple(mask.shape)}")
    valid = mask != 0
    values = torch.where(valid, x, 0.0)
    count = valid.sum().to(values.dtype)
    mean = values.sum() / count.clamp_min(1.0)
    centered = torch.where(valid, values - mean, 0.0)
    denom = (count - 1.0) if unbiased else count
    var = centered.square().sum() / denom.clamp_min(1.0)
    whitened = centered * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(valid, whitened, 0.0)


@TOKEN_ADVANTAGES.register("gae")
def gae(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """GAE (Schulman et al. 2015, arXiv:1506.02438), as in PPO-RLHF (InstructGPT, Ouyang et
    al. 2022, arXiv:2203.02155).

    ``delta_t = r_t + gamma * V_{t+1} - V_t``, ``A_t = sum_l (gamma*lam)^l delta_{t+l}``,
    returns ``= A + V`` (the critic's target). ``t+1`` is the next mask-1 token of the row;
    ``V`` after the last one is 0. ``values`` [B,T] is required. Advantages are not whitened:
    call `masked_whiten` on them if wanted.
    """
    if values is None:
        raise ValueError("gae needs values (the critic's V per token)")
    _check_2d(mask, token_rewards=token_rewards, values=values)
    _check_discount(gamma, lam)
    valid = mask != 0
    v = _masked_f64(values, valid)
    advantages = _gae_scan(_masked_f64(token_rewards, valid), v, valid, gamma, lam)
    dtype = _float_dtype(token_rewards)
    return advantages.to(dtype), torch.where(valid, advantages + v, 0.0).to(dtype)


@TOKEN_ADVANTAGES.register("reinforce_pp")
def reinforce_pp(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262).

    returns ``G_t = sum_{l>=0} gamma^l r_{t+l}`` (mask-1 tokens only), advantages = ``G``
    whitened over all mask-1 tokens of the whole batch (population std, not per group).
    ``values`` and ``lam`` are ignored.
    """
    _check_2d(mask, token_rewards=token_rewards)
    valid = mask != 0
    returns = discounted_returns(token_rewards.detach(), mask, gamma).to(torch.float64)
    advantages = masked_whiten(returns, valid)
    dtype = _float_dtype(token_rewards)
    return advantages.to(dtype), returns.to(dtype)
