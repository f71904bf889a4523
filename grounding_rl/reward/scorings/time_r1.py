"""``time_r1``: xiaomi-research/time-r1 @7f2b594, ``evaluate.py:125-150`` (``extract_answer``) and
``src/vllm_inference/eval_all.py:65-131`` (``compute_IoU``, ``load_scored_data``, ``calc_score``).

* Parser: TimeZero's (:func:`~grounding_rl.reward.scorings.timezero.timezero_pair`: the last ``a to b`` / ``a and b``
  anywhere, else inside ``<answer>``).
* IoU in numpy: ``max(0, min(ends) − max(starts)) / max(0, max(ends) − min(starts))`` (0/0 → NaN, which then fails
  every threshold and makes mIoU NaN); a reversed pair → 0; no pair → 0.0, counted.
* R1@m counts ``IoU > m`` — **strict**: an exact tie misses. mIoU = ``np.mean`` × 100.
* Scores are stored by ``qid``: a repeated qid keeps the last. A query with no text was never written to their
  predictions file: left out of n.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from grounding_rl.reward.scorings.registry import THRESHOLDS, Scoring, annotation, register
from grounding_rl.reward.scorings.timezero import timezero_pair


def score(records: Sequence[Mapping]) -> dict:
    """Time-R1's metrics of ``records`` (see the module docstring)."""
    by_qid: dict = {}
    for r in records:
        text = r.get("answer")
        if not isinstance(text, str):
            continue
        pair = timezero_pair(text)
        iou = 0.0
        if pair is not None:
            (ps, pe), (gs, ge) = np.asarray(pair, dtype=np.float64), annotation(r)
            inter = np.maximum(0.0, np.minimum(pe, ge) - np.maximum(ps, gs))
            union = np.maximum(0.0, np.maximum(pe, ge) - np.minimum(ps, gs))
            with np.errstate(invalid="ignore"):
                iou = float(1.0 * inter / union)
        by_qid[r.get("qid")] = (iou, pair is None)
    values = [iou for iou, _ in by_qid.values()]
    n = len(values)
    out: dict = {"n": n, "mIoU": float(np.mean(values) * 100)}
    for m in THRESHOLDS:
        out[f"R1@{m}"] = len([v for v in values if v > m]) / n * 100.0
    out["parse_failure_rate"] = 100 * sum(failed for _, failed in by_qid.values()) / n
    return out


register(Scoring("time_r1", "xiaomi-research/time-r1 @7f2b594, evaluate.py:125-150 (extract_answer), "
                 "src/vllm_inference/eval_all.py:65-131 (compute_IoU, calc_score)", score))
