"""Temporal intersection-over-union of time intervals in seconds.

IoU = |pred ∩ gt| / |pred ∪ gt| on the real line. When the union is empty (both intervals are the same single point, or
two zero-length intervals) the IoU is 1.0 for identical points and 0.0 otherwise, never a division by zero.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


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


def temporal_iou_batch(preds, gts) -> np.ndarray:
    """Element-wise temporal IoU of ``preds`` and ``gts``, both array-likes of shape (N, 2) in seconds → float64 (N,).

    Same rule as ``temporal_iou`` (zero union: identical points → 1.0, else 0.0). Raises ValueError for mismatched
    shapes, non-finite values or any reversed interval (naming its row).
    """
    p, g = np.asarray(preds, dtype=np.float64), np.asarray(gts, dtype=np.float64)
    if p.size == 0 and g.size == 0:
        return np.zeros(0)
    if p.shape != g.shape or p.ndim != 2 or p.shape[1] != 2:
        raise ValueError(f"preds and gts must have the same shape (N, 2), got {p.shape} and {g.shape}")
    for name, arr in (("pred", p), ("gt", g)):
        if not np.isfinite(arr).all():
            raise ValueError(f"{name} row {int(np.argwhere(~np.isfinite(arr))[0, 0])} is not finite")
        bad = np.flatnonzero(arr[:, 0] > arr[:, 1])
        if bad.size:
            raise ValueError(f"{name} row {int(bad[0])} is reversed (start > end): {arr[bad[0]].tolist()}")
    inter = np.clip(np.minimum(p[:, 1], g[:, 1]) - np.maximum(p[:, 0], g[:, 0]), 0.0, None)
    union = (p[:, 1] - p[:, 0]) + (g[:, 1] - g[:, 0]) - inter
    same = (p == g).all(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where(union > 0, inter / np.where(union > 0, union, 1.0), same.astype(np.float64))
    return np.clip(iou, 0.0, 1.0)


def clamp_interval(pred: Sequence[float], duration: float) -> tuple[float, float]:
    """Clamp both ends of ``pred`` (seconds) into [0, duration]. Order is kept: a reversed pair stays reversed.

    Raises ValueError when ``duration`` is not a positive finite number.
    """
    duration = float(duration)
    if not (math.isfinite(duration) and duration > 0):
        raise ValueError(f"duration must be a positive finite number of seconds, got {duration!r}")
    return min(max(float(pred[0]), 0.0), duration), min(max(float(pred[1]), 0.0), duration)
