"""Reward shaping: TempSamp-R1's non-linear transform of the temporal-IoU reward.

TempSamp-R1 (Li et al., arXiv 2509.18056; ZhangZikun6666/TempSamp-R1, ``scripts/timelens/timelens_reward.py``,
``transform_rewards``) injects the ground-truth answer into each group. Its IoU of ≈ 1 would dominate the group's
mean and std, so the IoU term of *every* completion of the group (on-policy and injected alike, before it is added to
the format term) goes through

    r ≥ τ:  τ + 0.01 · ln(r − τ + 1)                        (a near-flat "success" plateau above τ)
    r < τ:  τ − (e^{α(τ − r)} − 1) / (e^α − 1)              (an exponential ramp below τ)

with τ = 0.8 and α = 1 by default (its ``GTPO_REWARD_SHAPING_THRESHOLD`` / ``_ALPHA``).
"""
from __future__ import annotations

import math

import torch

SHAPINGS = ("none", "tempsamp")
TEMPSAMP_THRESHOLD = 0.8
TEMPSAMP_ALPHA = 1.0


def tempsamp_shaping(rewards: torch.Tensor, threshold: float = TEMPSAMP_THRESHOLD,
                     alpha: float = TEMPSAMP_ALPHA) -> torch.Tensor:
    """TempSamp-R1's shaping of IoU rewards, element-wise (formula in the module docstring).

    Args:
        rewards: any shape, IoU rewards in [0, 1]; NaN (an unscored completion) stays NaN.
        threshold: τ, where the plateau starts.
        alpha: α > 0, the steepness of the ramp below τ.

    Returns:
        Same shape, float32. Hand-computed: 1.0 → 0.80182, 0.8 → 0.8, 0.5 → 0.59639, 0.0 → 0.08676 (τ 0.8, α 1).

    Raises:
        ValueError: ``alpha`` ≤ 0 (the ramp's denominator e^α − 1 would be ≤ 0).
    """
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    r = rewards.float()
    above = threshold + 0.01 * torch.log(torch.clamp(r - threshold, min=0.0) + 1.0)
    below = threshold - (torch.exp(alpha * torch.clamp(threshold - r, min=0.0)) - 1.0) / math.expm1(alpha)
    return torch.where(r >= threshold, above, torch.where(r < threshold, below, r))  # NaN falls through
