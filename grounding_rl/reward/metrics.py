"""Evaluation metrics for temporal grounding: R1@m, mIoU, parse-failure and format rates.

R1@m is the percent of queries whose top-1 prediction has IoU ≥ m; mIoU the mean IoU in percent. Every query counts in
the denominator: a missing or unparseable prediction is IoU 0 (dropping such queries inflates R@1). Each query's IoU
follows the ``iou`` reward's rule (``rewards.query_iou``: prediction clamped to [0, duration], reversed → 0).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from grounding_rl.reward.parsing import parse_answer
from grounding_rl.reward.rewards import format_reward, query_iou

THRESHOLDS = (0.3, 0.5, 0.7)
METRIC_NAMES = ("n", "R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "parse_failure_rate", "format_rate")


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


def compute_metrics(records: Iterable[Mapping]) -> dict[str, float | int | None]:
    """Metrics over one prediction per query.

    Each record is a mapping with the ground truth ``start``, ``end``, ``duration`` (seconds) and the prediction as
    ``pred_start``/``pred_end`` (seconds; they win when both are present and not None) and/or ``answer`` (the model's
    text, parsed with ``parse_answer``; also used for the format rate). Optional ``qid`` names the record in errors.

    Returns ``{"n", "R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "parse_failure_rate", "format_rate"}``; all but ``n`` are
    percentages. ``parse_failure_rate``: queries with no usable prediction. ``format_rate``: queries whose ``answer``
    gets ``format`` reward 1 (a query without answer text counts as not formatted); None when no record has answer
    text. Raises ValueError when there are no records or a ground-truth field is missing, non-numeric or reversed.
    """
    n = failures = formatted = with_text = 0
    ious: list[float] = []
    for i, record in enumerate(records):
        where = f"record {i}" + (f" (qid {record['qid']!r})" if record.get("qid") is not None else "")
        gt = (_number(record, "start", where), _number(record, "end", where))
        duration = _number(record, "duration", where)
        pred = record_prediction(record, where)
        try:
            ious.append(query_iou(pred, gt, duration))
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from err
        failures += pred is None
        answer = record.get("answer")
        if isinstance(answer, str):
            with_text += 1
            formatted += format_reward([answer])[0] == 1.0
        n += 1
    if n == 0:
        raise ValueError("compute_metrics: no records")
    metrics: dict[str, float | int | None] = {"n": n}
    for m in THRESHOLDS:
        metrics[f"R1@{m}"] = 100.0 * sum(iou >= m for iou in ious) / n
    metrics["mIoU"] = 100.0 * sum(ious) / n
    metrics["parse_failure_rate"] = 100.0 * failures / n
    metrics["format_rate"] = 100.0 * formatted / n if with_text else None
    return metrics


def format_metrics_table(metrics: Mapping) -> str:
    """A two-row markdown table of the metrics (percentages with 2 decimals, ``n`` and other ints as is, None as -).

    Standard names come first in ``METRIC_NAMES`` order, then any other scalar entries (e.g. ``unknown_qids``).
    """
    keys = [k for k in METRIC_NAMES if k in metrics]
    keys += [k for k, v in metrics.items() if k not in METRIC_NAMES and (v is None or isinstance(v, (int, float)))]

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
