"""GRPO loss math, model-free: group advantages, importance ratio, clipped surrogate, k3 KL, loss aggregation.

Every function takes and returns tensors; nothing here knows about models, processes or batches of video. The formulas
follow TRL 1.16's ``GRPOTrainer`` (``_generate_and_score_completions`` and ``_compute_loss``) so that the same config
means the same objective; the tests pin the worked example's numbers (../shared/DESIGN-NOTES.md):

* advantage ``A_i = (r_i − mean_g) / (std_g + 1e-4)`` with ``std`` unbiased (``torch.std``), per group of completions
  of one prompt, found by its id (verl's ``uid``), not by position;
* ratio ``ρ_t = exp(logp_t − logp_old_t)``;
* clipped surrogate ``min(ρ_t·A, clip(ρ_t, 1 − ε_low, 1 + ε_high)·A)`` (PPO, Schulman et al. 2017), loss is its negative;
* per-token KL estimator k3 ``exp(ref − logp) − (ref − logp) − 1`` (Schulman, "Approximating KL divergence", 2020),
  multiplied by the ratio ``ρ_t`` when ``use_bias_correction_kl`` (TRL 1.16's default; DeepSeek-V3.2, arXiv:2512.02556)
  and added as ``β·k3`` to the per-token loss;
* aggregation per ``loss_type``: ``grpo`` (DeepSeekMath: mean over each completion's tokens, then over completions),
  ``bnpo`` (mean over all active tokens of the local batch), ``dr_grpo`` (Dr. GRPO: sum / (B · max_completion_length)),
  ``dapo`` (DAPO: sum / number of active tokens, the caller passing :func:`dapo_normaliser` as ``num_items``), always
  in float32 (TRL's per-token loss is float32 because its advantages are, whatever the model's dtype);
* when π_old's log-probs must be stored (:func:`needs_old_logps`, TRL's rule);
* the importance-sampling correction of a rollout engine whose sampling distribution differs from the trained
  model's (vLLM): :func:`engine_importance_weights`, TRL 1.16's ``vllm_importance_sampling_*``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from trl.trainer.utils import nanstd  # unbiased std ignoring NaNs, as TRL normalises rewards

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
IMPORTANCE_SAMPLING_MODES = ("sequence_mask", "sequence_truncate", "token_mask", "token_truncate")
SCALE_REWARDS = ("group", "batch", "none")
ADVANTAGE_EPS = 1e-4


@dataclass
class Advantages:
    """Output of :func:`group_advantages`, all shape (N,) with N = number of completions.

    Attributes:
        advantages: per completion; 0 where the reward is NaN (no function scored it).
        std: the std used (group std repeated G times, or the batch std under ``scale_rewards="batch"``).
        zero_std: bool, True where ``std`` is 0 (``torch.isclose``): TRL 1.16's ``frac_reward_zero_std`` is its mean,
            so under ``"batch"`` it is all True or all False (the batch std), else per group.
        group_zero_std: bool, True for completions whose group's G rewards all agree, whatever ``scale_rewards``:
            the groups ``dynamic_sampling`` drops (such a group has advantage 0 under ``"group"`` and ``"none"``;
            under ``"batch"`` too, since its rewards equal its mean).
    """

    advantages: torch.Tensor
    std: torch.Tensor
    zero_std: torch.Tensor
    group_zero_std: torch.Tensor


def by_group(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(table, group_of_row)``: ``values`` (N,) laid out one group a row, groups being the rows of equal
    ``group_ids`` (N,) (verl's ``uid``, ``compute_grpo_outcome_advantage(…, index)``), in ascending id order, each
    group's rows in their order; a smaller group is padded with NaN, which NaN-aware reductions leave out. For rows in
    ascending ids, G per group, ``table`` is ``values.view(-1, G)``: per-group reductions are bit-identical to the view's.
    ``group_of_row`` (N,) long is each row's row of ``table`` (per-group results go back as ``result[group_of_row]``).

    Raises:
        ValueError: ``values`` and ``group_ids`` not both of shape (N,).
    """
    if group_ids.shape != values.shape or values.ndim != 1:
        raise ValueError(f"values and group_ids must both have shape (N,), got {tuple(values.shape)} and "
                         f"{tuple(group_ids.shape)}")
    _, group_of_row, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    order = torch.argsort(group_of_row, stable=True)
    first = torch.cumsum(counts, 0) - counts  # the position in ``order`` of each group's first row
    column = torch.arange(values.numel(), device=values.device) - first[group_of_row[order]]
    table = values.new_full((counts.numel(), int(counts.max()) if counts.numel() else 0), float("nan"))
    table[group_of_row[order], column] = values[order]
    return table, group_of_row


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, scale_rewards: str = "group") -> Advantages:
    """Group-relative advantages (TRL 1.16 ``sum_then_normalize``), the groups found by id (:func:`by_group`), so the
    rows may come in any order: each row gets the advantage it would have with its group's rows contiguous.

    Args:
        rewards: (N,) total reward per completion. NaN marks a completion that no reward function scored; it is left
            out of the group mean/std and gets 0.
        group_ids: (N,) integer, equal for the completions of one prompt (:attr:`Rollout.group_ids`). Groups of one
            row only with ``"none"``: every advantage is then 0, the case of on-policy distillation, whose loss is
            the teacher term alone.
        scale_rewards: ``"group"`` divide by each group's std + 1e-4; ``"batch"`` by the std of all N rewards + 1e-4;
            ``"none"`` only subtract the group mean (Dr. GRPO).

    Returns:
        :class:`Advantages`. Worked example: rewards [0.0, 1.6, 5.4, 8.8], one group → [−1.0006, −0.5953, 0.3673,
        1.2286].

    Raises:
        ValueError: shapes differ, a group of one row unless ``"none"``, or an unknown ``scale_rewards``.
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    rewards = rewards.float()
    grouped, group_of_row = by_group(rewards, group_ids)
    if scale_rewards != "none" and rewards.numel() and torch.bincount(group_of_row).min() < 2:
        raise ValueError(f"every group needs ≥ 2 completions for group advantages under scale_rewards "
                         f"{scale_rewards!r} (a group of one has no std)")
    mean = torch.nanmean(grouped, dim=1)[group_of_row]
    group_std = nanstd(grouped, dim=1)[group_of_row]
    std = nanstd(rewards).expand_as(rewards) if scale_rewards == "batch" else group_std
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + ADVANTAGE_EPS)
    group_zero_std = torch.isclose(torch.nan_to_num(group_std, nan=0.0), torch.zeros_like(group_std))
    zero_std = torch.isclose(torch.nan_to_num(std, nan=0.0), torch.zeros_like(std))
    return Advantages(torch.nan_to_num(advantages, nan=0.0), std, zero_std, group_zero_std)


def needs_old_logps(gradient_accumulation_steps: int, steps_per_generation: int, num_iterations: int,
                    engine_logps_need_correcting: bool = False) -> bool:
    """Whether π_old's per-token log-probs must be computed at generation time (TRL 1.16
    ``_generate_and_score_completions``): ``gradient_accumulation_steps % (steps_per_generation · num_iterations) != 0``
    — some micro-step then trains on a batch generated before the latest optimizer step, so π_θ ≠ π_old — or when the
    rollout engine's own sampling log-probs need correcting (TRL: vLLM with importance-sampling correction).

    Otherwise every micro-step of a generation falls in the optimizer step that follows it, π_old = π_θ and
    ``logps.detach()`` is exact. Example: (3, 2, 1) → True (micro-step 3 reuses a batch generated before the first
    optimizer step); (4, 2, 2) → False; (2, 2, 1) → False.
    """
    return gradient_accumulation_steps % (steps_per_generation * num_iterations) != 0 or engine_logps_need_correcting


def dapo_normaliser(num_items_in_batch: torch.Tensor, num_processes: int, accumulation_steps: int,
                    steps_per_generation: int) -> torch.Tensor:
    """The ``dapo`` divisor for one micro-batch on one process, as TRL 1.16 computes it:
    ``num_items_in_batch.clamp(min=1) / num_processes · accumulation_steps / steps_per_generation``.

    ``num_items_in_batch`` is the number of active completion tokens over the whole generation batch (all processes);
    the clamp comes before the division (an all-masked batch divides by 1 / processes · …, not by 1).
    """
    normaliser = torch.as_tensor(num_items_in_batch, dtype=torch.float32).clamp(min=1.0) / num_processes
    return normaliser * accumulation_steps / steps_per_generation


def importance_ratio(logps: torch.Tensor, old_logps: torch.Tensor) -> torch.Tensor:
    """Per-token ratio π_θ / π_old = exp(logp − logp_old), same shape as the inputs (B, T).

    Seed: logp −0.2, logp_old −0.5 → 1.3499.
    """
    return torch.exp(logps - old_logps)


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, epsilon_low: float = 0.2, epsilon_high: float | None = None
) -> torch.Tensor:
    """PPO's clipped objective per token, ``min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A)`` (to be maximised).

    Args:
        ratio: (B, T) importance ratios.
        advantages: (B,) or (B, T); broadcast over tokens.
        epsilon_low: ε for the lower bound.
        epsilon_high: ε for the upper bound (None = ``epsilon_low``; DAPO recommends 0.28).

    Returns:
        (B, T) objective. Seed: ρ = 1.35, A = 1.5, ε = 0.2 → 1.8.
    """
    epsilon_high = epsilon_low if epsilon_high is None else epsilon_high
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    return torch.min(ratio * advantages, clipped * advantages)


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token KL(π_θ ‖ π_ref) estimator k3 = exp(ref − logp) − (ref − logp) − 1 ≥ 0, shape of the inputs.

    Seed: logp −0.2, ref −0.5 → 0.0408.
    """
    return torch.exp(ref_logps - logps) - (ref_logps - logps) - 1  # TRL's expression, so gradients match bit for bit


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    max_completion_length: int | None = None,
    num_items: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar, as TRL 1.16 does per ``loss_type`` (before gradient accumulation).

    Args:
        per_token_loss: (B, T).
        mask: (B, T) 1 for completion tokens that count (0 for padding, masked truncated rows, dropped groups).
        loss_type: ``grpo`` Σ_t / |o_i| per completion, then mean over the B completions (a fully masked row counts
            as 0); ``bnpo`` Σ / Σ mask; ``dr_grpo`` Σ / (B · max_completion_length); ``dapo`` Σ / ``num_items``.
        max_completion_length: required for ``dr_grpo``.
        num_items: the ``dapo`` normaliser, used as given (:func:`dapo_normaliser`); None = Σ mask clamped to ≥ 1
            (then equal to ``bnpo``).

    Returns:
        Scalar float32 tensor: the per-token loss is cast to float32 first (a bf16 model's loss is summed in fp32).

    Raises:
        ValueError: unknown loss type, or ``dr_grpo`` without ``max_completion_length``.
    """
    per_token_loss = per_token_loss.float()
    mask = mask.float()
    masked = per_token_loss * mask
    if loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        if not max_completion_length:
            raise ValueError("loss_type 'dr_grpo' needs max_completion_length")
        return masked.sum() / (per_token_loss.size(0) * max_completion_length)
    if loss_type == "dapo":
        if num_items is None:
            return masked.sum() / mask.sum().clamp(min=1.0)
        return masked.sum() / torch.as_tensor(num_items, dtype=torch.float32, device=masked.device)
    raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")


@dataclass
class GRPOLoss:
    """Output of :func:`grpo_loss`.

    Attributes:
        loss: scalar to back-propagate (before gradient-accumulation scaling).
        per_token_kl: (B, T) k3 KL (times ρ with ``use_bias_correction_kl``, as TRL logs ``kl``), or None at β = 0.
        ratio: (B, T) importance ratio (detached).
        low_clipped: (B, T) bool, ratio < 1 − ε_low where A < 0 (TRL's ``clip_ratio/low``).
        high_clipped: (B, T) bool, ratio > 1 + ε_high where A > 0 (``clip_ratio/high``).
    """

    loss: torch.Tensor
    per_token_kl: torch.Tensor | None
    ratio: torch.Tensor
    low_clipped: torch.Tensor
    high_clipped: torch.Tensor

    @property
    def region_clipped(self) -> torch.Tensor:
        """(B, T) bool, clipped on either side (``clip_ratio/region``)."""
        return self.low_clipped | self.high_clipped


def grpo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logps: torch.Tensor | None = None,
    beta: float = 0.0,
    use_bias_correction_kl: bool = True,
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
    loss_type: str = "dapo",
    max_completion_length: int | None = None,
    num_items: torch.Tensor | float | None = None,
    importance_weights: torch.Tensor | None = None,
) -> GRPOLoss:
    """The GRPO objective for one micro-batch: −clipped surrogate + β·k3, aggregated per ``loss_type``.

    Args:
        logps: (B, T) completion-token log-probs under π_θ (with gradient).
        old_logps: (B, T) under π_old (the policy that sampled; ``logps.detach()`` when it is the current one).
        advantages: (B,) one per completion.
        mask: (B, T) completion mask (see :func:`aggregate_loss`).
        ref_logps: (B, T) under π_ref; required when ``beta`` ≠ 0.
        beta: KL weight β.
        use_bias_correction_kl: multiply the k3 KL by the (differentiable) ratio ρ_t, TRL 1.16's default: the KL
            gradient becomes the unbiased reverse-KL gradient (DeepSeek-V3.2). It changes the gradient whenever
            β ≠ 0, also on-policy where ρ = 1 in value. False = the plain k3 of TRL ≤ 0.2x (TimeZero's recipe).
        epsilon_low, epsilon_high: clip range (see :func:`clipped_surrogate`).
        loss_type, max_completion_length, num_items: see :func:`aggregate_loss`.
        importance_weights: (B, 1) or (B, T) engine-mismatch weights (:func:`engine_importance_weights`), multiplying
            the surrogate's per-token loss before the KL term is added (TRL 1.16 ``_compute_loss``); None = none.

    Returns:
        :class:`GRPOLoss`.

    Raises:
        ValueError: ``beta`` ≠ 0 without ``ref_logps``, or shape mismatches.
    """
    if logps.shape != old_logps.shape or logps.shape != mask.shape:
        raise ValueError(f"shape mismatch: logps {tuple(logps.shape)}, old {tuple(old_logps.shape)}, "
                         f"mask {tuple(mask.shape)}")
    epsilon_high = epsilon_low if epsilon_high is None else epsilon_high
    ratio = importance_ratio(logps, old_logps)
    per_token_kl = None
    if beta != 0.0:  # built before the surrogate, in TRL's order, so autograd sums the gradients in the same order
        if ref_logps is None:
            raise ValueError("beta != 0 needs reference log-probs (ref_logps)")
        per_token_kl = k3_kl(logps, ref_logps)
        if use_bias_correction_kl:
            per_token_kl = per_token_kl * ratio
    per_token_loss = -clipped_surrogate(ratio, advantages, epsilon_low, epsilon_high)
    if importance_weights is not None:
        per_token_loss = per_token_loss * importance_weights
    if per_token_kl is not None:
        per_token_loss = per_token_loss + beta * per_token_kl
    loss = aggregate_loss(per_token_loss, mask, loss_type, max_completion_length, num_items)
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    ratio = ratio.detach()
    return GRPOLoss(
        loss=loss,
        per_token_kl=per_token_kl,
        ratio=ratio,
        low_clipped=(ratio < 1 - epsilon_low) & (adv < 0),
        high_clipped=(ratio > 1 + epsilon_high) & (adv > 0),
    )


def masked_sum_count(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[Σ values·mask, Σ mask]`` as a float tensor of shape (2,), to be summed across processes before dividing
    (a token-weighted global mean, as TRL logs ``kl`` and ``clip_ratio/*``)."""
    mask = mask.float()
    return torch.stack([(values.detach().float() * mask).sum(), mask.sum()])


def injected_rows(start: int, count: int, num_generations: int, device=None) -> torch.Tensor:
    """Which of a process's rows hold the injected ground truth: the last completion of each group
    (TempSamp-R1's ``gt_replace_index: -1``).

    Args:
        start: global index of the process's first row (process_index × rows per process); groups are G
            consecutive global rows.
        count: the process's number of rows.
        num_generations: G.

    Returns:
        (count,) bool. E.g. start 2, count 4, G 4 → [False, True, False, False] (global rows 2..5; row 3 ends a group).
    """
    rows = torch.arange(start, start + count, device=device)
    return rows % num_generations == num_generations - 1


def kept_groups(zero_std: torch.Tensor, group_ids: torch.Tensor) -> list[int]:
    """The ids of the groups DAPO's dynamic sampling keeps: those whose rewards are not all equal.

    Args:
        zero_std: (N,) bool per row (:attr:`Advantages.group_zero_std`), the same for every row of a group.
        group_ids: (N,) the rows' group ids, in any order.

    Returns:
        Group ids in the order of their first row, e.g. zero_std [T, T, F, F, T, T] with ids [5, 5, 6, 6, 7, 7] → [6].

    Raises:
        ValueError: the shapes differ.
    """
    if zero_std.shape != group_ids.shape:
        raise ValueError(f"zero_std {tuple(zero_std.shape)} and group_ids {tuple(group_ids.shape)} differ in shape")
    first: dict[int, bool] = {}
    for gid, zero in zip(group_ids.tolist(), zero_std.tolist()):
        first.setdefault(gid, zero)
    return [gid for gid, zero in first.items() if not zero]


@dataclass
class EngineCorrection:
    """Output of :func:`engine_importance_weights`.

    Attributes:
        weights: (B, 1) for the ``sequence_*`` modes, (B, T) for the ``token_*`` modes: multiplies the per-token
            surrogate loss (:func:`grpo_loss` ``importance_weights``).
        logp_difference_mean, logp_difference_max: mean and max of |log π_old − log π_engine| over the completion
            tokens the engine scored (NaN ones left out; 0.0 when none): TRL's ``sampling/sampling_logp_difference``.
        ratio_min, ratio_mean, ratio_max: of the weights (per sequence, or over the completion tokens):
            TRL's ``sampling/importance_sampling_ratio/*`` (0.0 when empty).
    """

    weights: torch.Tensor
    logp_difference_mean: float
    logp_difference_max: float
    ratio_min: float
    ratio_mean: float
    ratio_max: float


def engine_importance_weights(old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor,
                              mode: str = "sequence_mask", clip_min: float | None = None,
                              clip_max: float | None = 3.0) -> EngineCorrection:
    """Importance weights π_old / π_engine correcting for sampling with an engine (vLLM) whose log-probs differ from the
    trained model's, as TRL 1.16 computes them (``trl/trainer/grpo_trainer.py`` ``_generate_and_score_completions``,
    ``vllm_importance_sampling_correction``; truncated IS, Yao et al. 2025 "Your efficient RL framework secretly brings
    you off-policy RL training").

    ``d_t = (log π_old,t − log π_engine,t)·mask_t`` (a NaN engine log-prob counts as d = 0, ratio 1). ``sequence_*``:
    one ratio ``exp(Σ_t d_t)`` per completion; ``token_*``: ``exp(d_t)`` per token. ``*_truncate`` clamps the ratio to
    [clip_min, clip_max]; ``*_mask`` sets ratios outside it to 0 (a None bound is no bound).

    Args:
        old_logps: (B, T) log-probs of the sampled tokens under π_old (the trained model at generation time).
        sampling_logps: (B, T) the engine's own log-probs of the same tokens (at the same temperature).
        mask: (B, T) completion mask.
        mode: one of :data:`IMPORTANCE_SAMPLING_MODES` (TRL's default ``sequence_mask``).
        clip_min, clip_max: TRL's ``vllm_importance_sampling_clip_min`` (None) and ``_clip_max`` (3.0).

    Returns:
        :class:`EngineCorrection`. Example: old [[−1.0, −2.0]], engine [[−1.1, −2.3]], mask [[1, 1]] →
        sequence ratio exp(0.4) = 1.4918; difference mean 0.2, max 0.3.

    Raises:
        ValueError: unknown ``mode`` or shape mismatch.
    """
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"vllm_importance_sampling_mode must be one of {IMPORTANCE_SAMPLING_MODES}, got {mode!r}")
    if old_logps.shape != sampling_logps.shape or old_logps.shape != mask.shape:
        raise ValueError(f"shape mismatch: old {tuple(old_logps.shape)}, sampling {tuple(sampling_logps.shape)}, "
                         f"mask {tuple(mask.shape)}")
    old, sampled, valid = old_logps.float(), sampling_logps.float(), mask.bool()
    diff = torch.nan_to_num((old - sampled) * mask.float(), nan=0.0)
    sequence = mode.startswith("sequence")
    ratio = torch.exp(diff.sum(dim=-1, keepdim=True) if sequence else diff)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    if mode.endswith("truncate"):
        ratio = torch.clamp(ratio, min=low, max=high)
    else:
        ratio = ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    delta = torch.abs(old - sampled)[valid & ~torch.isnan(sampled)]
    flat = ratio.flatten() if sequence else ratio[valid]

    def stat(values, fn):
        return float(fn(values)) if values.numel() else 0.0

    return EngineCorrection(ratio, stat(delta, torch.mean), stat(delta, torch.max), stat(flat, torch.min),
                            stat(flat, torch.mean), stat(flat, torch.max))
