"""Temporal intersection-over-union of time intervals in seconds.

IoU = |pred ∩ gt| / |pred ∪ gt| on the real line. When the union is empty (both intervals are the same single point, or
two zero-length intervals) the IoU is 1.0 for identical points and 0.0 otherwise, never a division by zero.
"""
from __future__ import annotations

import math
from collections.abc import Sequence


def _check(interval: Sequence[float], name: str) -> tuple[float, float]:
    if len(interval) != 2:
        raise ValueError(f"{name} must be a (start, end) pair, got {interval!r}")
    start, end = float(interval[0]), float(interval[1])
    if not (math.isfinite(start) and math.isfinite(end)):
        raise ValueError(f"{name} must be finite, got {interval!r}")
    if start > end:
        raise ValueError(f"{name} is reversed (start > end): {interval!r}")
    return start, end


def temporal_iou(pred: Sequence[float], gt: Sequence[float]) -> float:
    """Temporal IoU of two ``(start, end)`` intervals in seconds, in [0, 1].

    Zero union: identical points → 1.0, else 0.0. Raises ValueError for a reversed (start > end) or non-finite
    interval; callers apply their own policy to reversed predictions first (see ``rewards.query_iou``).
    Example: gt (15, 18), pred (15.3, 18.5) → 2.7 / 3.5 = 0.7714.
    """
    ps, pe = _check(pred, "pred")
    gs, ge = _check(gt, "gt")
    inter = max(0.0, min(pe, ge) - max(ps, gs))
    union = (pe - ps) + (ge - gs) - inter
    if union <= 0.0:
        return 1.0 if (ps, pe) == (gs, ge) else 0.0
    return min(1.0, inter / union)


def clamp_interval(pred: Sequence[float], duration: float) -> tuple[float, float]:
    """Clamp both ends of ``pred`` (seconds) into [0, duration]. Order is kept: a reversed pair stays reversed.

    Raises ValueError when ``duration`` is not a positive finite number.
    """
    duration = float(duration)
    if not (math.isfinite(duration) and duration > 0):
        raise ValueError(f"duration must be a positive finite number of seconds, got {duration!r}")
    return min(max(float(pred[0]), 0.0), duration), min(max(float(pred[1]), 0.0), duration)
