"""Evaluation metrics for temporal grounding: R1@m, mIoU, parse-failure and format rates, under named scorings.

R1@m is the percent of queries whose top-1 prediction has IoU ≥ m; mIoU the mean IoU in percent. Our two scorings
(``standard``, ``clamped``) count every query in the denominator: a missing or unparseable prediction is IoU 0
(dropping such queries inflates R@1). They compute in exact rational arithmetic (:func:`exact_time`): the prediction
from its text (``parse_answer(text, exact=True)``), the annotation and any number given as seconds from the shortest
decimal of the stored float (``Fraction(repr(x))``), so ``IoU((11.6, 14.6), (11.6, 17.6))`` is exactly 1/2 and
counts at R1@0.5 (float64 gives 0.49999999999999983), while a near tie such as IoU 1/2 − 5e-10 does not. No
tolerance.

Scorings (:data:`SCORINGS`), i.e. how one query's IoU is computed:

* ``standard`` — the rule the published evaluators share (www-Ye/TimeZero ``evaluate.py``, TencentARC/TimeLens
  ``evaluation/compute_metrics.py``: IoU ≥ m), in exact arithmetic: the ground truth as annotated
  (``raw_start``/``raw_end``, which may end past the video or start before 0) against the prediction as parsed
  (not clamped); reversed or missing → 0; n = all queries. Negative-start rule: a negative time is used as written on
  either side, never clamped (an annotation starting at −0.5 s scores (0, 4) as 4 / 4.5); the parser reads no
  negative prediction ("-2 to 5" is no answer), so a negative predicted start comes only from ``pred_start`` given
  as a number.
* ``clamped`` — ours, the ``iou`` reward's rule (``rewards.query_iou``), in exact arithmetic: ground truth and
  prediction both clamped into [0, duration]. Training rewards use it (in floats).

Interval sets: a record with ``spans`` (native multi-span data, or a set template; see
:func:`grounding_rl.reward.records.is_set_scored`) is scored under both by the set IoU of its predicted set
(``pred_spans``, else the answer parsed by ``parse_spans``) against ``spans`` — not clamped under ``standard``
(a reversed pair → 0), clamped under ``clamped`` — and the metrics gain mean temporal ``precision`` and ``recall``
(|P ∩ G| / |P| and |P ∩ G| / |G|, clamped, in percent, over all queries). Set IoU is computed in floats and compared
exactly from its shortest decimal. Single-span records score as before.

One zero-length rule holds in our scorings (``standard``, ``clamped``, ``set`` and its ``precision`` and ``recall``):
a ratio whose denominator has zero length (IoU's union, precision's |P|, recall's |G|) is 1 when prediction and
ground truth are the same points, else 0 — an empty answer at the point of an empty (clamped) ground truth scores 1
everywhere, an empty answer elsewhere 0. Scorings named after a published evaluator keep that evaluator's rule
(``qvhighlights``: an empty window against an empty one is no hit).

The published evaluators' own rules, float comparisons and denominators included, are further scorings by name in
:mod:`grounding_rl.reward.scorings` (``timelens``, ``lmms_charades_sta``, ``time_r1``, …, and for interval sets
``set`` — against every span a TimeLens-Bench entry lists — and ``qvhighlights``, moment_detr's R1 and mAP).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from fractions import Fraction

from grounding_rl.reward import intervals
from grounding_rl.prompts.parsing import parse_answer
from grounding_rl.reward.rewards import format_reward
from grounding_rl.reward.set_metrics import record_spans, set_scores
from grounding_rl.reward.set_rewards import usable_spans

THRESHOLDS = (0.3, 0.5, 0.7)
SCORINGS = ("standard", "clamped")
HEADLINE_SCORING = "standard"  # what metrics.json's top level, report.md and the anchor comparison use
METRIC_NAMES = ("n", "R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "parse_failure_rate", "format_rate")
SET_METRIC_NAMES = ("precision", "recall", "mAP@0.5", "mAP@0.75", "mAP")


def exact_time(value) -> Fraction:
    """A time in seconds as an exact rational: a Fraction as is, an int exactly, a float from its shortest decimal
    (``Fraction(repr(x))``: 11.6 → 58/5, not the binary 11.5999999999999996447…). ValueError for non-finite."""
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return Fraction(value)
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"not a finite time: {value!r}")
    return Fraction(repr(value))


def exact_iou(pred: tuple[Fraction, Fraction], gt: tuple[Fraction, Fraction]) -> Fraction:
    """Temporal IoU of two ordered intervals (start ≤ end) in exact arithmetic, as :func:`~grounding_rl.reward.iou.
    temporal_iou`: intersection over union; zero union → 1 for identical points, else 0."""
    (ps, pe), (gs, ge) = pred, gt
    inter = max(Fraction(0), min(pe, ge) - max(ps, gs))
    union = (pe - ps) + (ge - gs) - inter
    if union <= 0:
        return Fraction(1) if (ps, pe) == (gs, ge) else Fraction(0)
    return inter / union


def _number(record: Mapping, key: str, where: str) -> float:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: {key!r} must be a finite number of seconds, got {value!r}")
    return float(value)


def record_prediction(record: Mapping, where: str = "record") -> tuple[Fraction, Fraction] | None:
    """The prediction of one record as exact rationals (seconds): ``(pred_start, pred_end)`` when both are given (not
    None), each by :func:`exact_time` — except that when ``answer`` text parses to those very floats, the text's own
    decimals are used (``parse_answer(answer, exact=True)``); else ``parse_answer(answer, exact=True)``. A non-finite
    given pair is no prediction (None). ValueError for non-numeric values."""
    ps, pe = record.get("pred_start"), record.get("pred_end")
    answer = record.get("answer")
    if ps is None or pe is None:
        return parse_answer(answer, exact=True)
    for key, value in (("pred_start", ps), ("pred_end", pe)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: {key!r} must be a number of seconds or null, got {value!r}")
    if not (math.isfinite(ps) and math.isfinite(pe)):
        return None
    if isinstance(answer, str) and parse_answer(answer) == (float(ps), float(pe)):
        return parse_answer(answer, exact=True)
    return exact_time(ps), exact_time(pe)


def recall_at(ious: Iterable[Fraction], threshold: float, n: int) -> float:
    """Percent of ``n`` queries with IoU ≥ ``threshold`` (both exact: the threshold from its decimal, 0.3 → 3/10;
    exact ties count, near ties do not)."""
    m = exact_time(threshold)
    return 100.0 * sum(iou >= m for iou in ious) / n


def standard_iou(pred: tuple | None, gt: tuple) -> Fraction:
    """IoU under the ``standard`` scoring, exact: the prediction as parsed against the ground truth as annotated,
    neither clamped (negative starts used as written). None or reversed prediction → 0; a reversed annotation
    (start > end) → 0. Times are converted by :func:`exact_time`; zero union as :func:`exact_iou`."""
    if pred is None:
        return Fraction(0)
    pred, gt = tuple(map(exact_time, pred)), tuple(map(exact_time, gt))
    if pred[0] > pred[1] or gt[0] > gt[1]:
        return Fraction(0)
    return exact_iou(pred, gt)


def clamped_iou(pred: tuple | None, gt: tuple, duration: float) -> Fraction:
    """IoU under the ``clamped`` scoring, exact: ``rewards.query_iou``'s rule (prediction clamped into
    [0, duration]; None or reversed → 0) against the clamped ground truth. ValueError for a reversed ground truth."""
    gt = tuple(map(exact_time, gt))
    if gt[0] > gt[1]:
        raise ValueError(f"gt is reversed (start > end): {tuple(map(float, gt))!r}")
    if pred is None:
        return Fraction(0)
    pred = tuple(map(exact_time, pred))
    if pred[0] > pred[1]:
        return Fraction(0)
    d = exact_time(duration)
    if d <= 0:
        raise ValueError(f"duration must be positive, got {duration!r}")
    ps, pe = (min(max(t, Fraction(0)), d) for t in pred)
    return exact_iou((ps, pe), gt)


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

    Returns ``{"n", "R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "parse_failure_rate", "format_rate", "length_ratio"}``; all
    but ``n`` and ``length_ratio`` are percentages. ``parse_failure_rate``: queries with no usable prediction.
    ``format_rate``: queries whose ``answer`` gets ``format`` reward 1 (a query without answer text counts as not
    formatted); None when no record has answer text. ``length_ratio``: Σ|P| / Σ|G| over the queries with a usable
    prediction (|P| the merged prediction clamped into the video, |G| the merged ground truth, seconds; a ratio, 1.0 =
    as long as the truth in total; None when no prediction is usable) — a policy that hedges with wide intervals shows
    here (> 1) before R1@0.7 drops. Same under both scorings. Raises ValueError when there are no records or a
    ground-truth field is missing, non-numeric or reversed.
    """
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    n = failures = formatted = with_text = 0
    ious: list[Fraction] = []
    precision_recall: list[tuple[float, float]] = []
    pred_seconds = gt_seconds = 0.0
    any_set = False
    for i, record in enumerate(records):
        where = f"record {i}" + (f" (qid {record['qid']!r})" if record.get("qid") is not None else "")
        gt = (_number(record, "start", where), _number(record, "end", where))
        duration = _number(record, "duration", where)
        is_set = record.get("spans") is not None
        any_set |= is_set
        pred = record_spans(record) if is_set else record_prediction(record, where)
        gt_set = [tuple(map(float, s)) for s in record["spans"]] if is_set else [gt]
        pred_set = pred if is_set or pred is None else [tuple(map(float, pred))]
        try:
            if is_set and scoring == "standard":
                usable = pred is not None and all(s <= e for s, e in pred)
                ious.append(exact_time(intervals.set_iou(pred, gt_set)) if usable else Fraction(0))
            elif is_set:
                ious.append(exact_time(set_scores(pred, gt_set, duration)[0]))
            elif scoring == "standard":
                raw = tuple(_number(record, key, where) if record.get(key) is not None else default
                            for key, default in (("raw_start", gt[0]), ("raw_end", gt[1])))
                ious.append(standard_iou(pred, raw))
            else:
                ious.append(clamped_iou(pred, gt, duration))
            precision_recall.append(set_scores(pred_set, gt_set, duration)[1:])
            usable = usable_spans(pred_set, duration)
            if usable is not None:
                pred_seconds += intervals.total_length(intervals.merge_spans(usable))
                gt_seconds += intervals.total_length(intervals.merge_spans(gt_set))
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
    ious += [Fraction(0)] * extra
    metrics: dict[str, float | int | None] = {"n": n}
    for m in THRESHOLDS:
        metrics[f"R1@{m}"] = recall_at(ious, m, n)
    metrics["mIoU"] = float(100 * sum(ious) / n)
    metrics["parse_failure_rate"] = 100.0 * failures / (n - extra)
    metrics["format_rate"] = 100.0 * formatted / (n - extra) if with_text else None
    metrics["length_ratio"] = pred_seconds / gt_seconds if gt_seconds > 0 else None
    if any_set:
        metrics["precision"] = 100.0 * sum(p for p, _ in precision_recall) / n
        metrics["recall"] = 100.0 * sum(r for _, r in precision_recall) / n
    if extra:
        metrics["dropped_annotations"] = extra
    return metrics


OWN_SOURCES = {
    "standard": "grounding_rl.reward.metrics (the rule of TimeZero evaluate.py / TimeLens compute_metrics.py: "
                "IoU >= m, annotation as written, prediction as parsed; exact arithmetic)",
    "clamped": "grounding_rl.reward.metrics (the iou reward's rule: both clamped into [0, duration]; exact arithmetic)",
}


def scoring_names(requested: Iterable[str] = ()) -> list[str]:
    """The scorings to compute: always ``standard`` (the headline) and ``clamped``, then each requested name in
    order; ``all`` adds every registered one (:mod:`grounding_rl.reward.scorings`). ValueError for an unknown name."""
    from grounding_rl.reward.scorings import REGISTRY

    names = list(SCORINGS)
    for name in requested:
        for one in (REGISTRY if name == "all" else [name]):
            if one not in SCORINGS and one not in REGISTRY:
                raise ValueError(f"unknown scoring {one!r}; known: all, {', '.join([*SCORINGS, *REGISTRY])}")
            if one not in names:
                names.append(one)
    return names


def metrics_by_scoring(records: Iterable[Mapping], prompt_template: str = "default",
                       dropped_annotations: int = 0, scorings: Iterable[str] = ()) -> dict:
    """The scorings side by side: the headline (:data:`HEADLINE_SCORING`) metrics at the top level, plus
    ``"scoring": "standard"`` and ``"by_scoring": {"standard": {...}, "clamped": {...}, NAME: {...}}`` (each with its
    own ``n`` and its ``source``) — the shape of ``metrics.json`` and of ``grounding-rl score --out``.

    ``scorings``: further names (or ``all``) of :mod:`grounding_rl.reward.scorings`, see :func:`scoring_names`. The
    published evaluators' scorings read each record's ``answer`` text, ``video``, ``query``, ``qid`` and
    ``raw_start``/``raw_end`` (else ``start``/``end``); they score the records given, so ``dropped_annotations``
    (queries never run) are not in their n."""
    from grounding_rl.reward.scorings import REGISTRY

    records = list(records)
    out: dict[str, dict] = {}
    for name in scoring_names(scorings):
        if name in SCORINGS:
            out[name] = {**compute_metrics(records, name, prompt_template, dropped_annotations),
                         "source": OWN_SOURCES[name]}
        else:
            out[name] = {**REGISTRY[name].score(records), "source": REGISTRY[name].source}
    headline = {k: v for k, v in out[HEADLINE_SCORING].items() if k != "source"}
    return {**headline, "scoring": HEADLINE_SCORING, "by_scoring": out}


def scoring_table(metrics: Mapping) -> str:
    """A markdown table with one row per scoring (``by_scoring`` of :func:`metrics_by_scoring`), each with its own
    ``n``; a value a scoring does not report is ``-``. The headline row is marked."""
    rows = metrics["by_scoring"]
    keys = [k for k in METRIC_NAMES + SET_METRIC_NAMES if any(k in m for m in rows.values())]

    def cell(value) -> str:
        return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)

    lines = ["| scoring | " + " | ".join(keys) + " |", "|---|" + "|".join("---:" for _ in keys) + "|"]
    lines += [f"| {name}{' (headline)' if name == HEADLINE_SCORING else ''} | "
              + " | ".join(cell(m.get(k)) for k in keys) + " |" for name, m in rows.items()]
    return "\n".join(lines)


def scoring_sources(metrics: Mapping) -> str:
    """One markdown bullet per scoring of ``by_scoring``: its name and ``source``."""
    return "\n".join(f"- `{name}`: {m.get('source', '?')}" for name, m in metrics["by_scoring"].items())


def format_metrics_table(metrics: Mapping) -> str:
    """A two-row markdown table of the metrics (percentages with 2 decimals, ``n`` and other ints as is, None as -).

    Standard names come first in ``METRIC_NAMES`` order, then any other scalar entries (e.g. ``unknown_qids``).
    """
    names = METRIC_NAMES + SET_METRIC_NAMES
    keys = [k for k in names if k in metrics]
    keys += [k for k, v in metrics.items() if k not in names and (v is None or isinstance(v, (int, float)))]

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
