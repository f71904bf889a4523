"""Metrics for interval sets: the ``set`` scoring (set IoU against every annotated span, with temporal precision and
recall) and QVHighlights' own moment-retrieval metric (``qvhighlights``). Self-contained functions of prediction
records, beside the ``standard``/``clamped`` scorings of :mod:`grounding_rl.reward.metrics`.

A record is a mapping with the ground truth ``start``, ``end``, ``duration`` (seconds), optionally ``spans`` (the
interval set) and ``spans_all`` (every span a TimeLens-Bench entry lists), and the prediction as ``pred_spans``
(a list of ``[start, end]``), else ``pred_start``/``pred_end``, else the ``answer`` text parsed with
:func:`grounding_rl.prompts.parsing.parse_spans`. Every query counts (no prediction: IoU 0, AP 0).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from grounding_rl.reward import intervals
from grounding_rl.prompts.parsing import parse_spans
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
    spans = [(float(span[0]), float(span[1])) for span in spans]  # a third number (a score) is the ranking's
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
    threshold in [0, 1], as moment_detr's ``standalone_eval/utils.py`` ``compute_average_precision_detection``
    (@b7e553a): each prediction tries the GT windows in descending IoU (ties: the later window first, numpy's
    ``argsort()[::-1]``; a NaN IoU, 0/0 between two empty windows, first), takes the first unmatched one unless its
    IoU is below the threshold (NaN is not below: an empty window matches an empty GT window), else is a false
    positive; then interpolated AP. No prediction → zeros."""
    if not pred:
        return [0.0] * len(thresholds)
    out = []
    for threshold in thresholds:
        locked: set[int] = set()
        tp = []
        for window in pred:
            ious = [_cross_iou(window, g) for g in gt]
            ascending = sorted(range(len(gt)), key=lambda k: (math.isnan(ious[k]), 0.0 if math.isnan(ious[k])
                                                              else ious[k]))
            hit = 0
            for j in reversed(ascending):
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
    """IoU with the true union (moment_detr ``compute_temporal_iou_batch_cross``): NaN for 0 / 0 (two empty
    windows), as numpy gives it there."""
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = (a[1] - a[0]) + (b[1] - b[0]) - inter
    return inter / union if union != 0 else math.nan


def _first_argmax(values: list[float]) -> int:
    """numpy's ``argmax``: the first NaN if any, else the first maximum."""
    for k, v in enumerate(values):
        if math.isnan(v):
            return k
    return max(range(len(values)), key=lambda k: (values[k], -k))


def _ranked_prediction(record: Mapping) -> tuple[list[tuple[float, float]], list[float] | None] | None:
    """The predicted windows in written order, unclamped, and their scores (moment_detr's third number of each
    ``pred_spans`` window; None for windows without one: text answers, ``pred_start``/``pred_end``); None when there
    is no usable prediction (none, a non-finite time, a reversed pair).

    Raises:
        ValueError: some ``pred_spans`` windows carry a score and others do not.
    """
    raw = record.get("pred_spans")
    scores = None
    if raw is not None and any(len(w) > 2 for w in raw):
        if not all(len(w) > 2 for w in raw):
            raise ValueError(f"qid {record.get('qid')}: pred_spans has a score on some windows only: {list(raw)}")
        scores = [float(w[2]) for w in raw]
    spans = record_spans(record)
    if not spans or any(s > e for s, e in spans):
        return None
    return spans, scores


def qvhighlights_metrics(records: Iterable[Mapping]) -> dict:
    """QVHighlights' moment-retrieval metric (Lei et al., NeurIPS 2021; jayleicn/moment_detr @b7e553a
    ``standalone_eval/eval.py`` ``eval_moment_retrieval``, the "full" length range: ``compute_mr_r1`` and
    ``compute_mr_ap`` with ``max_pred_windows=10``), rule for rule:

    - ``R1@0.5``/``R1@0.7``: the first *written* predicted window against the GT window of highest IoU (numpy
      ``argmax``), by the hull IoU of ``compute_temporal_iou_batch_paired`` (0 for an empty hull: an empty window
      against an empty GT window is no hit), ≥ m;
    - ``mAP@0.5``, ``mAP@0.75``, ``mAP`` (mean over IoU 0.5:0.05:0.95): the first 10 written windows ranked by their
      score (the third number of a ``pred_spans`` window, as in moment_detr's ``pred_relevant_windows``; stable sort),
      or in written order when they have none (a text answer), :func:`detection_ap`;
    - the GT windows as annotated: ``raw_spans`` when the record has them (``prepare`` merges touching windows into
      ``spans``; moment_detr keeps each an instance), else ``spans``, else ``(start, end)``;
    - predicted windows as given: not clamped into the video, repeats kept (each repeat a false positive once its GT
      window is taken).

    Percentages over all ``n`` queries, not rounded (moment_detr rounds to 2 decimals); a query without a usable
    prediction (none, a reversed pair) scores 0 (moment_detr requires one per query).

    Raises:
        ValueError: no records; ``pred_spans`` with a score on some windows only.
    """
    r1 = {m: 0 for m in QVHIGHLIGHTS_R1_THRESHOLDS}
    ap_sum = [0.0] * len(QVHIGHLIGHTS_AP_THRESHOLDS)
    n = 0
    for record in records:
        n += 1
        gt = gt_set(record, "raw_spans")
        prediction = _ranked_prediction(record)
        if prediction is None:
            continue
        pred, scores = prediction
        first = pred[0]
        best = gt[_first_argmax([_cross_iou(first, g) for g in gt])]
        iou = _window_iou(first, best)
        for m in r1:
            r1[m] += iou >= m
        ranked = list(range(min(len(pred), QVHIGHLIGHTS_MAX_PRED_WINDOWS)))
        if scores is not None:
            ranked.sort(key=lambda k: -scores[k])
        for k, ap in enumerate(detection_ap([pred[i] for i in ranked], gt)):
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
