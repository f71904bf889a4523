"""Evaluation metrics for temporal grounding: R1@m, mIoU, parse-failure and format rates, under two named scorings.

R1@m is the percent of queries whose top-1 prediction has IoU ≥ m; mIoU the mean IoU in percent. Every query counts in
the denominator: a missing or unparseable prediction is IoU 0 (dropping such queries inflates R@1). An IoU within
:data:`TIE_TOLERANCE` below m counts as ≥ m: ``temporal_iou((11.6, 14.6), (11.6, 17.6))`` is 0.49999999999999983 in
float64, an exact tie at 0.5 in real numbers.

Scorings (:data:`SCORINGS`), i.e. how one query's IoU is computed:

* ``standard`` — the published evaluators' rule (www-Ye/TimeZero, OpenGVLab/VideoChat-R1 and TencentARC/TimeLens
  ``evaluation/compute_metrics.py``: IoU ≥ m): the ground truth as annotated (``raw_start``/``raw_end``, which may end
  past the video) against the prediction as parsed (not clamped); reversed or missing → 0; n = all queries.
  (xiaomi-research/time-r1 uses IoU > m; ties are counted here, as ≥.)
* ``clamped`` — ours, the ``iou`` reward's rule (``rewards.query_iou``): ground truth and prediction both clamped
  into [0, duration]. Training rewards use it.

Interval sets: a record with ``spans`` (native multi-span data, or a set template; see
:func:`grounding_rl.reward.records.is_set_scored`) is scored under both by the set IoU of its predicted set
(``pred_spans``, else the answer parsed by ``parse_spans``) against ``spans`` — not clamped under ``standard``
(a reversed pair → 0), clamped under ``clamped`` — and the metrics gain mean temporal ``precision`` and ``recall``
(|P ∩ G| / |P| and |P ∩ G| / |G|, clamped, in percent, over all queries). Single-span records score as before.

Extra scorings on request (:data:`EXTRA_SCORINGS`, :mod:`grounding_rl.reward.set_metrics`): ``set`` (set IoU against
TimeLens-Bench's ``spans_all``, every span an entry lists) and ``qvhighlights`` (moment_detr's R1 and mAP).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from grounding_rl.reward import intervals
from grounding_rl.reward.iou import temporal_iou
from grounding_rl.reward.parsing import parse_answer
from grounding_rl.reward.rewards import format_reward, query_iou
from grounding_rl.reward.set_metrics import qvhighlights_metrics, record_spans, set_metrics, set_scores

THRESHOLDS = (0.3, 0.5, 0.7)
TIE_TOLERANCE = 1e-9
SCORINGS = ("standard", "clamped")
HEADLINE_SCORING = "standard"  # what metrics.json's top level, report.md and the anchor comparison use
METRIC_NAMES = ("n", "R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "parse_failure_rate", "format_rate")
SET_METRIC_NAMES = ("precision", "recall", "mAP@0.5", "mAP@0.75", "mAP")
EXTRA_SCORINGS = ("set", "qvhighlights")


def _number(record: Mapping, key: str, where: str) -> float:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: {key!r} must be a finite number of seconds, got {value!r}")
    return float(value)


def record_prediction(record: Mapping, where: str = "record") -> tuple[float, float] | None:
    """The prediction of one record: ``(pred_start, pred_end)`` when both are given (not None), else
    ``parse_answer(answer)``. A non-finite given pair is no prediction (None). ValueError for non-numeric values."""
    ps, pe = record.get("pred_start"), record.get("pred_end")
    if ps is None or pe is None:
        return parse_answer(record.get("answer"))
    for key, value in (("pred_start", ps), ("pred_end", pe)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: {key!r} must be a number of seconds or null, got {value!r}")
    return (float(ps), float(pe)) if math.isfinite(ps) and math.isfinite(pe) else None


def recall_at(ious: Iterable[float], threshold: float, n: int) -> float:
    """Percent of ``n`` queries with IoU ≥ ``threshold`` − :data:`TIE_TOLERANCE` (exact ties count)."""
    return 100.0 * sum(iou >= threshold - TIE_TOLERANCE for iou in ious) / n


def standard_iou(pred: tuple[float, float] | None, gt: tuple[float, float]) -> float:
    """IoU under the ``standard`` scoring: the prediction as parsed against the ground truth as annotated, neither
    clamped. None, non-finite or reversed prediction → 0.0; a reversed annotation (start > end) → 0.0. Zero union as
    :func:`temporal_iou` (identical points → 1.0)."""
    if pred is None or not all(math.isfinite(float(t)) for t in pred) or pred[0] > pred[1] or gt[0] > gt[1]:
        return 0.0
    return temporal_iou(pred, gt)


def compute_metrics(records: Iterable[Mapping], scoring: str = "clamped", prompt_template: str = "default",
                    dropped_annotations: int = 0) -> dict[str, float | int | None]:
    """Metrics over one prediction per query under one scoring (``standard`` or ``clamped``, see the module).

    Each record is a mapping with the ground truth ``start``, ``end``, ``duration`` (seconds; clamped into the video),
    optionally ``raw_start``/``raw_end`` (the annotation as written; default ``start``/``end``) and the prediction as
    ``pred_start``/``pred_end`` (seconds; they win when both are present and not None) and/or ``answer`` (the model's
    text, parsed with ``parse_answer``; also used for the format rate, strict in ``prompt_template``'s answer format).
    Optional ``qid`` names the record in errors.

    ``dropped_annotations`` (``standard`` only): benchmark queries the validation policy dropped (start ≥ end, e.g.
    TVGBench's 11 zero-length answers); the published evaluators count them, and their IoU with any interval of
    positive length is 0, so they join ``n`` with IoU 0 (and ``dropped_annotations`` is reported).

    Returns ``{"n", "R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "parse_failure_rate", "format_rate"}``; all but ``n`` are
    percentages. ``parse_failure_rate``: queries with no usable prediction. ``format_rate``: queries whose ``answer``
    gets ``format`` reward 1 (a query without answer text counts as not formatted); None when no record has answer
    text. Raises ValueError when there are no records or a ground-truth field is missing, non-numeric or reversed.
    """
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    n = failures = formatted = with_text = 0
    ious: list[float] = []
    precision_recall: list[tuple[float, float]] = []
    any_set = False
    for i, record in enumerate(records):
        where = f"record {i}" + (f" (qid {record['qid']!r})" if record.get("qid") is not None else "")
        gt = (_number(record, "start", where), _number(record, "end", where))
        duration = _number(record, "duration", where)
        is_set = record.get("spans") is not None
        any_set |= is_set
        pred = record_spans(record) if is_set else record_prediction(record, where)
        gt_set = [tuple(map(float, s)) for s in record["spans"]] if is_set else [gt]
        pred_set = pred if is_set or pred is None else [pred]
        try:
            if is_set and scoring == "standard":
                usable = pred is not None and all(s <= e for s, e in pred)
                ious.append(intervals.set_iou(pred, gt_set) if usable else 0.0)
            elif is_set:
                ious.append(set_scores(pred, gt_set, duration)[0])
            elif scoring == "standard":
                raw = tuple(_number(record, key, where) if record.get(key) is not None else default
                            for key, default in (("raw_start", gt[0]), ("raw_end", gt[1])))
                ious.append(standard_iou(pred, raw))
            else:
                ious.append(query_iou(pred, gt, duration))
            precision_recall.append(set_scores(pred_set, gt_set, duration)[1:])
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from err
        failures += pred is None
        answer = record.get("answer")
        if isinstance(answer, str):
            with_text += 1
            formatted += format_reward([answer], prompt_template=prompt_template)[0] == 1.0
        n += 1
    if n == 0:
        raise ValueError("compute_metrics: no records")
    extra = dropped_annotations if scoring == "standard" else 0
    n += extra
    ious += [0.0] * extra
    metrics: dict[str, float | int | None] = {"n": n}
    for m in THRESHOLDS:
        metrics[f"R1@{m}"] = recall_at(ious, m, n)
    metrics["mIoU"] = 100.0 * sum(ious) / n
    metrics["parse_failure_rate"] = 100.0 * failures / (n - extra)
    metrics["format_rate"] = 100.0 * formatted / (n - extra) if with_text else None
    if any_set:
        metrics["precision"] = 100.0 * sum(p for p, _ in precision_recall) / n
        metrics["recall"] = 100.0 * sum(r for _, r in precision_recall) / n
    if extra:
        metrics["dropped_annotations"] = extra
    return metrics


def metrics_by_scoring(records: Iterable[Mapping], prompt_template: str = "default",
                       dropped_annotations: int = 0, extra: Iterable[str] = ()) -> dict:
    """Both scorings side by side: the headline (:data:`HEADLINE_SCORING`) metrics at the top level, plus
    ``"scoring": "standard"`` and ``"by_scoring": {"standard": {...}, "clamped": {...}}`` — the shape of
    ``metrics.json`` and of ``grounding-rl score --out``. ``extra``: names of :data:`EXTRA_SCORINGS` to add under
    ``by_scoring`` (``set``: :func:`grounding_rl.reward.set_metrics.set_metrics` against ``spans_all``;
    ``qvhighlights``: :func:`grounding_rl.reward.set_metrics.qvhighlights_metrics`). ValueError for another name."""
    records = list(records)
    both = {name: compute_metrics(records, name, prompt_template, dropped_annotations) for name in SCORINGS}
    for name in extra:
        if name not in EXTRA_SCORINGS:
            raise ValueError(f"unknown scoring {name!r}; known: {SCORINGS + EXTRA_SCORINGS}")
        both[name] = set_metrics(records) if name == "set" else qvhighlights_metrics(records)
    return {**both[HEADLINE_SCORING], "scoring": HEADLINE_SCORING, "by_scoring": both}


def scoring_table(metrics: Mapping) -> str:
    """A markdown table with one row per scoring (``by_scoring`` of :func:`metrics_by_scoring`)."""
    rows = metrics["by_scoring"]
    keys = [k for k in METRIC_NAMES + SET_METRIC_NAMES if any(k in m for m in rows.values())]

    def cell(value) -> str:
        return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)

    lines = ["| scoring | " + " | ".join(keys) + " |", "|---|" + "|".join("---:" for _ in keys) + "|"]
    lines += [f"| {name} | " + " | ".join(cell(m.get(k)) for k in keys) + " |" for name, m in rows.items()]
    return "\n".join(lines)


def format_metrics_table(metrics: Mapping) -> str:
    """A two-row markdown table of the metrics (percentages with 2 decimals, ``n`` and other ints as is, None as -).

    Standard names come first in ``METRIC_NAMES`` order, then any other scalar entries (e.g. ``unknown_qids``).
    """
    keys = [k for k in METRIC_NAMES + SET_METRIC_NAMES if k in metrics]
    keys += [k for k, v in metrics.items() if k not in METRIC_NAMES + SET_METRIC_NAMES and
             (v is None or isinstance(v, (int, float)))]

    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.2f}"
        return str(value)

    return "\n".join([
        "| " + " | ".join(keys) + " |",
        "|" + "|".join("---:" for _ in keys) + "|",
        "| " + " | ".join(cell(metrics[k]) for k in keys) + " |",
    ])
