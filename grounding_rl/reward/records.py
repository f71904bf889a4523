"""One query's scored record and the metrics over such records: what ``eval`` writes to ``predictions.jsonl``, what
``difficulty`` turns into a sample's score and what validation during GRPO training logs.

Pure functions of the sample and the decoded answer (:func:`prediction_record`: the ``iou`` reward's rule,
:func:`grounding_rl.reward.rewards.query_iou`) and of the records (:func:`metrics_from_records`: both scorings of
:mod:`grounding_rl.reward.metrics`).
"""
from __future__ import annotations

from grounding_rl.data.samples import Sample
from grounding_rl.reward.metrics import compute_metrics, metrics_by_scoring
from grounding_rl.prompts.parsing import extract_think, parse_answer, parse_spans
from grounding_rl.reward.rewards import query_iou
from grounding_rl.reward.set_metrics import set_scores


def is_set_scored(sample: Sample, set_answers: bool = False) -> bool:
    """Whether a query is scored as an interval set: its ground truth has several spans (native multi-span data:
    TimeLens2, QVHighlights), or the prompt template asks for a set (``set_answers``). A single-span query under a
    single-span template is scored exactly as before."""
    return set_answers or (sample.spans is not None and len(sample.spans) > 1)


def prediction_record(sample: Sample, answer: str | None, error: str | None = None,
                      sampling: dict | None = None, set_answers: bool = False) -> dict:
    """One line of ``predictions.jsonl`` for ``sample``.

    Args:
        sample: the annotated query (ground truth in seconds).
        answer: the decoded completion, or None when there is none (the clip failed to load).
        error: why there is no answer (recorded as ``error``).
        sampling: the rate and size the clip was sampled at (``{"fps", "frames", "height", "width"}``,
            :meth:`grounding_rl.data.video.SampledVideo.sampling`), recorded as ``sampling`` when given.

    Returns:
        ``{"qid", "video", "query", "duration", "gt_start", "gt_end", "gt_raw_start", "gt_raw_end", "answer",
        "reasoning", "start", "end", "iou"}`` (+ ``error``, ``sampling``): ``gt_start``/``gt_end`` clamped into the
        clip, ``gt_raw_*`` as annotated, ``start``/``end`` the parsed prediction (None when unparseable), ``iou`` by
        :func:`grounding_rl.reward.rewards.query_iou` (prediction clamped to [0, duration]; reversed or none → 0).

        A set-scored query (:func:`is_set_scored`; ``set_answers``: the template asks for a set) also has
        ``gt_spans`` and ``pred_spans`` (:func:`grounding_rl.prompts.parsing.parse_spans`, None when unparseable);
        its ``start``/``end`` are the predicted set's hull and ``iou`` is the set IoU (clamped prediction, merged
        sets). ``gt_spans_all`` is written when the sample has ``spans_all`` (TimeLens-Bench several-span entries),
        ``gt_raw_spans`` when it has ``raw_spans`` (the windows as annotated, before validation merged them).
    """
    if is_set_scored(sample, set_answers):
        pred = parse_spans(answer) if answer is not None else None
        gt = sample.gt_spans()
        truth = {"gt_spans": [list(span) for span in gt]}
        prediction = {"start": min(s for s, _ in pred) if pred else None,
                      "end": max(e for _, e in pred) if pred else None,
                      "pred_spans": [list(span) for span in pred] if pred else None,
                      "iou": set_scores(pred, gt, sample.duration)[0]}
    else:
        parsed = parse_answer(answer) if answer is not None else None
        truth = {}
        prediction = {"start": parsed[0] if parsed else None, "end": parsed[1] if parsed else None,
                      "iou": query_iou(parsed, (sample.start, sample.end), sample.duration)}
    record = {
        "qid": sample.qid, "video": sample.video, "query": sample.query, "duration": sample.duration,
        "gt_start": sample.start, "gt_end": sample.end,
        "gt_raw_start": sample.start if sample.raw_start is None else sample.raw_start,
        "gt_raw_end": sample.end if sample.raw_end is None else sample.raw_end, **truth, "answer": answer,
        "reasoning": extract_think(answer) if answer is not None else None, **prediction,
    }
    if sample.spans_all is not None:
        record["gt_spans_all"] = [list(span) for span in sample.spans_all]
    if sample.raw_spans is not None:
        record["gt_raw_spans"] = [list(span) for span in sample.raw_spans]
    if error is not None:
        record["error"] = error
    if sampling is not None:
        record["sampling"] = sampling
    return record


def _metric_row(r: dict) -> dict:
    """A prediction record as :func:`grounding_rl.reward.metrics.compute_metrics` reads it."""
    row = {"qid": r["qid"], "video": r.get("video"), "query": r.get("query"), "start": r["gt_start"],
           "end": r["gt_end"], "duration": r["duration"],
           "raw_start": r.get("gt_raw_start"), "raw_end": r.get("gt_raw_end"),
           "pred_start": r.get("start"), "pred_end": r.get("end"), "answer": r.get("answer")}
    if r.get("gt_spans") is not None:
        row.update(spans=r["gt_spans"], pred_spans=r.get("pred_spans"))
    if r.get("gt_spans_all") is not None:
        row["spans_all"] = r["gt_spans_all"]
    if r.get("gt_raw_spans") is not None:
        row["raw_spans"] = r["gt_raw_spans"]
    return row


def standard_ious(records: list[dict]) -> list[float]:
    """Each prediction record's IoU (0–1) under the ``standard`` scoring, the one ``metrics.json``'s top level and
    ``report.md``'s headline average, in the records' order: the prediction as parsed against the annotation as
    written (a set-scored record: set IoU). The records' own ``iou`` is the training reward's clamped rule and can be
    higher (a prediction past the clip's end). Each is ``compute_metrics`` over that record alone, so their mean is
    the headline mIoU / 100."""
    return [compute_metrics([_metric_row(r)], "standard")["mIoU"] / 100.0 for r in records]


def metrics_from_records(records: list[dict], prompt_template: str = "default", dropped_annotations: int = 0,
                         scorings=()) -> dict:
    """Both scorings (``metrics_by_scoring``: ``standard`` at the top level, ``by_scoring`` with ``standard`` and
    ``clamped``) over prediction records (one per query), plus ``video_load_failures`` (records with an ``error``).
    A record without ``gt_raw_*`` (written before they existed) scores its clamped ground truth under ``standard``.
    ``dropped_annotations``: lines of the data file that the validation policy dropped (``standard`` counts them).
    ``scorings``: further scorings by name (or ``all``; :func:`grounding_rl.reward.metrics.scoring_names`).
    Set-scored records (``gt_spans``) are scored by set IoU. Raises ValueError when ``records`` is empty."""
    metrics = metrics_by_scoring([_metric_row(r) for r in records], prompt_template, dropped_annotations, scorings)
    metrics["video_load_failures"] = sum(1 for r in records if r.get("error"))
    return metrics
