"""``timelens``: TencentARC/TimeLens @5d90c06, ``evaluation/eval_dataloader.py`` (inference: parse, failure rule,
rounding, keys) then ``evaluation/compute_metrics.py``, with ``timelens/utils.py`` (``extract_time``, ``iou``).

* Parser (:func:`timelens_pairs`): lower-cased text; clocks ``h:mm:ss`` / ``mm:ss`` (optional decimals) first, paired
  in order; else every ``a - b`` (``\\d+\\.?\\d*``, spaces around the dash allowed), else every ``a to b``; else any
  numbers (``\\b(\\d+\\.\\d+|\\d+)\\b``) paired in order (an odd last one dropped). The first pair is scored.
  ``<answer>`` tags are not read specially: numbers in a ``<think>`` block count.
* No pair → the pair (duration + 10, duration + 20) (IoU 0 unless the annotation reaches past it), counted in n.
* Every time is rounded to whole seconds (``round(t / 1.0) * 1.0``, Python's round: halves to even) before the IoU.
* A reversed pair: IoU 0 (the intersection is negative).
* IoU ``max(min(ends) − max(starts), 0) / (max(ends) − min(starts))`` in floats; R1@m counts IoU ≥ m.
* Predictions are stored under ``basename(video)>>>query>>>[start, end]``: queries with the same key collapse to one,
  the last prediction kept; n = the number of keys.
* Missing prediction (no text): their loop always has an answer; taken here as an empty answer (no pair).
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from grounding_rl.reward.scorings.registry import THRESHOLDS, Scoring, annotation, register

UNIT = 1.0  # evaluation/eval_dataloader.py: getattr(dataset_class, "UNIT", 1.0); no dataset class sets it

_CLOCK = re.compile(r"\b(\d{1,2}:\d{2}:\d{2}(?:\.\d+)?|\d{1,2}:\d{2}(?:\.\d+)?)\b")
_DASH = re.compile(r"(\d+\.?\d*)\s*-\s*(\d+\.?\d*)")
_TO = re.compile(r"(\d+\.?\d*)\s+to\s+(\d+\.?\d*)")
NUMBER = re.compile(r"\b(\d+\.\d+|\d+)\b")


def _clock_seconds(text: str) -> float:
    fields = text.split(":")
    if len(fields) == 3:
        return float(int(fields[0]) * 3600 + int(fields[1]) * 60 + float(fields[2]))
    return float(int(fields[0]) * 60 + float(fields[1]))


def _in_twos(values: list[float]) -> list[tuple[float, float]]:
    values = values[: len(values) // 2 * 2]
    return [(values[i], values[i + 1]) for i in range(0, len(values), 2)]


def timelens_pairs(text: str, number: re.Pattern = NUMBER) -> list[tuple[float, float]]:
    """Every ``(start, end)`` pair TimeLens's parser reads from ``text`` (seconds, as written: reversed kept), in
    order; ``number`` is the last fallback's pattern (lmms-eval's copy uses ``\\b\\d+\\.?\\d*\\b``)."""
    text = text.lower()
    clocks = _in_twos([_clock_seconds(t) for t in _CLOCK.findall(text)])
    if clocks:
        return clocks
    for pattern in (_DASH, _TO):
        found = pattern.findall(text)
        if found:
            return [(float(a), float(b)) for a, b in found]
    return _in_twos([float(t) for t in number.findall(text)])


def hull_iou(a: tuple[float, float], b: tuple[float, float]) -> float:
    """``max(min(ends) − max(starts), 0) / (max(ends) − min(starts))`` in floats (ZeroDivisionError on a zero hull,
    as in TimeLens's ``iou``)."""
    return max(min(a[1], b[1]) - max(a[0], b[0]), 0) / (max(a[1], b[1]) - min(a[0], b[0]))


_THINK_ANSWER = re.compile(r"<think>.*?</think>\s*<answer>(.*?)</answer>", re.DOTALL)


def timelens_filter_iou(answer: str, gt: Sequence[float], duration: float) -> float:
    """The IoU TimeLens's training-data filter gives one greedy answer (TencentARC/TimeLens @5d90c06,
    ``training/filter/infer_qwen3_vl_tvg_dataloader_filter_data.py`` with ``training/utils/parser.py``), the score its
    difficulty-weighted draw reads (``difficulty_sampling: timelens``).

    Rules (they differ from its evaluation parser, :func:`timelens_pairs`): the text inside a leading
    ``<think>…</think> <answer>…</answer>`` when the answer has that shape, else all of it; lower-cased, then every
    ``"to"`` replaced by ``"-"`` (inside words too: ``"tomato"`` reads ``"-ma-"``); then :func:`timelens_pairs`; no pair
    → ``(duration + 10, duration + 20)``; the first pair as written (not rounded, not clamped into the video, a
    reversed pair kept) against the raw ground truth; a hull of length ≤ 0 scores 0.0.

    Args:
        answer: the model's raw text.
        gt: the annotation's (start, end), seconds (its first span).
        duration: the clip's length, seconds.

    Returns:
        the IoU in [0, 1].
    """
    match = _THINK_ANSWER.match(answer)
    text = (match.group(1) if match else answer).lower().replace("to", "-")
    pairs = timelens_pairs(text)
    pred = pairs[0] if pairs else (duration + 10, duration + 20)
    hull = max(pred[1], gt[1]) - min(pred[0], gt[0])
    if hull <= 0:
        return 0.0
    return max(min(pred[1], gt[1]) - max(pred[0], gt[0]), 0) / hull


def score(records: Sequence[Mapping]) -> dict:
    """TimeLens's metrics of ``records`` (see the module docstring for the rules)."""
    latest: dict[str, tuple[tuple[float, float], tuple[float, float], bool]] = {}
    for r in records:
        gt = annotation(r)
        pairs = timelens_pairs(r.get("answer") or "")
        duration = float(r["duration"])
        start, end = pairs[0] if pairs else (duration + 10, duration + 20)
        pair = (round(start / UNIT) * UNIT, round(end / UNIT) * UNIT)
        latest[f"{os.path.basename(str(r.get('video')))}>>>{r.get('query')}>>>{list(gt)}"] = (gt, pair, not pairs)
    ious, failures = [], 0
    for gt, pair, failed in latest.values():
        failures += failed
        ious.append(hull_iou(gt, pair))
    n = len(ious)
    out: dict = {"n": n}
    for m in THRESHOLDS:
        out[f"R1@{m}"] = sum(1 for iou in ious if iou >= m) * 100 / n
    out["mIoU"] = sum(ious) * 100 / n
    out["parse_failure_rate"] = 100 * failures / n
    return out


SCORING = register(Scoring(
    "timelens", "TencentARC/TimeLens @5d90c06, evaluation/eval_dataloader.py + evaluation/compute_metrics.py + "
                "timelens/utils.py", score))
