"""Metrics of a predictions file against canonical annotations (``grounding-rl score``).

    grounding-rl score --predictions PRED.jsonl --annotations GT.jsonl [--out metrics.json]

Annotations are canonical JSONL (``{"video", "query", "start", "end", "duration", "qid", "source"}``; a line without
``qid`` gets its 0-based line number as a string, like the canonical ``jsonl`` reader). Predictions are JSONL lines with
``qid`` plus ``answer`` text and/or ``start``/``end`` seconds; when both are given ``start``/``end`` win and the text
counts only for the format rate. The join is on ``qid`` (compared as strings). Annotated queries without a prediction
count as failures (IoU 0), counted as ``missing_predictions`` and printed; predictions for unknown qids are listed on stderr and counted as ``unknown_qids``.
Annotations pass through the one validation policy (:func:`grounding_rl.data.samples.validate`), as in ``eval``:
start ≥ end dropped (``clamped`` leaves them out of n; ``standard`` counts them with IoU 0, as the published
evaluators do), times clamped into [0, duration] for ``clamped``, kept as annotated for ``standard``
(:mod:`grounding_rl.reward.metrics`); both scorings are printed and written, and with ``--scoring NAME|all`` the
published evaluators' own scorings beside them (:mod:`grounding_rl.reward.scorings`; they read the ``answer`` text).
"""
from __future__ import annotations

import sys
from pathlib import Path

from grounding_rl.errors import UserError, excerpt
from grounding_rl.jsonl_files import JsonLines
from grounding_rl.reward.metrics import metrics_by_scoring, scoring_names

# A predictions line holds at least one of these (eval's predictions.jsonl: answer, start, end).
PREDICTION_KEYS = ("answer", "start", "end", "pred_spans")


def _index(path: Path) -> dict[str, tuple[int, dict]]:
    """``{qid: (1-based line number, object)}`` of a predictions file; UserError on a missing or duplicate qid, a
    line with none of ``answer``, ``start``/``end``, ``pred_spans`` (another tool's keys: every query would score as
    a parse failure), or one of ``start``/``end`` without the other (the lone one would be ignored)."""
    out: dict[str, tuple[int, dict]] = {}
    for number, obj in JsonLines(path):
        qid = obj.get("qid")
        if qid is None:
            raise UserError(f"{path}:{number}: prediction has no 'qid'")
        qid = str(qid)
        if qid in out:
            raise UserError(f"{path}:{number}: duplicate qid {qid!r} (first on line {out[qid][0]})")
        if not any(key in obj for key in PREDICTION_KEYS):
            raise UserError(f"{path}:{number}: qid {qid!r} has no prediction: none of {', '.join(PREDICTION_KEYS)} "
                            f"(its keys: {', '.join(map(str, obj))})")
        if (obj.get("start") is None) != (obj.get("end") is None):
            raise UserError(f"{path}:{number}: qid {qid!r} has only one of 'start' and 'end'; give both (seconds), "
                            "or neither")
        out[qid] = (number, obj)
    return out


def score(predictions: Path, annotations: Path, prompt_template: str = "default", scorings=()) -> dict:
    """Metrics of ``predictions`` against ``annotations`` under the scorings (``metrics_by_scoring``: ``standard``
    at the top level, ``by_scoring`` with ``standard``, ``clamped`` and the further ``scorings`` named, or ``all``:
    the published evaluators' own, :mod:`grounding_rl.reward.scorings`), plus the counts ``unknown_qids`` and
    ``missing_predictions`` and the annotations scored against (``data``: absolute path, ``data_sha256``); a query
    without a prediction counts as IoU 0, and the count is printed on stderr.
    ``prompt_template`` names the answer format the format rate checks.

    Interval sets: a query whose annotation has several ``spans``, or every query when ``prompt_template`` asks for
    a set, is scored by set IoU (:func:`grounding_rl.reward.records.is_set_scored`); its prediction is the line's
    ``pred_spans`` (``[[s, e], …]``) when given, else its ``answer`` parsed as a set. The ``set``
    scoring reads ``spans_all`` (every span a TimeLens-Bench entry lists), ``qvhighlights`` ranks ``pred_spans``.

    Raises:
        UserError: bad JSON, a missing or duplicate qid, a line without a prediction or with half a ``start``/``end``
            pair, or a bad field (naming file and line); a predictions file without any prediction or without any
            qid of the annotations, or annotations without any usable query; an unknown scoring.
    """
    try:
        scoring_names(scorings)
    except ValueError as err:
        raise UserError(f"--scoring: {err}") from None
    from grounding_rl.data.samples import iter_samples, validate
    from grounding_rl.prompts.templates import is_set_template

    set_answers = is_set_template(prompt_template)

    # the one validation policy, as eval applies it (start ≥ end dropped, end past the video clamped)
    kept, counts = validate(iter_samples(annotations))
    gts = {s.qid: s for s in kept}
    if len(gts) != len(kept):
        raise UserError(f"{annotations}: duplicate qids")
    if not kept:
        raise UserError(f"{annotations}: no usable query (empty, or every interval dropped)")
    preds = _index(predictions)
    if not preds:
        raise UserError(f"{predictions}: no predictions in the file")
    unknown = [qid for qid in preds if qid not in gts]
    if len(unknown) == len(preds):  # every query would score IoU 0: predictions for another data file
        raise UserError(f"{predictions}: none of its {len(preds)} qids is a query of {annotations} (e.g. "
                        f"{unknown[0]!r}, where {annotations} has {next(iter(gts))!r}); score the predictions "
                        "against the annotations they were made for")
    if unknown:
        shown = ", ".join(repr(q) for q in unknown[:10]) + (" …" if len(unknown) > 10 else "")
        print(f"score: {len(unknown)} prediction(s) for qids not in {annotations}: {shown}", file=sys.stderr)
    records = [_record(gt, preds.get(qid, (None, {})), predictions, annotations, set_answers)
               for qid, gt in gts.items()]
    metrics = metrics_by_scoring(records, prompt_template, dropped_annotations=counts["dropped"], scorings=scorings)
    from grounding_rl.run_record import file_sha256

    # the data scored, as eval's metrics.json names it: compare refuses runs on other data (compare.data_of)
    metrics["data"], metrics["data_sha256"] = str(Path(annotations).resolve()), file_sha256(annotations)
    metrics["unknown_qids"] = len(unknown)
    metrics["missing_predictions"] = sum(1 for qid in gts if qid not in preds)
    if metrics["missing_predictions"]:
        print(f"score: {metrics['missing_predictions']} of {len(gts)} queries have no prediction in {predictions} "
              "(each counted as IoU 0)", file=sys.stderr)
    return metrics


def _record(gt, line: tuple[int | None, dict], predictions: Path, annotations: Path, set_answers: bool) -> dict:
    """The scoring record of one annotated query ``gt`` (a validated :class:`~grounding_rl.data.samples.Sample`)
    with its prediction ``line`` (``(line number, object)`` from :func:`_index`; ``(None, {})`` when it has none).

    Raises:
        UserError: an ``answer`` that is not a string, ``start``/``end`` that are not seconds or null, ``pred_spans``
            that are not ``[[start, end], …]`` (naming the predictions file and line).
    """
    from grounding_rl.reward.records import is_set_scored

    number, pred = line
    answer = pred.get("answer")
    if answer is not None and not isinstance(answer, str):
        raise UserError(f"{predictions}:{number}: 'answer' must be a string, got {excerpt(answer)}")
    for key in ("start", "end"):
        value = pred.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise UserError(f"{predictions}:{number}: {key!r} must be seconds or null, got {excerpt(value)}")
    record = {
        "qid": f"{gt.qid} ({annotations})", "video": gt.video, "query": gt.query,
        "start": gt.start, "end": gt.end, "duration": gt.duration, "raw_start": gt.raw_start, "raw_end": gt.raw_end,
        "answer": answer, "pred_start": pred.get("start"), "pred_end": pred.get("end"),
    }
    pred_spans = pred.get("pred_spans")
    if pred_spans is not None and not (isinstance(pred_spans, list) and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                        for v in p) for p in pred_spans)):
        raise UserError(f"{predictions}:{number}: 'pred_spans' must be [[start, end], ...] in seconds, "
                        f"got {excerpt(pred_spans)}")
    if pred_spans is not None:
        record["pred_spans"] = pred_spans  # the set scorings read it; standard/clamped only for set queries
    if is_set_scored(gt, set_answers):
        record["spans"] = [list(s) for s in gt.gt_spans()]
    if gt.spans_all is not None:
        record["spans_all"] = [list(s) for s in gt.spans_all]
    return record
