"""Three scorings of EvolvingLMMs-Lab/lmms-eval @75571cf, one per task file.

``lmms_timelens`` — ``lmms_eval/tasks/timelens/utils.py``: TimeLens's parser, except that its last fallback reads
numbers as ``\\b\\d+\\.?\\d*\\b``; the first pair; IoU by the hull formula with a zero hull guarded (→ 0); R1@m counts
IoU ≥ m. No pair → IoU 0, counted. Predictions keyed ``video>>>query>>>[[start, end]]`` (the ground truth is the
key's first span): duplicates collapse, the last kept. An exception while scoring one (a missing text: ``None.lower()``)
drops it from n.

``lmms_charades_sta`` — ``lmms_eval/tasks/charades_sta/utils.py``: lower-cased text with the prompt's example sentence
removed and every "to" replaced by "-" (also inside words: "towards" → "-wards"); split into sentences at ``!``, ``?``
and newlines (not at full stops); the sentences holding a keyword ("starts", "ends", "happens in", "start time", "end
time", "start", "end", "happen") are searched, or all when none does; patterns in turn — clock ranges, ``a - b`` /
``a – b`` in the first sentence holding one, clocks paired over sentences, the first number of each sentence paired,
``a s - b s``; only the first pair is kept, ordered (a reversed pair swapped). No pair → IoU 0; an exception → IoU 0;
both counted. Keyed ``video>>>caption>>>[start, end]``: duplicates collapse.

``lmms_extremewhenbench`` — ``lmms_eval/tasks/extremewhenbench/utils.py``: the **last** ``a SEP b`` with SEP one of
``-``, ``to``, ``~``, ``–``, ``—`` (spaces optional); reversed swapped; IoU with the hull as union, zero hull → 0;
R1@m counts IoU ≥ m; every query counts (no keying); no pair → IoU 0 and a parse failure (the task reports the
rate). No text → the empty answer. The task reports fractions; here × 100.
"""
from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence

from grounding_rl.reward.scorings.registry import THRESHOLDS, Scoring, annotation, key, register
from grounding_rl.reward.scorings.timelens import timelens_pairs

SOURCE = "EvolvingLMMs-Lab/lmms-eval @75571cf"
_LMMS_NUMBER = re.compile(r"\b\d+\.?\d*\b")


def guarded_iou(a: tuple[float, float], b: tuple[float, float]) -> float:
    """lmms-eval's ``iou``: the hull formula, 0.0 when the hull is not positive."""
    denom = max(a[1], b[1]) - min(a[0], b[0])
    return 0.0 if denom <= 0 else max(min(a[1], b[1]) - max(a[0], b[0]), 0) / denom


def _percent_metrics(ious: list[float], failures: int) -> dict:
    n = len(ious)
    out: dict = {"n": n}
    for m in THRESHOLDS:
        out[f"R1@{m}"] = sum(1 for iou in ious if iou >= m) * 100 / n if n else 0
    out["mIoU"] = sum(ious) * 100 / n if n else 0
    out["parse_failure_rate"] = 100 * failures / n if n else 0
    return out


def score_timelens(records: Sequence[Mapping]) -> dict:
    """lmms-eval's TimeLens task (see the module docstring)."""
    latest: dict[str, tuple[tuple[float, float], str | None]] = {}
    for r in records:
        gt = annotation(r)
        latest[key(r, [list(gt)])] = (gt, r.get("answer"))
    ious, failures = [], 0
    for k, (_, text) in latest.items():
        if not isinstance(text, str):
            continue  # their .lower() raises; the entry is logged and left out of n
        span = json.loads(k.rsplit(">>>", 1)[-1])[0]
        pairs = timelens_pairs(text, _LMMS_NUMBER)
        failures += not pairs
        ious.append(guarded_iou(pairs[0], (float(span[0]), float(span[1]))) if pairs else 0.0)
    return _percent_metrics(ious, failures)


_EXAMPLE = "a specific example is : 20.8 - 30.0 seconds"
_KEYWORDS = ("starts", "ends", "happens in", "start time", "end time", "start", "end", "happen")
_CLOCK_RANGE = re.compile(r"\b(\d{1,2}:\d{2}(?::\d{2})?)\s*[–-]\s*(\d{1,2}:\d{2}(?::\d{2})?)\b")
_RANGE = re.compile(r"(\d+(?:\.\d+)?)\s*[–-]\s*(\d+(?:\.\d+)?)")
_NUMBER = re.compile(r"\b(\d+(?:\.\d+)?)\b")
_CLOCK = re.compile(r"\b(\d{1,2}:\d{2}(?::\d{2})?)\b")
_RANGE_S = re.compile(r"(\d+(?:\.\d+)?)\s*s?\s*[–-]\s*(\d+(?:\.\d+)?)\s*s?")


def _clock(text: str) -> float:
    fields = [float(f) for f in text.split(":")]
    return fields[0] * 3600 + fields[1] * 60 + fields[2] if len(fields) == 3 else fields[0] * 60 + fields[1]


def _in_twos(values: list[float]) -> list[tuple[float, float]]:
    values = values[: len(values) // 2 * 2]
    return [(values[i], values[i + 1]) for i in range(0, len(values), 2)]


def _first_found(sentences: list[str], pattern: re.Pattern, convert) -> list[tuple[float, float]]:
    for sentence in sentences:
        found = pattern.findall(sentence)
        if found:
            return [(convert(a), convert(b)) for a, b in found]
    return []


def charades_sta_pair(text: str) -> tuple[float, float] | None:
    """The one ordered pair lmms-eval's Charades-STA parser reads from ``text``, or None (see the module)."""
    text = text.lower().replace(_EXAMPLE, "").replace("to", "-")
    sentences = re.split(r"[!?\n]", text)
    candidates = [s for s in sentences if any(word in s for word in _KEYWORDS)] or sentences
    pairs = _first_found(candidates, _CLOCK_RANGE, _clock) or _first_found(candidates, _RANGE, float)
    if not pairs:
        pairs = _in_twos([_clock(t) for s in candidates for t in _CLOCK.findall(s)])
    if not pairs:
        pairs = _in_twos([float(found[0]) for s in candidates if (found := _NUMBER.findall(s))])
    if not pairs:
        pairs = _first_found(candidates, _RANGE_S, float)
    if not pairs:
        return None
    start, end = pairs[0]
    return (start, end) if end > start else (end, start)


def score_charades_sta(records: Sequence[Mapping]) -> dict:
    """lmms-eval's Charades-STA task (see the module docstring)."""
    latest: dict[str, str | None] = {}
    for r in records:
        latest[key(r, list(annotation(r)))] = r.get("answer")
    ious, failures = [], 0
    for k, text in latest.items():
        gt = ast.literal_eval(k.rsplit(">>>", 1)[-1])
        pair = charades_sta_pair(text) if isinstance(text, str) else None  # no text: their exception → 0, counted
        failures += pair is None
        ious.append(0.0 if pair is None else guarded_iou((float(gt[0]), float(gt[1])), pair))
    return _percent_metrics(ious, failures)


_EWB = re.compile(r"(\d+(?:\.\d+)?)\s*(?:-|to|~|–|—)\s*(\d+(?:\.\d+)?)")


def extremewhenbench_pair(text: str) -> tuple[float, float] | None:
    """The last ``a SEP b`` of ``text``, ordered; None when there is none."""
    found = _EWB.findall(text)
    if not found:
        return None
    start, end = float(found[-1][0]), float(found[-1][1])
    return (end, start) if start > end else (start, end)


def score_extremewhenbench(records: Sequence[Mapping]) -> dict:
    """lmms-eval's ExtremeWhenBench task (see the module docstring)."""
    ious, parsed = [], []
    for r in records:
        pair = extremewhenbench_pair(r.get("answer") or "")
        gt = annotation(r)
        if pair is None:
            ious.append(0.0)
        else:
            inter = max(0.0, min(pair[1], gt[1]) - max(pair[0], gt[0]))
            union = max(pair[1], gt[1]) - min(pair[0], gt[0])
            ious.append(inter / union if union > 0 else 0.0)
        parsed.append(pair is not None)
    n = len(ious)
    out: dict = {"n": n}
    for m in THRESHOLDS:
        out[f"R1@{m}"] = 100 * (sum(1 for iou in ious if iou >= m) / n)
    out["mIoU"] = 100 * (sum(ious) / n)
    out["parse_failure_rate"] = 100 * (sum(1 for p in parsed if not p) / n)
    return out


register(Scoring("lmms_timelens", f"{SOURCE}, lmms_eval/tasks/timelens/utils.py", score_timelens))
register(Scoring("lmms_charades_sta", f"{SOURCE}, lmms_eval/tasks/charades_sta/utils.py", score_charades_sta))
register(Scoring("lmms_extremewhenbench", f"{SOURCE}, lmms_eval/tasks/extremewhenbench/utils.py",
                 score_extremewhenbench))
