"""Controllers for the KL-penalty coefficient beta (PPO-RLHF reward penalty)."""

from __future__ import annotations

# Ziegler et al. clip the proportional error so that one update changes beta by at most
# 20% * n_steps / horizon, whatever the observed KL.
KL_ERROR_CLIP = 0.2


def adaptive_kl_coef(
    beta: float, observed_kl: float, target_kl: float, horizon: int, n_steps: int
) -> float:
    """Adaptive KL controller (Ziegler et al. 2019, arXiv:1909.08593).

    ``e = clip(observed_kl / target_kl - 1, -0.2, 0.2)``, ``beta <- beta * (1 + e * n_steps /
    horizon)``: beta grows when the KL is above target, shrinks when below. ``n_steps`` is the
    number of samples (or steps) since the last update, ``horizon`` the controller's time
    constant in the same unit (10000 samples in the paper). ``n_steps`` must stay below
    ``horizon / 0.2`` (a ValueError otherwise): at or beyond it one update with e = -0.2 would
    drive beta to 0 or below.
    """
    if not target_kl > 0:
        raise ValueError(f"target_kl must be > 0, got {target_kl}")
    if not horizon > 0:
        raise ValueError(f"horizon must be > 0, got {horizon}")
    if n_steps < 0:
        raise ValueError(f"n_steps must be >= 0, got {n_steps}")
    if not 1.0 - KL_ERROR_CLIP * n_steps / horizon > 0:
        raise ValueError(f"n_steps / horizon must be < {1 / KL_ERROR_CLIP:g} (or beta can reach 0 or below), "
                         f"got n_steps={n_steps}, horizon={horizon}")
    error = min(max(observed_kl / target_kl - 1.0, -KL_ERROR_CLIP), KL_ERROR_CLIP)
    return float(beta * (1.0 + error * n_steps / horizon))
