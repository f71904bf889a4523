"""Metrics for interval sets: the ``set`` scoring (set IoU against every annotated span, with temporal precision and
recall) and QVHighlights' own moment-retrieval metric (``qvhighlights``). Self-contained functions of prediction
records, beside the ``standard``/``clamped`` scorings of :mod:`grounding_rl.reward.metrics`.

A record is a mapping with the ground truth ``start``, ``end``, ``duration`` (seconds), optionally ``spans`` (the
interval set) and ``spans_all`` (every span a TimeLens-Bench entry lists), and the prediction as ``pred_spans``
(a list of ``[start, end]``), else ``pred_start``/``pred_end``, else the ``answer`` text parsed with
:func:`grounding_rl.reward.parsing.parse_spans`. Every query counts (no prediction: IoU 0, AP 0).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from grounding_rl.reward import intervals
from grounding_rl.reward.parsing import parse_spans
from grounding_rl.reward.set_rewards import usable_spans

QVHIGHLIGHTS_R1_THRESHOLDS = (0.5, 0.7)
QVHIGHLIGHTS_AP_THRESHOLDS = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))  # 0.5, 0.55, …, 0.95
QVHIGHLIGHTS_MAX_PRED_WINDOWS = 10


def record_spans(record: Mapping) -> list[tuple[float, float]] | None:
    """The predicted set of a record: ``pred_spans``, else ``(pred_start, pred_end)``, else ``parse_spans(answer)``;
    None when there is none or a value is not finite."""
    spans = record.get("pred_spans")
    if spans is None and record.get("pred_start") is not None and record.get("pred_end") is not None:
        spans = [(record["pred_start"], record["pred_end"])]
    if spans is None:
        return parse_spans(record.get("answer"))
    spans = [(float(s), float(e)) for s, e in spans]
    return spans if spans and all(math.isfinite(t) for span in spans for t in span) else None


def gt_set(record: Mapping, key: str = "spans") -> list[tuple[float, float]]:
    """The record's ground truth as a set: ``record[key]`` when present, else ``spans``, else ``[(start, end)]``."""
    for name in (key, "spans"):
        if record.get(name):
            return [(float(s), float(e)) for s, e in record[name]]
    return [(float(record["start"]), float(record["end"]))]


def set_scores(pred: Sequence[Sequence[float]] | None, gt: Sequence[Sequence[float]],
               duration: float) -> tuple[float, float, float]:
    """``(set IoU, temporal precision, temporal recall)`` of one query, each in [0, 1]: the prediction clamped into
    [0, duration] (none, or a reversed pair → all 0), both sets merged (:mod:`grounding_rl.reward.intervals`)."""
    pred = usable_spans(pred, duration)
    if pred is None:
        return 0.0, 0.0, 0.0
    return (intervals.set_iou(pred, gt), intervals.temporal_precision(pred, gt), intervals.temporal_recall(pred, gt))


def set_metrics(records: Iterable[Mapping], key: str = "spans_all",
                thresholds: Sequence[float] = (0.3, 0.5, 0.7)) -> dict:
    """The ``set`` scoring: R1@m and mIoU by set IoU of the predicted set against the ground-truth set ``key``
    (``spans_all`` for TimeLens-Bench, falling back to ``spans``, then ``(start, end)``), plus mean temporal
    ``precision`` and ``recall``; percentages over all queries, ``n`` their number, ``parse_failure_rate`` the
    queries without a usable prediction. Ties within 1e-9 below m count (as the ``standard`` scoring).
    Raises ValueError for no records."""
    preds = [(record_spans(r), r) for r in records]
    rows = [(set_scores(pred, gt_set(r, key), float(r["duration"])), pred is None) for pred, r in preds]
    if not rows:
        raise ValueError("set_metrics: no records")
    n = len(rows)
    out: dict = {"n": n}
    for m in thresholds:
        out[f"R1@{m}"] = 100.0 * sum(iou >= m - 1e-9 for (iou, _, _), _ in rows) / n
    out["mIoU"] = 100.0 * sum(iou for (iou, _, _), _ in rows) / n
    out["precision"] = 100.0 * sum(p for (_, p, _), _ in rows) / n
    out["recall"] = 100.0 * sum(r for (_, _, r), _ in rows) / n
    out["parse_failure_rate"] = 100.0 * sum(failed for _, failed in rows) / n
    return out


def _window_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """IoU of two windows as moment_detr computes it (intersection over the hull; 0 for an empty hull)."""
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    hull = max(a[1], b[1]) - min(a[0], b[0])
    return inter / hull if hull != 0 else 0.0


def _interpolated_ap(precision: list[float], recall: list[float]) -> float:
    """VOC 2011 interpolated AP (moment_detr ``interpolated_precision_recall``)."""
    mp, mr = [0.0, *precision, 0.0], [0.0, *recall, 1.0]
    for i in range(len(mp) - 2, -1, -1):
        mp[i] = max(mp[i], mp[i + 1])
    return sum((mr[i] - mr[i - 1]) * mp[i] for i in range(1, len(mr)) if mr[i] != mr[i - 1])


def detection_ap(pred: Sequence[Sequence[float]], gt: Sequence[Sequence[float]],
                 thresholds: Sequence[float] = QVHIGHLIGHTS_AP_THRESHOLDS) -> list[float]:
    """Average precision of one query's ranked predicted windows (best first) against its GT windows, per IoU
    threshold in [0, 1]: greedy matching of each prediction to the unmatched GT window of highest IoU ≥ threshold,
    interpolated AP (moment_detr ``compute_average_precision_detection``; predictions in the given order stand for
    descending scores). No prediction → zeros."""
    if not pred:
        return [0.0] * len(thresholds)
    out = []
    for threshold in thresholds:
        locked: set[int] = set()
        tp = []
        for window in pred:
            ious = [_cross_iou(window, g) for g in gt]
            hit = 0
            for j in sorted(range(len(gt)), key=lambda k: ious[k], reverse=True):
                if ious[j] < threshold:
                    break
                if j in locked:
                    continue
                locked.add(j)
                hit = 1
                break
            tp.append(hit)
        cum_tp, precision, recall = 0, [], []
        for k, hit in enumerate(tp, 1):
            cum_tp += hit
            precision.append(cum_tp / k)
            recall.append(cum_tp / len(gt))
        out.append(_interpolated_ap(precision, recall))
    return out


def _cross_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """IoU with the true union (moment_detr ``compute_temporal_iou_batch_cross``); NaN-free: 0 for an empty union."""
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = (a[1] - a[0]) + (b[1] - b[0]) - inter
    return inter / union if union > 0 else 0.0


def qvhighlights_metrics(records: Iterable[Mapping]) -> dict:
    """QVHighlights' moment-retrieval metric (Lei et al., NeurIPS 2021; jayleicn/moment_detr
    ``standalone_eval/eval.py``, the "full" length range): ``R1@0.5``/``R1@0.7`` — the first predicted window against
    the GT window it overlaps most, IoU ≥ m — and ``mAP@0.5``, ``mAP@0.75``, ``mAP`` (the mean over IoU 0.5:0.05:0.95)
    of the first 10 predicted windows ranked in written order; percentages over all ``n`` queries (a query without a
    prediction scores 0; moment_detr requires one per query). Predictions are clamped into the video; a reversed pair
    makes the answer unusable. Differences from moment_detr: no rounding to 2 decimals, written order instead of
    scores. Raises ValueError for no records."""
    r1 = {m: 0 for m in QVHIGHLIGHTS_R1_THRESHOLDS}
    ap_sum = [0.0] * len(QVHIGHLIGHTS_AP_THRESHOLDS)
    n = 0
    for record in records:
        n += 1
        gt = gt_set(record)
        pred = usable_spans(record_spans(record), float(record["duration"]))
        if not pred:
            continue
        first = pred[0]
        best = max(gt, key=lambda g: _cross_iou(first, g))
        iou = _window_iou(first, best)
        for m in r1:
            r1[m] += iou >= m
        for k, ap in enumerate(detection_ap(pred[:QVHIGHLIGHTS_MAX_PRED_WINDOWS], gt)):
            ap_sum[k] += ap
    if n == 0:
        raise ValueError("qvhighlights_metrics: no records")
    out: dict = {"n": n}
    out.update({f"R1@{m}": 100.0 * c / n for m, c in r1.items()})
    aps = dict(zip(QVHIGHLIGHTS_AP_THRESHOLDS, ap_sum))
    out["mAP@0.5"] = 100.0 * aps[0.5] / n
    out["mAP@0.75"] = 100.0 * aps[0.75] / n
    out["mAP"] = 100.0 * sum(ap_sum) / len(ap_sum) / n
    return out
