"""The canonical sample (one JSONL line per query) and the one validation policy used by training, evaluation and
inference.

A canonical JSONL line is ``{"video", "query", "start", "end", "duration", "qid", "source", "raw_start", "raw_end"}``
plus, for interval sets, ``"spans"``, ``"spans_all"`` and ``"raw_spans"`` (lists of ``[start, end]``; see
:class:`Sample`):
``video`` is a path, times are seconds as floats, ``start``/``end`` clamped into [0, duration] and
``raw_start``/``raw_end`` the annotation as written (optional when reading). :func:`load_samples` is what training
and evaluation call: it reads such a file, resolves relative video paths, fills missing durations by probing the
video, and applies :func:`validate`.
"""
from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Iterator

from grounding_rl.data.probe import VideoProbeError, probe_duration
from grounding_rl.errors import UserError, excerpt
from grounding_rl.jsonl_files import JsonLines, write_jsonl_atomic

logger = logging.getLogger(__name__)

# Extensions recognised as videos (lower case), in order of preference after ".mp4".
VIDEO_EXTENSIONS = (".mp4", ".mkv", ".webm", ".avi", ".mov", ".m4v", ".mpg", ".mpeg", ".flv", ".wmv", ".3gp", ".ts")

FIELDS = ("video", "query", "start", "end", "duration", "qid", "source", "raw_start", "raw_end", "spans", "spans_all",
          "raw_spans")

Spans = tuple[tuple[float, float], ...]


class AnnotationError(UserError, ValueError):
    """An annotation file or line cannot be turned into a sample. The message names the file and line (or video key);
    the ``grounding-rl`` command prints it as one line with exit status 2."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One grounding query on one video.

    Attributes:
        video: path of the video file (absolute after reading; see :class:`VideoResolver`).
        query: the sentence describing the event.
        start: ground-truth start, seconds.
        end: ground-truth end, seconds.
        duration: video duration, seconds.
        qid: query id: the source's own id where it has one, else ``<source>:<video id>#<index>``
            (index = 0-based position of the query among that video's queries in the file); for ``jsonl`` files
            without ``qid``, the 0-based line number.
        source: the reader (format) name, or the ``source`` field of a canonical line.
        raw_start, raw_end: the annotation's times as written, before :func:`validate_sample` clamps them (the
            ``standard`` scoring of :mod:`grounding_rl.reward.metrics` uses them); None before validation.
        spans: the ground truth as an interval set ``((s, e), …)`` in seconds, for data that is natively multi-span
            (TimeLens2, QVHighlights); ``start``/``end`` are then its hull (first start, last end) for single-span
            tools, and ``spans`` wins where both are read. None for single-span data (the set is ``((start, end),)``).
        spans_all: every span a TimeLens-Bench entry lists when it lists several: ``spans`` keeps the first, as
            TimeLens, lmms-eval and TimeLens2's evaluator score it; the ``set`` scoring scores against this. None
            otherwise.
        raw_spans: the reader's ``spans`` as written, when validation changed them (:func:`validate_spans` clamps,
            drops and merges; QVHighlights' touching windows become one): the ``qvhighlights`` scoring scores these,
            as moment_detr keeps each annotated window an instance. None when ``spans`` are as written.
    """

    video: str
    query: str
    start: float
    end: float
    duration: float
    qid: str
    source: str
    raw_start: float | None = None
    raw_end: float | None = None
    spans: Spans | None = None
    spans_all: Spans | None = None
    raw_spans: Spans | None = None

    def to_dict(self) -> dict[str, Any]:
        """The canonical JSON object (keys in :data:`FIELDS` order; ``raw_start``/``raw_end``, ``spans``,
        ``spans_all`` and ``raw_spans`` only when known, the spans as lists of ``[start, end]``)."""
        data = asdict(self)
        for key in ("raw_start", "raw_end", "spans", "spans_all", "raw_spans"):
            if data[key] is None:
                del data[key]
            elif key in ("spans", "spans_all", "raw_spans"):
                data[key] = [list(span) for span in data[key]]
        return data

    def gt_spans(self) -> Spans:
        """The ground truth as an interval set: ``spans`` when present, else ``((start, end),)``."""
        return self.spans if self.spans is not None else ((self.start, self.end),)

    def to_json(self) -> str:
        """One canonical JSONL line (no trailing newline), UTF-8 text kept as is."""
        return json.dumps(self.to_dict(), ensure_ascii=False)


# --------------------------------------------------------------------------------------------------------- validation
def validate_spans(spans: Spans, duration: float, counts: dict[str, int] | None = None) -> Spans:
    """The validation policy per span of an interval set (seconds): a reversed span, a zero-length span inside the
    video and a span wholly outside it are dropped (``spans_dropped``); spans past the video are clamped into
    [0, duration] (``spans_clamped``); overlapping or touching spans are merged (``spans_merged``, one per merge).
    Returns the sorted, disjoint set (possibly empty); ``counts`` (when given) is incremented."""
    counts = counts if counts is not None else {}
    kept = []
    for start, end in spans:
        if start > end or (start == end and 0.0 < start < duration) or end <= 0.0 or start >= duration:
            counts["spans_dropped"] = counts.get("spans_dropped", 0) + 1
            continue
        clamped = (max(start, 0.0), min(end, duration))
        if clamped != (start, end):
            counts["spans_clamped"] = counts.get("spans_clamped", 0) + 1
        kept.append(clamped)
    merged: list[list[float]] = []
    for start, end in sorted(kept):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
            counts["spans_merged"] = counts.get("spans_merged", 0) + 1
        else:
            merged.append([start, end])
    return tuple((float(s), float(e)) for s, e in merged)


def _validate_set(sample: Sample, query: str, training: bool, counts: dict[str, int]) -> tuple[Sample | None, str]:
    """:func:`validate_sample` for a sample with ``spans``: the policy per span, then ``start``/``end`` = the hull."""
    duration = sample.duration
    values = [t for span in sample.spans + (sample.spans_all or ()) for t in span]
    if not all(math.isfinite(x) for x in values + [duration]) or duration <= 0:
        return None, f"dropped: non-finite time or duration ≤ 0 (spans={sample.spans}, duration={duration})"
    spans = validate_spans(sample.spans, duration, counts)
    raw_spans = sample.raw_spans if sample.raw_spans is not None else sample.spans
    raw_spans = None if raw_spans == spans else raw_spans
    spans_all = None if sample.spans_all is None else validate_spans(sample.spans_all, duration, counts) or None
    if not spans:
        if training:
            return None, f"dropped: no valid span of {list(sample.spans)} in the video (duration {duration})"
        # evaluation keeps every query: the hull under the single-span policy (an edge point outside the video)
        hull = replace(sample, start=min(s for s, _ in sample.spans), end=max(e for _, e in sample.spans), spans=None,
                       spans_all=None)
        single, status = validate_sample(hull, training=False)
        if single is None:
            return None, status
        return replace(single, spans=((single.start, single.end),), spans_all=spans_all,
                       raw_spans=sample.raw_spans or sample.spans), status
    raw_start = min(s for s, _ in sample.spans) if sample.raw_start is None else sample.raw_start
    raw_end = max(e for _, e in sample.spans) if sample.raw_end is None else sample.raw_end
    new = replace(sample, query=query, start=spans[0][0], end=spans[-1][1], spans=spans, spans_all=spans_all,
                  raw_start=float(raw_start), raw_end=float(raw_end), raw_spans=raw_spans)
    status = "kept" if (spans, spans_all) == (sample.spans, sample.spans_all) else "clamped"
    return (sample if new == sample else new), status


def validate_sample(sample: Sample, *, training: bool = False,
                    span_counts: dict[str, int] | None = None) -> tuple[Sample | None, str]:
    """Apply the validation policy to one sample.

    Policy, in this order:

    1. the query's surrounding whitespace is stripped; an empty query, or one of invisible characters only (zero-width
       spaces, other format and control characters), → dropped;
    2. a non-finite time, or a duration ≤ 0 → dropped;
    3. start > end, or start = end inside the video → dropped;
    4. an interval outside the video (it ends at or before 0, or starts at or after the duration) can never become
       a valid interval: for training it is dropped; for evaluation it is kept (every query counts: n = all queries)
       as the zero-length interval at the edge it lies beyond, (0, 0) or (duration, duration), never inverted. The
       published counts need this (3 Charades-CD ood queries: LEOL6 7-8 s of a 6.375 s video, AKKWU 13-38 s of
       12.31 s), and temporal IoU handles a zero-length ground truth (1.0 only for the identical point);
    5. start and end are clamped into [0, duration] (start < 0 → 0; end > duration → duration; either counts once
       as "clamped").

    The policy is stable under itself: a sample it returns, validated again, comes back unchanged (so ``prepare`` on
    its own output keeps every line as it is).

    A sample with ``spans`` (an interval set) gets the policy per span (:func:`validate_spans`: reversed and
    zero-length spans dropped, spans past the video clamped, overlapping spans merged, each counted in
    ``span_counts``), then ``start``/``end`` become the hull of what is left; with no span left it is dropped for
    training and, for evaluation, kept as its hull under rules 3-5. ``spans_all`` gets the same per-span policy.

    Args:
        sample: a sample as read from an annotation file.
        training: drop intervals outside the video (rule 4) instead of keeping them.
        span_counts: a dict to receive ``spans_dropped``/``spans_clamped``/``spans_merged`` counts.
    Returns:
        (sample with stripped query and clamped times, "kept" | "clamped") or (None, "dropped: <reason>").
    """
    query = sample.query.strip()
    if not any(char.isprintable() and not char.isspace() for char in query):
        return None, "dropped: empty query" + (f" (only invisible characters: {query!r})" if query else "")
    if sample.spans is not None:
        return _validate_set(sample, query, training, span_counts if span_counts is not None else {})
    start, end, duration = sample.start, sample.end, sample.duration
    if not all(math.isfinite(x) for x in (start, end, duration)) or duration <= 0:
        return None, f"dropped: non-finite time or duration ≤ 0 (start={start}, end={end}, duration={duration})"
    if start > end or (start == end and 0.0 < start < duration):
        return None, f"dropped: start {start} >= end {end}"
    outside = end <= 0.0 or start >= duration
    if outside and training:
        return None, f"dropped: interval {start}-{end} outside the video (duration {duration})"
    if outside:
        new_start = new_end = 0.0 if end <= 0.0 else duration
    else:
        new_start, new_end = min(max(start, 0.0), duration), min(end, duration)
    status = "clamped" if (new_start, new_end) != (start, end) else "kept"
    raw_start = float(start) if sample.raw_start is None else sample.raw_start  # the annotation as written, kept
    raw_end = float(end) if sample.raw_end is None else sample.raw_end
    if status == "kept" and query == sample.query and (raw_start, raw_end) == (sample.raw_start, sample.raw_end):
        return sample, status
    return replace(sample, query=query, start=float(new_start), end=float(new_end), raw_start=raw_start,
                   raw_end=raw_end), status


def validate(samples: Iterable[Sample], *, training: bool = False,
             log_limit: int = 5) -> tuple[list[Sample], dict[str, int]]:
    """The one validation policy for training, evaluation and inference (see :func:`validate_sample`).

    Args:
        samples: samples as read.
        training: drop intervals outside the video (evaluation keeps them as zero-length intervals at the edge).
        log_limit: how many drops and clamps to log (warning level, naming the qid) before going quiet.
    Returns:
        (kept samples in input order, counts ``{"kept", "dropped", "clamped"}``, plus ``spans_dropped``,
        ``spans_clamped``, ``spans_merged`` when an interval set had one); ``kept`` includes the clamped ones.
    """
    kept: list[Sample] = []
    dropped = clamped = 0
    span_counts: dict[str, int] = {}
    for sample in samples:
        new, status = validate_sample(sample, training=training, span_counts=span_counts)
        if new is None:
            dropped += 1
            if dropped <= log_limit:
                logger.warning("%s (qid %s, video %s)", status, sample.qid, sample.video)
            continue
        if status == "clamped":
            clamped += 1
            if clamped <= log_limit:
                logger.info("clamped %s-%s to %s-%s (qid %s, duration %s)", sample.start, sample.end, new.start,
                            new.end, sample.qid, sample.duration)
        kept.append(new)
    if span_counts:
        logger.info("spans: %s", span_counts)
    return kept, {"kept": len(kept), "dropped": dropped, "clamped": clamped, **span_counts}


# ---------------------------------------------------------------------------------------------------------- videos
def has_video_extension(name: str) -> bool:
    """True when ``name`` ends with one of :data:`VIDEO_EXTENSIONS` (case-insensitive)."""
    return os.path.splitext(name)[1].lower() in VIDEO_EXTENSIONS


class VideoResolver:
    """Turns the video names found in annotation files into paths, and probes durations (both cached).

    Rules: an absolute path is kept; a relative one resolves against ``video_root`` when given,
    else against the annotation file's folder. A bare id (no video extension; Charades, ActivityNet) becomes
    ``<id>.mp4`` unless that file is absent and a file ``<id>.<ext>`` with another video extension exists (first in
    :data:`VIDEO_EXTENSIONS` order). Extension to the issue: with ``video_root`` given, a relative path with folders
    (Time-R1's ``./dataset/.../x.mp4``) that does not exist there resolves to ``video_root/x.mp4`` when that exists.

    Args:
        annotation_path: the annotation file (its folder is the default root).
        video_root: folder of the videos, or None.
    """

    def __init__(self, annotation_path: str | os.PathLike, video_root: str | os.PathLike | None = None):
        self.video_root = os.path.abspath(video_root) if video_root is not None else None
        self.root = self.video_root or os.path.dirname(os.path.abspath(annotation_path))
        self._listings: dict[str, tuple[set[str], dict[str, str]]] = {}
        self._paths: dict[tuple[str, bool], str] = {}
        self._durations: dict[str, float | None] = {}

    def _listing(self, folder: str) -> tuple[set[str], dict[str, str]]:
        """File names in ``folder`` (listed once): the exact names, and lower-cased name → name."""
        if folder not in self._listings:
            try:
                names = {entry.name for entry in os.scandir(folder) if not entry.is_dir()}
            except OSError:
                names = set()
            self._listings[folder] = (names, {name.lower(): name for name in names})
        return self._listings[folder]

    def exists(self, path: str) -> bool:
        """Whether ``path`` is an existing file (via cached folder listings)."""
        return os.path.basename(path) in self._listing(os.path.dirname(path))[0]

    def path(self, name: str, *, bare_id: bool = False) -> str:
        """The absolute, normalised path of the video called ``name`` in an annotation file.

        Args:
            name: a path or, when ``bare_id`` is True, possibly a bare id without extension.
            bare_id: apply the bare-id rule when ``name`` has no video extension.
        Returns:
            an absolute path (not checked for existence, except to choose between candidates).
        """
        key = (name, bare_id)
        cached = self._paths.get(key)
        if cached is not None:
            return cached
        path = os.path.normpath(os.path.join(self.root, os.path.expanduser(name)))
        if bare_id and not has_video_extension(name):
            folder, stem = os.path.dirname(path), os.path.basename(path)
            names, lowered = self._listing(folder)
            path = os.path.join(folder, stem + ".mp4")
            if stem + ".mp4" not in names:
                for ext in VIDEO_EXTENSIONS:
                    found = lowered.get((stem + ext).lower())
                    if found is not None:
                        path = os.path.join(folder, found)
                        break
        elif (self.video_root is not None and not os.path.isabs(name) and os.path.dirname(os.path.normpath(name))
              and not self.exists(path) and self.exists(os.path.join(self.video_root, os.path.basename(path)))):
            path = os.path.join(self.video_root, os.path.basename(path))
        self._paths[key] = path
        return path

    def duration(self, path: str) -> float | None:
        """Probed duration (seconds) of the video at ``path``, or None when nothing of that name exists.

        Raises:
            VideoProbeError: something of that name exists but no duration can be read from it: not a file (a folder,
                a broken link), unreadable, or no video (names the file and why).
        """
        if path not in self._durations:  # the listing is the fast path; a file it missed is still opened
            present = self.exists(path) or os.path.lexists(path)
            self._durations[path] = probe_duration(path) if present else None
        return self._durations[path]


# ------------------------------------------------------------------------------------------------------------ JSONL
def as_seconds(value: Any, what: str, where: str) -> float:
    """``value`` as a float number of seconds; numeric strings are accepted.

    Raises:
        AnnotationError: not a number (bools and None included); the message starts with ``where``.
    """
    if isinstance(value, bool) or value is None:
        raise AnnotationError(f"{where}: {what} must be a number of seconds, got {excerpt(value)}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise AnnotationError(f"{where}: {what} must be a number of seconds, got {excerpt(value)}") from None


def as_qid(value: Any, default: str, where: str) -> str:
    """A query id as written: a string as is, an integer as its decimal (``7`` → ``"7"``), ``default`` when absent
    (None).

    Raises:
        AnnotationError: any other JSON value (``1.0``, ``true``, ``[1]``, an object), whose Python text would become
            the qid silently; the message starts with ``where``.
    """
    if value is None:
        return default
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    try:
        shown = json.dumps(value, ensure_ascii=False)  # as the user wrote it: true, not True
    except (TypeError, ValueError):
        shown = repr(value)
    raise AnnotationError(f"{where}: qid must be a string or an integer, got {shown[:60]}")


def as_spans(value: Any, what: str, where: str) -> Spans:
    """``value`` as an interval set ``((s, e), …)`` in seconds: a list of ``[start, end]`` pairs (a single flat
    ``[start, end]`` is one span). Not validated (see :func:`validate_spans`).

    Raises:
        AnnotationError: not a non-empty list of pairs of numbers; the message starts with ``where``.
    """
    if isinstance(value, (list, tuple)) and len(value) == 2 and not any(isinstance(v, (list, tuple)) for v in value):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value or not all(
            isinstance(v, (list, tuple)) and len(v) == 2 for v in value):
        raise AnnotationError(f"{where}: {what} must be a list of [start, end] pairs in seconds, got {excerpt(value)}")
    return tuple((as_seconds(s, what, where), as_seconds(e, what, where)) for s, e in value)


def iter_samples(path: str | os.PathLike, *, video_root: str | os.PathLike | None = None,
                 durations: dict[str, float] | None = None) -> Iterator[Sample]:
    """Read a canonical JSONL file (not validated: see :func:`validate`).

    Each non-blank line is an object with ``video``, ``query``, ``start``, ``end`` and optionally ``spans`` and
    ``spans_all`` (lists of ``[start, end]``; with ``spans``, ``start``/``end`` may be left out and, when given, must
    be the spans' hull), ``duration``,
    ``qid`` (default: the 0-based line number, as a string) and ``source`` (default ``"jsonl"``). ``video`` resolves
    as in :class:`VideoResolver` (no bare-id rule). A missing ``duration`` comes from ``durations`` (keyed by the
    video's file stem) or is probed from the video when the file exists.

    Args:
        path: the JSONL file.
        video_root: folder against which relative ``video`` paths resolve (default: the file's folder).
        durations: optional ``{video id: seconds}``.
    Yields:
        Sample per line.
    Raises:
        AnnotationError: a line lacks a field, has a misspelt one (:func:`_check_misspelt`), a non-numeric time,
            ``start``/``end`` other than its ``spans``' hull, stale ``raw_*`` fields (:func:`_check_raw`,
            :func:`_check_raw_spans`), a qid that is neither a string nor an integer, or no duration and no readable
            video;
            JsonlError: a line is not UTF-8, not JSON or not an object (:class:`grounding_rl.jsonl_files.JsonLines`);
            the message is ``FILE:LINE`` (1-based) plus the reason.
        VideoProbeError: a video exists but cannot be read.
    """
    path = str(path)
    resolver = VideoResolver(path, video_root)
    for number, row in JsonLines(path):
        where = f"{path}:{number}"
        _check_misspelt(row, where)
        needed = ("video", "query") if row.get("spans") is not None else ("video", "query", "start", "end")
        missing = [key for key in needed if key not in row]
        if missing:
            raise AnnotationError(f"{where}: missing field(s) {', '.join(missing)}")
        if not isinstance(row["video"], str) or not isinstance(row["query"], str):
            raise AnnotationError(f"{where}: video and query must be strings")
        video = resolver.path(row["video"])
        if row.get("duration") is not None:
            duration = as_seconds(row["duration"], "duration", where)
        elif durations and Path(row["video"]).stem in durations:
            duration = durations[Path(row["video"]).stem]
        else:
            duration = resolver.duration(video)
            if duration is None:
                raise AnnotationError(f"{where}: no duration, and the video {video} to probe it from is missing")
        spans = None if row.get("spans") is None else as_spans(row["spans"], "spans", where)
        spans_all = None if row.get("spans_all") is None else as_spans(row["spans_all"], "spans_all", where)
        raw_spans = None if row.get("raw_spans") is None else as_spans(row["raw_spans"], "raw_spans", where)
        start = spans[0][0] if spans is not None and "start" not in row else as_seconds(row["start"], "start", where)
        end = spans[-1][1] if spans is not None and "end" not in row else as_seconds(row["end"], "end", where)
        if spans is not None and ("start" in row or "end" in row):
            hull = (min(s for s, _ in spans), max(e for _, e in spans))
            if abs(start - hull[0]) > 1e-6 or abs(end - hull[1]) > 1e-6:
                raise AnnotationError(f"{where}: spans {excerpt([list(span) for span in spans])} and start/end "
                                      f"{start:g}-{end:g} disagree (spans win, start/end must be their hull "
                                      f"{hull[0]:g}-{hull[1]:g}); drop start and end, or add their span to spans")
        raw_start = None if row.get("raw_start") is None else as_seconds(row["raw_start"], "raw_start", where)
        raw_end = None if row.get("raw_end") is None else as_seconds(row["raw_end"], "raw_end", where)
        if spans is None and (raw_start is not None or raw_end is not None):
            _check_raw(where, start, end, raw_start, raw_end, duration)
        if raw_spans is not None:
            _check_raw_spans(where, spans, raw_spans, duration)
        yield Sample(video=video, query=row["query"], start=start, end=end, duration=duration,
                     qid=as_qid(row.get("qid"), str(number - 1), where),
                     source=str(row.get("source") or "jsonl"), raw_start=raw_start, raw_end=raw_end,
                     spans=spans, spans_all=spans_all, raw_spans=raw_spans)


def _check_raw(where: str, start: float, end: float, raw_start: float | None, raw_end: float | None,
               duration: float) -> None:
    """Refuse a canonical line whose ``start``/``end`` (seconds) are not what :func:`validate_sample` makes of its
    ``raw_start``/``raw_end`` (the annotation as written, which the headline ``standard`` scoring reads): e.g. times
    edited after ``prepare`` with the old ``raw_*`` left beside them, which would score against the old ones.

    Raises:
        AnnotationError: one of ``raw_start``/``raw_end`` without the other, or the disagreement (``where`` first).
    """
    if raw_start is None or raw_end is None:
        raise AnnotationError(f"{where}: raw_start and raw_end go together (the annotation as written); give both, "
                              "or drop both")
    probe = Sample(video="", query="raw", start=raw_start, end=raw_end, duration=duration, qid="", source="")
    fixed, _ = validate_sample(probe)
    want = (raw_start, raw_end) if fixed is None else (fixed.start, fixed.end)
    if abs(start - want[0]) > 1e-6 or abs(end - want[1]) > 1e-6:
        raise AnnotationError(f"{where}: start/end {start:g}-{end:g} disagree with raw_start/raw_end "
                              f"{raw_start:g}-{raw_end:g} (clamped into the {duration:g} s video: {want[0]:g}-"
                              f"{want[1]:g}), which the standard scoring uses; after editing start/end drop raw_start "
                              "and raw_end, or set them too")


def _check_raw_spans(where: str, spans: Spans | None, raw_spans: Spans, duration: float) -> None:
    """Refuse a canonical line whose ``raw_spans`` (the interval set as written, which the ``qvhighlights`` scoring
    reads) are not what :func:`validate_spans` makes ``spans`` from: e.g. ``spans`` edited after ``prepare`` with the
    old ``raw_spans`` left beside them. A ``raw_spans`` none of whose spans lies in the video is not checked (an
    evaluation query's ``spans`` are then its hull, :func:`validate_sample`).

    Raises:
        AnnotationError: ``raw_spans`` without ``spans``, or the disagreement (``where`` first).
    """
    if spans is None:
        raise AnnotationError(f"{where}: raw_spans without spans; give spans (the validated set) or drop raw_spans")
    want = validate_spans(raw_spans, duration)
    if want and (len(want) != len(spans) or any(abs(a - b) > 1e-6 for w, g in zip(want, spans) for a, b in zip(w, g))):
        shown = [excerpt([list(x) for x in value]) for value in (spans, raw_spans, want)]
        raise AnnotationError(f"{where}: spans {shown[0]} disagree with raw_spans {shown[1]} (validated: {shown[2]}), "
                              "which the qvhighlights scoring uses; after editing spans drop raw_spans, or set it too")


def _check_misspelt(row: dict, where: str) -> None:
    """Refuse a key that is not one of :data:`FIELDS` but nearly is (``Spans``, ``durations``, ``starts``; difflib
    ratio ≥ 0.8, or the same letters in another case) while the field itself is absent: it would be ignored, e.g. a
    multi-span query read as one span. Other extra keys (a user's metadata) pass.

    Raises:
        AnnotationError: ``where`` (``FILE:LINE``), the key and the field it resembles.
    """
    import difflib

    for key in row:
        if key in FIELDS or not isinstance(key, str):
            continue
        near = [field for field in FIELDS if field == key.lower()] or \
            difflib.get_close_matches(key.lower(), FIELDS, n=1, cutoff=0.8)
        if near and near[0] not in row:
            raise AnnotationError(f"{where}: unknown key {key!r} (did you mean {near[0]!r}? it would be ignored); "
                                  f"canonical keys: {', '.join(FIELDS)}")


def write_samples(path: str | os.PathLike, samples: Iterable[Sample]) -> int:
    """Write samples as canonical JSONL, atomically (:func:`grounding_rl.jsonl_files.write_jsonl_atomic`; the folder is
    created). Returns the number of lines written."""
    return write_jsonl_atomic(path, (sample.to_json() for sample in samples))


def load_samples(path: str | os.PathLike, *, video_root: str | os.PathLike | None = None,
                 counts: dict[str, int] | None = None, training: bool = False) -> list[Sample]:
    """Read a canonical JSONL file and apply the validation policy: what training and evaluation call.

    Relative ``video`` paths resolve against ``video_root`` or the file's folder; missing durations are probed from
    the videos (see :func:`iter_samples`); :func:`validate` drops and clamps, and the counts are logged (info level).

    Args:
        path: canonical JSONL file (e.g. written by ``grounding-rl prepare``).
        video_root: optional folder for relative video paths.
        counts: a dict to receive the validation counts ``{"kept", "dropped", "clamped"}`` (the ``standard``
            scoring counts dropped annotations as queries with IoU 0).
        training: the training policy (intervals outside the video dropped; see :func:`validate_sample`).
    Returns:
        the kept samples, in file order.
    Raises:
        AnnotationError, VideoProbeError: see :func:`iter_samples`.
    """
    samples, found = validate(iter_samples(path, video_root=video_root), training=training)
    logger.info("%s: %s", path, found)
    if counts is not None:
        counts.update(found)
    return samples


__all__ = ["AnnotationError", "FIELDS", "Sample", "Spans", "VIDEO_EXTENSIONS", "VideoProbeError", "VideoResolver",
           "as_qid", "as_seconds", "as_spans", "validate_spans", "has_video_extension", "iter_samples", "load_samples", "validate",
           "validate_sample", "write_samples"]
