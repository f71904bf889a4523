"""GRPO reward functions for temporal grounding and their weighted sum (issue 3, point 3).

Each reward has TRL's reward-function signature ``fn(completions, **columns) -> list[float]``: ``completions`` as TRL
passes them (strings or conversational message lists), ``columns`` the dataset columns as lists with one entry per
completion, of which ``start``, ``end`` (ground truth) and ``duration`` (all seconds) are used; TRL's extra keyword
arguments (``prompts``, ``completion_ids``, ``trainer_state``, ``log_extra``…) are accepted and ignored.

Registry names: ``iou``, ``format``, ``tiou``. Combine them with ``reward_weights`` as TRL does
(``GRPOConfig.reward_weights``; ``weighted_rewards`` reproduces the sum for tests and logs).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import numpy as np

from grounding_rl.reward.iou import clamp_interval, temporal_iou
from grounding_rl.reward.parsing import completion_text, parse_answer

_NO_TAG = r"(?:(?!</?think>|</?answer>).)*"
_FORMAT_RE = re.compile(rf"\s*<think>{_NO_TAG}</think>\s*<answer>{_NO_TAG}</answer>\s*", re.DOTALL)


def query_iou(pred: Sequence[float] | None, gt: Sequence[float], duration: float) -> float:
    """IoU of one prediction under the ``iou`` reward's rule, shared by rewards, eval and metrics.

    ``pred`` is a parsed ``(start, end)`` in seconds or None. None or reversed (start > end) → 0.0; otherwise the
    prediction is clamped to [0, duration] and compared with ``gt`` by ``temporal_iou``. Raises ValueError for a
    non-positive duration or a reversed/non-finite ground truth.
    """
    if pred is None or not all(math.isfinite(float(t)) for t in pred) or pred[0] > pred[1]:
        return 0.0
    return temporal_iou(clamp_interval(pred, duration), gt)


def _columns(completions: Sequence, columns: dict) -> list[tuple[tuple[float, float], float]]:
    """``[((start, end), duration), …]`` per completion; ValueError when a column is missing or has another length."""
    for key in ("start", "end", "duration"):
        if key not in columns:
            raise ValueError(f"reward needs a {key!r} column (seconds), got columns {sorted(columns)}")
        if len(columns[key]) != len(completions):
            raise ValueError(f"column {key!r} has {len(columns[key])} values for {len(completions)} completions")
    return [((float(s), float(e)), float(d)) for s, e, d in zip(columns["start"], columns["end"], columns["duration"])]


def _per_sample(completions, columns, score: Callable[..., float]) -> list[float]:
    """``score(parsed_pred, gt, duration)`` per completion; errors name the sample index."""
    out = []
    for i, (completion, (gt, duration)) in enumerate(zip(completions, _columns(completions, columns))):
        try:
            out.append(float(score(parse_answer(completion_text(completion)), gt, duration)))
        except (ValueError, TypeError) as err:
            raise ValueError(f"reward: sample {i}: {err}") from err
    return out


def iou_reward(completions, **columns) -> list[float]:
    """Temporal IoU in [0, 1] of the parsed answer with (start, end), prediction clamped to [0, duration].

    Unparseable or reversed answers get 0.0 (``query_iou``). Issue 3's seed, gt (15, 18): "10.00 to 12.00" → 0.0,
    "15.30 to 18.50" → 0.7714, "15.00 to 18.00" → 1.0, "14.80 to 18.20" → 0.8824.
    """
    return _per_sample(completions, columns, query_iou)


def format_reward(completions, **columns) -> list[float]:
    """1.0 when the completion is exactly ``<think>…</think>`` then ``<answer>…</answer>`` (whitespace allowed between
    and around, no other tags inside) and the answer parses (``parse_answer``), else 0.0. Uses no columns."""
    out = []
    for completion in completions:
        text = completion_text(completion)
        ok = _FORMAT_RE.fullmatch(text) is not None and parse_answer(text) is not None
        out.append(1.0 if ok else 0.0)
    return out


def _tiou(pred, gt, duration) -> float:
    iou = query_iou(pred, gt, duration)
    if iou == 0.0:
        return 0.0
    ps, pe = clamp_interval(pred, duration)
    value = iou * (1 - abs(ps - gt[0]) / duration) * (1 - abs(pe - gt[1]) / duration)
    return max(0.0, value)


def tiou_reward(completions, **columns) -> list[float]:
    """Time-R1's timestamp-aware IoU: IoU · (1 − |Δs|/D) · (1 − |Δe|/D), never below 0.

    IoU as in ``iou_reward`` (clamped prediction; unparseable or reversed → 0), Δs/Δe the clamped prediction's start
    and end minus the ground truth's, D the video duration. Source: "Time-R1: Post-Training Large Vision Language Model
    for Temporal Video Grounding" (arXiv:2503.13377), the timestamp-aware IoU reward.
    """
    return _per_sample(completions, columns, _tiou)


REWARD_FUNCS: dict[str, Callable[..., list[float]]] = {
    "iou": iou_reward,
    "format": format_reward,
    "tiou": tiou_reward,
}


def get_reward_funcs(names: Sequence[str]) -> list[Callable[..., list[float]]]:
    """Reward functions for ``names`` (e.g. ``["iou", "format"]``), in order. ValueError on an unknown name."""
    if isinstance(names, str):
        names = [names]
    unknown = [n for n in names if n not in REWARD_FUNCS]
    if unknown:
        raise ValueError(f"unknown reward function(s) {unknown}; known: {sorted(REWARD_FUNCS)}")
    return [REWARD_FUNCS[n] for n in names]


def weighted_rewards(per_func, weights: Sequence[float] | None = None) -> list[float]:
    """Total reward per completion, as TRL's GRPOTrainer sums it: ``nansum_k(weights[k] · per_func[k][i])``.

    ``per_func`` is indexed [function][completion], shape (F, N): a list of the reward functions' outputs, a numpy
    array or a torch tensor; None entries count as NaN (TRL lets a function skip a sample). ``weights`` defaults to
    1.0 per function (TRL's ``reward_weights=None``). As in TRL, a completion that every function skipped (all NaN)
    gets NaN. Raises ValueError when the number of weights differs from F. Issue 3: weights [5, 1] on the seed →
    [1.0, 4.857, 6.0, 5.412].
    """
    if hasattr(per_func, "detach"):
        per_func = per_func.detach().float().cpu().numpy()
    rewards = np.asarray(per_func, dtype=np.float64)
    if rewards.ndim != 2:
        raise ValueError(f"per_func must have shape (num_funcs, num_completions), got {rewards.shape}")
    w = np.ones(rewards.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (rewards.shape[0],):
        raise ValueError(
            f"Number of reward weights ({w.size}) must match number of reward functions ({rewards.shape[0]})"
        )
    total = np.nansum(rewards * w[:, None], axis=0)
    total[np.isnan(rewards).all(axis=0)] = np.nan
    return total.tolist()
