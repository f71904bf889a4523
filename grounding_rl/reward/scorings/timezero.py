"""``timezero``: www-Ye/TimeZero @a7c3523, ``evaluate.py`` (``parse_timestamp_output`` lines 79-100, the scoring loop
lines 207-213; OpenGVLab/VideoChat-R1's ``src_eval/evaluate_grounding.py`` is byte-identical there).

* Parser (:func:`timezero_pair`): every ``a to b`` / ``a and b`` with single spaces (``\\d+\\.?\\d*``) in the whole
  text — ``<think>`` included — and the **last** one is taken; only when there is none anywhere, the same inside the
  first ``<answer>…</answer>``. No dashes, no clocks.
* IoU ``(min(ends) − max(starts)) / (max(ends) − min(starts))`` in floats, not clipped for R1: R1@m counts
  ``m <= iou``; mIoU averages ``max(iou, 0)``. A reversed pair gives a negative value → 0. No pair → 0, counted.
* A query with no text (their loop skips a missing video, and an exception such as a zero hull drops the query) is
  left out of n. No keying: every query counts.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from grounding_rl.reward.scorings.registry import THRESHOLDS, Scoring, annotation, register

_PAIR = re.compile(r"(\d+\.?\d*) (to|and) (\d+\.?\d*)")
_ANSWER = re.compile(r"<answer>(.*?)</answer>")


def timezero_pair(text: str) -> tuple[float, float] | None:
    """The pair TimeZero's and Time-R1's parser reads from ``text`` (as written; reversed kept), or None."""
    found = _PAIR.findall(text)
    if not found:
        answer = _ANSWER.search(text)
        found = _PAIR.findall(answer.group(1).strip()) if answer else []
    return (float(found[-1][0]), float(found[-1][2])) if found else None


def score(records: Sequence[Mapping]) -> dict:
    """TimeZero's metrics of ``records`` (see the module docstring)."""
    ious, hits, failures = [], [0, 0, 0], 0
    for r in records:
        text = r.get("answer")
        if not isinstance(text, str):
            continue
        pair = timezero_pair(text)
        if pair is None:
            ious.append(0)
            failures += 1
            continue
        (s, e), (sp, ep) = annotation(r), pair
        union = max(e, ep) - min(s, sp)
        if union == 0:
            continue  # ZeroDivisionError in their loop: the query is dropped
        iou = (min(e, ep) - max(s, sp)) / union
        ious.append(max(iou, 0))
        hits = [h + (m <= iou) for h, m in zip(hits, THRESHOLDS)]
    n = len(ious)
    out: dict = {"n": n, "mIoU": 100 * (sum(ious) / n)}
    for h, m in zip(hits, THRESHOLDS):
        out[f"R1@{m}"] = 100 * (h / n)
    out["parse_failure_rate"] = 100 * failures / n
    return out


register(Scoring("timezero", "www-Ye/TimeZero @a7c3523, evaluate.py:79-100 (parse_timestamp_output), 207-213", score))
