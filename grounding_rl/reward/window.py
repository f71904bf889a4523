"""Rewards of the crop tool's requests (multi-turn GRPO): how well the requested window frames the ground truth, and a
cost per request.

Our definition (no grounding peer trains a crop tool): the **window reward** is the temporal IoU of the *last*
window the model sampled with the ground truth, 0 when it sampled none. The last window is the one the answer was
made from; IoU (not coverage alone) so that asking for the whole video is not rewarded: a window must contain the
moment and little else. **Coverage** |W ∩ G| / |G|, the share of the ground truth inside the window, is the logged
``zoom/coverage`` (a window cannot help the answer beyond it). Zoom-Zero (arXiv 2512.14273) rewards the answer being
correct after zooming into the predicted span, the question-answering analogue of this reward; it is not reproduced
here. The **turn cost** is −(crop requests), its reward weight the cost per request.

The reward functions read two columns the multi-turn rollout adds to every row: ``crop_windows`` (the sampled
windows, [start, end] seconds each) and ``crop_calls`` (requests made, refused ones included).
"""
from __future__ import annotations

from collections.abc import Sequence

from grounding_rl.reward.iou import temporal_iou


def window_coverage(window: Sequence[float], gt: Sequence[float]) -> float:
    """|W ∩ G| / |G| in [0, 1]: the share of the ground truth (start, end) seconds inside the window. A zero-length
    ground truth counts 1.0 inside the window (ends included), else 0.0. E.g. window (4, 12), gt (10, 14) → 0.5."""
    ws, we = float(window[0]), float(window[1])
    gs, ge = float(gt[0]), float(gt[1])
    if ge <= gs:
        return 1.0 if ws <= gs <= we else 0.0
    return max(0.0, min(we, ge) - max(ws, gs)) / (ge - gs)


def window_reward(windows: Sequence[Sequence[float]], gt: Sequence[float]) -> float:
    """Temporal IoU of the last window with the ground truth; 0.0 without a window. E.g. windows [(0, 30), (4, 12)],
    gt (5, 9) → 4 / 8 = 0.5."""
    return temporal_iou(windows[-1], gt) if windows else 0.0


def crop_window_reward(completions, crop_windows=None, start=None, end=None, **columns) -> list[float]:
    """:func:`window_reward` per completion (registered as ``crop_window``).

    Raises:
        ValueError: the rollout is not multi-turn (no ``crop_windows`` column).
    """
    if crop_windows is None:
        raise ValueError("reward crop_window needs the crop tool (max_tool_calling_iterations > 0)")
    return [window_reward(w or [], (s, e)) for w, s, e in zip(crop_windows, start, end, strict=True)]


def crop_cost_reward(completions, crop_calls=None, **columns) -> list[float]:
    """−(crop requests) per completion (registered as ``crop_cost``; its weight is the cost per request).

    Raises:
        ValueError: the rollout is not multi-turn (no ``crop_calls`` column).
    """
    if crop_calls is None:
        raise ValueError("reward crop_cost needs the crop tool (max_tool_calling_iterations > 0)")
    return [0.0 - calls for calls in crop_calls]  # 0.0, not -0.0, for no request (logs would show -0.0)


WINDOW_REWARDS = {"crop_window": crop_window_reward, "crop_cost": crop_cost_reward}
