"""Annotation readers → canonical samples, selected by name from :data:`READERS`.

Every reader has the signature ``reader(path, *, video_root=None, durations=None) -> Iterator[Sample]`` and yields
samples *before* validation (apply :func:`grounding_rl.data.samples.validate`). Times are converted to seconds; video
names become paths by the rules of :class:`~grounding_rl.data.samples.VideoResolver`. A duration missing from the
annotation comes from ``durations`` (``{video id: seconds}``, see :func:`load_durations`), else is probed from the video
when the file exists, else the reader raises :class:`~grounding_rl.data.samples.AnnotationError` naming the file and
line (or video key).

Formats:

``charades_sta``
    Charades-STA text, one ``VIDEOID start end##sentence`` per line. Charades-STA has no durations: pass a Charades json
    (``charades_sta/charades.json``) or csv (``Charades_v1_*.csv``, ``length`` column) as ``durations``, or videos.
``activitynet``
    ``{video id: {duration, timestamps: [[s, e], ...], sentences: [...]}}`` (ActivityNet Captions; TimeZero's
    charades/activitynet files). ``video_duration`` is accepted for ``duration`` (Charades-CD / Charades-CG files).
``tacos``
    ActivityNet-like with timestamps in frames plus ``fps`` and ``num_frames``: seconds = frames / fps, duration =
    num_frames / fps.
``time_r1``
    Time-R1's list of ``{video, duration, timestamp: [s, e], sentence, qid, ...}``.
``tvgbench``
    Time-R1's TVGBench list of ``{path, question, answer: "s-e", duration, ...}`` (its ``start``/``end`` fields are
    not the answer and are ignored).
``timelens``
    TimeLens-Bench (Charades-TimeLens, ActivityNet-TimeLens, QVHighlights-TimeLens):
    ``{video id: {duration, spans: [[s, e], ...], queries: [...]}}`` in seconds, span i paired with query i (see
    :func:`read_timelens`).
``ego4d_nlq``
    Ego4D-NLQ ``nlq_{train,val}.json``: one sample per language query on its 8-minute clip (``<clip_uid>.mp4``, clip
    time); queries without text dropped and counted (see :func:`read_ego4d_nlq`). ``ego4d_nlq_video``: the same
    queries in the full video's time (``<video_uid>.mp4``).
``extremewhenbench``
    ExtremeWhenBench rows ``{qid, video_id, source_corpus, question, correct_interval, video_duration_s}`` (JSONL, a
    JSON list or ``{"questions": [...]}``; see :func:`read_extremewhenbench`).
``timelens2``
    TimeLens2's rows, grouped ``{video_path, duration, events: [{query, span: [[s, e], ...]}]}`` or flat
    ``{video_path, duration, query, span}``: interval sets (``spans``; see :func:`read_timelens2`).
``qvhighlights``
    QVHighlights ``{qid, query, duration, vid, relevant_windows: [[s, e], ...]}`` JSONL: interval sets.
``jsonl``
    The canonical JSONL (:func:`grounding_rl.data.samples.iter_samples`).

``qid`` is the source's id where it has one (Time-R1, ExtremeWhenBench; Ego4D-NLQ's ``annotation_uid:query index``),
else ``<format>:<video id>#<index>`` with index the 0-based position of the query among that video's queries in the
file; ``source`` is the format name.
"""
from __future__ import annotations

import csv
import errno
import json
import logging
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from grounding_rl.data.samples import (AnnotationError, Sample, VideoResolver, as_qid, as_seconds, as_spans,
                                      iter_samples)
from grounding_rl.errors import excerpt, reading
from grounding_rl.jsonl_files import JsonLines, lone_surrogate

logger = logging.getLogger(__name__)


class Reader(Protocol):
    def __call__(self, path: str | os.PathLike, *, video_root: str | os.PathLike | None = None,
                 durations: dict[str, float] | None = None) -> Iterator[Sample]: ...


# ----------------------------------------------------------------------------------------------------------- helpers
def load_durations(path: str | os.PathLike) -> dict[str, float]:
    """Video durations in seconds, keyed by video id, from a Charades-style json or csv.

    * ``.json``: ``{id: {"duration": s, ...}}`` (``charades_sta/charades.json``; ``video_duration`` also accepted) or
      ``{id: s}``.
    * ``.csv``: a header with ``id`` and ``length`` columns (Charades ``Charades_v1_{train,test}.csv``).

    Raises:
        AnnotationError: unknown extension, missing columns, or a non-numeric duration (names the file and line/key).
    """
    path = str(path)
    suffix = Path(path).suffix.lower()
    out: dict[str, float] = {}
    if suffix == ".json":
        data = _load_json(path, dict)
        for vid, value in data.items():
            if isinstance(value, dict):
                value = value.get("duration", value.get("video_duration"))
            if value is not None:
                out[str(vid)] = as_seconds(value, "duration", f"{path}: video {vid}")
        return out
    if suffix == ".csv":
        with reading(path), open(path, newline="", encoding="utf-8-sig") as handle:
            rows = csv.DictReader(handle)
            fields = rows.fieldnames or []
            if "id" not in fields or "length" not in fields:
                raise AnnotationError(f"{path}: a durations csv needs 'id' and 'length' columns, found {fields}")
            for row in rows:
                if row["length"] not in (None, ""):
                    out[row["id"]] = as_seconds(row["length"], "length", f"{path}:{rows.line_num}")
        return out
    raise AnnotationError(f"{path}: durations must be a .json or .csv file")


def _load_json(path: str, kind: type) -> Any:
    try:
        with reading(path), open(path, encoding="utf-8-sig") as handle:
            text = handle.read()
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise AnnotationError(f"{path}: not valid JSON (line {err.lineno}: {err.msg})") from None
    if "\\u" in text and lone_surrogate(data):
        raise AnnotationError(f"{path}: holds {lone_surrogate(data)}, not valid Unicode text (half of a character)")
    if not isinstance(data, kind):
        raise AnnotationError(f"{path}: expected a JSON {kind.__name__} at the top level, got {type(data).__name__}")
    return data


def _duration(resolver: VideoResolver, given: Any, vid: str, video: str, durations: dict[str, float] | None,
              where: str) -> float:
    """The annotation's duration, else ``durations[vid]``, else the probed video; else an error naming ``where``."""
    if given is not None:
        return as_seconds(given, "duration", where)
    if durations and vid in durations:
        return durations[vid]
    probed = resolver.duration(video)
    if probed is None:
        raise AnnotationError(f"{where}: no duration for video {vid!r}: give --durations (a Charades json, or a csv "
                              f"with a 'length' column) or --video-root with the video ({video} is missing)")
    return probed


def _pair(value: Any, where: str) -> tuple[Any, Any]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise AnnotationError(f"{where}: a timestamp must be [start, end], got {excerpt(value)}")
    return value[0], value[1]


def _text(value: Any, what: str, where: str) -> str:
    if not isinstance(value, str):
        raise AnnotationError(f"{where}: {what} must be a string, got {excerpt(value)}")
    return value


def timelens_query(query: str) -> str:
    """A query cleaned as TimeLens's loader does before it builds the prompt: runs of whitespace become one space,
    then surrounding whitespace and full stops are stripped (``parse_query`` in TencentARC/TimeLens,
    timelens/dataset/timelens_data.py). ``"  A man  runs.. "`` → ``"A man runs"``."""
    return re.sub(r"\s+", " ", query).strip().strip(".").strip()


def _all_spans(value: Any, where: str) -> tuple[tuple[float, float], ...] | None:
    """Every span of a TimeLens-Bench ``spans`` entry that lists several (``[[s, e], ...]`` with more than one), else
    None (the released ``[s, e]`` form, or a list of one)."""
    if isinstance(value, (list, tuple)) and len(value) > 1 and all(isinstance(v, (list, tuple)) for v in value):
        return as_spans(value, "spans", where)
    return None


def _span(value: Any, where: str) -> tuple[tuple[Any, Any], bool]:
    """One TimeLens-Bench ``spans`` entry → (the span it is scored against, whether it listed several spans).

    ``[s, e]`` is the released form. A list of spans ``[[s, e], ...]`` is accepted and scored against its first span,
    the one TimeLens's evaluator keeps (evaluation/eval_dataloader.py: ``if type(span[0]) is list: span = span[0]``).
    """
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (list, tuple)) for v in value):
        return _pair(value[0], where), len(value) > 1
    return _pair(value, where), False


def _iter_grouped(path: str, format_name: str, resolver: VideoResolver, durations: dict[str, float] | None,
                  frames: bool = False, *, stamps_key: str = "timestamps", texts_key: str = "sentences",
                  several_spans: bool = False, clean: Callable[[str], str] | None = None) -> Iterator[Sample]:
    """ActivityNet-style ``{vid: {timestamps, sentences, ...}}``; with ``frames``, TACoS units (frames, fps).

    ``stamps_key``/``texts_key`` name the two parallel lists (TimeLens-Bench: ``spans``/``queries``); with
    ``several_spans`` an entry of the first may list several spans (:func:`_span`; how many did is logged once at the
    end); ``clean`` rewrites each query (None = as written).
    """
    data = _load_json(path, dict)
    multi = total = 0
    for vid, entry in data.items():
        where = f"{path}: video {vid}"
        if not isinstance(entry, dict):
            raise AnnotationError(f"{where}: expected an object, got {type(entry).__name__}")
        timestamps, sentences = entry.get(stamps_key), entry.get(texts_key)
        if not isinstance(timestamps, list) or not isinstance(sentences, list) or len(timestamps) != len(sentences):
            raise AnnotationError(f"{where}: needs lists {stamps_key!r} and {texts_key!r} of equal length")
        video = resolver.path(vid, bare_id=True)
        if frames:
            fps = as_seconds(entry.get("fps"), "fps", where)
            if not fps > 0:
                raise AnnotationError(f"{where}: fps must be positive, got {fps}")
            num_frames = entry.get("num_frames")
            given = entry.get("duration")
            if num_frames is not None:
                given = as_seconds(num_frames, "num_frames", where) / fps
            scale = 1.0 / fps
        else:
            given, scale = entry.get("duration", entry.get("video_duration")), 1.0
        duration = _duration(resolver, given, vid, video, durations, where)
        for index, (stamp, sentence) in enumerate(zip(timestamps, sentences)):
            at = f"{where}, query {index}"
            spans_all = None
            if several_spans:
                (start, end), several = _span(stamp, at)
                multi += several
                spans_all = _all_spans(stamp, at) if several else None
            else:
                start, end = _pair(stamp, at)
            query = _text(sentence, "sentence", at)
            total += 1
            start, end = as_seconds(start, "start", at) * scale, as_seconds(end, "end", at) * scale
            yield Sample(video=video, query=clean(query) if clean else query, start=start, end=end,
                         duration=duration, qid=f"{format_name}:{vid}#{index}", source=format_name,
                         spans=None if spans_all is None else ((start, end),), spans_all=spans_all)
    if multi:
        logger.warning("%s: %d of %d queries list several spans; each is scored against its first span (as "
                       "TimeLens's evaluator does; all of them are kept in spans_all for --scoring set)", path,
                       multi, total)


def count_several_spans(path: str | os.PathLike) -> dict[str, int]:
    """``{"videos", "queries", "several_spans"}`` of a TimeLens-Bench file: how many of its queries list more than
    one span (those :func:`read_timelens` scores against the first). Raises AnnotationError as the reader does."""
    path = str(path)
    data = _load_json(path, dict)
    queries = several = 0
    for vid, entry in data.items():
        spans = entry.get("spans") if isinstance(entry, dict) else None
        if not isinstance(spans, list):
            raise AnnotationError(f"{path}: video {vid}: needs a list 'spans'")
        for index, value in enumerate(spans):
            several += _span(value, f"{path}: video {vid}, query {index}")[1]
        queries += len(spans)
    return {"videos": len(data), "queries": queries, "several_spans": several}


# ----------------------------------------------------------------------------------------------------------- readers
def read_charades_sta(path: str | os.PathLike, *, video_root: str | os.PathLike | None = None,
                      durations: dict[str, float] | None = None) -> Iterator[Sample]:
    """Charades-STA text: ``VIDEOID start end##sentence`` per line (Gao et al., TALL, ICCV 2017). Streams the file.

    Raises:
        AnnotationError: a malformed line, or a video without a duration (``FILE:LINE``, 1-based).
    """
    path = str(path)
    resolver = VideoResolver(path, video_root)
    seen: dict[str, int] = defaultdict(int)
    with reading(path), open(path, encoding="utf-8-sig") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            head, sep, sentence = line.rstrip("\r\n").partition("##")
            parts = head.split()
            if not sep or len(parts) != 3:
                raise AnnotationError(f"{where}: expected 'VIDEOID start end##sentence', got {excerpt(line)}")
            vid = parts[0]
            video = resolver.path(vid, bare_id=True)
            duration = _duration(resolver, None, vid, video, durations, where)
            index = seen[vid]
            seen[vid] += 1
            yield Sample(video=video, query=sentence, start=as_seconds(parts[1], "start", where),
                         end=as_seconds(parts[2], "end", where), duration=duration,
                         qid=f"charades_sta:{vid}#{index}", source="charades_sta")


def read_activitynet(path: str | os.PathLike, *, video_root: str | os.PathLike | None = None,
                     durations: dict[str, float] | None = None) -> Iterator[Sample]:
    """ActivityNet Captions json ``{vid: {duration, timestamps, sentences}}`` (Krishna et al., ICCV 2017); also
    TimeZero's files and Charades-CD/CG (``video_duration``).

    Raises:
        AnnotationError: malformed entry or no duration (names the file and video id).
    """
    path = str(path)
    return _iter_grouped(path, "activitynet", VideoResolver(path, video_root), durations, frames=False)


def read_tacos(path: str | os.PathLike, *, video_root: str | os.PathLike | None = None,
               durations: dict[str, float] | None = None) -> Iterator[Sample]:
    """TACoS json (2D-TAN's release): timestamps in frames, ``fps`` and ``num_frames`` per video → seconds.

    Raises:
        AnnotationError: malformed entry, fps missing or ≤ 0, or no duration (names the file and video id).
    """
    path = str(path)
    return _iter_grouped(path, "tacos", VideoResolver(path, video_root), durations, frames=True)


def read_time_r1(path: str | os.PathLike, *, video_root: str | os.PathLike | None = None,
                 durations: dict[str, float] | None = None) -> Iterator[Sample]:
    """Time-R1 training list ``[{video, duration, timestamp: [s, e], sentence, qid, ...}]`` (Wang et al., 2025).

    Raises:
        AnnotationError: malformed item or no duration (names the file and item index).
    """
    path = str(path)
    resolver = VideoResolver(path, video_root)
    seen: dict[str, int] = defaultdict(int)
    for position, item in enumerate(_load_json(path, list)):
        where = f"{path}: item {position}"
        if not isinstance(item, dict):
            raise AnnotationError(f"{where}: expected an object")
        name = _text(item.get("video"), "video", where)
        vid = Path(name).stem
        video = resolver.path(name, bare_id=True)
        start, end = _pair(item.get("timestamp"), where)
        index = seen[vid]
        seen[vid] += 1
        qid = item.get("qid")
        yield Sample(video=video, query=_text(item.get("sentence"), "sentence", where),
                     start=as_seconds(start, "start", where), end=as_seconds(end, "end", where),
                     duration=_duration(resolver, item.get("duration"), vid, video, durations, where),
                     qid=as_qid(qid, f"time_r1:{vid}#{index}", where), source="time_r1")


_ANSWER = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*-\s*([0-9]+(?:\.[0-9]*)?)\s*")


def read_tvgbench(path: str | os.PathLike, *, video_root: str | os.PathLike | None = None,
                  durations: dict[str, float] | None = None) -> Iterator[Sample]:
    """Time-R1's TVGBench list ``[{path, question, answer: "s-e", duration, ...}]`` (800 items; 11 have s = e).

    Raises:
        AnnotationError: malformed item, an answer not of the form ``s-e``, or no duration (names file and item).
    """
    path = str(path)
    resolver = VideoResolver(path, video_root)
    seen: dict[str, int] = defaultdict(int)
    for position, item in enumerate(_load_json(path, list)):
        where = f"{path}: item {position}"
        if not isinstance(item, dict):
            raise AnnotationError(f"{where}: expected an object")
        name = _text(item.get("path"), "path", where)
        vid = Path(name).stem
        video = resolver.path(name, bare_id=True)
        answer = _text(item.get("answer"), "answer", where)
        match = _ANSWER.fullmatch(answer)
        if match is None:
            raise AnnotationError(f"{where}: answer must be 'start-end' in seconds, got {excerpt(answer)}")
        index = seen[vid]
        seen[vid] += 1
        yield Sample(video=video, query=_text(item.get("question"), "question", where),
                     start=float(match.group(1)), end=float(match.group(2)),
                     duration=_duration(resolver, item.get("duration"), vid, video, durations, where),
                     qid=f"tvgbench:{vid}#{index}", source="tvgbench")


def read_timelens(path: str | os.PathLike, *, video_root: str | os.PathLike | None = None,
                  durations: dict[str, float] | None = None) -> Iterator[Sample]:
    """TimeLens-Bench json ``{video id: {duration, spans: [[s, e], ...], queries: [...]}}``, seconds (Zhang et al.,
    "TimeLens: Rethinking Video Temporal Grounding with Multimodal LLMs", arXiv:2512.14698; the files
    ``charades-timelens.json``, ``activitynet-timelens.json``, ``qvhighlights-timelens.json`` of the hub dataset
    TencentARC/TimeLens-Bench).

    As TimeLens's loader reads it (timelens/dataset/timelens_data.py, ``ActivitynetTimeLensDataset.load_annos``):
    span i belongs to query i (the two lists zipped; here lists of unequal length are an error instead of being cut
    to the shorter), the video is ``<video id>.mp4`` under ``video_root``, and each query is cleaned by
    :func:`timelens_query` (whitespace collapsed, full stops stripped), the text TimeLens puts in its prompt. A
    ``spans`` entry that lists several spans ``[[s, e], ...]`` is scored against its first span, as TimeLens's
    evaluator does (evaluation/eval_dataloader.py), lmms-eval and TimeLens2's evaluator too: the sample's ``spans``
    is that first span and ``spans_all`` the full list (the ``set`` scoring's ground truth); their number is logged
    (:func:`count_several_spans` counts them).

    Raises:
        AnnotationError: malformed entry, ``spans`` and ``queries`` of different lengths, or no duration (names the
            file and video id).
    """
    path = str(path)
    return _iter_grouped(path, "timelens", VideoResolver(path, video_root), durations, stamps_key="spans",
                         texts_key="queries", several_spans=True, clean=timelens_query)


# ------------------------------------------------------------------------------------------- long-video readers
def _ego4d_nlq(path: str, resolver: VideoResolver, durations: dict[str, float] | None,
               video_time: bool) -> Iterator[Sample]:
    """The Ego4D-NLQ queries of ``path``: clip time (``<clip_uid>.mp4``) or, with ``video_time``, the full video's
    (``<video_uid>.mp4``). See :func:`read_ego4d_nlq`."""
    data = _load_json(path, dict)
    videos = data.get("videos")
    if not isinstance(videos, list):
        raise AnnotationError(f"{path}: expected Ego4D-NLQ's {{'videos': [...]}} (nlq_train.json / nlq_val.json)")
    source = "ego4d_nlq_video" if video_time else "ego4d_nlq"
    total = no_text = 0
    for v, video_entry in enumerate(videos):
        if not isinstance(video_entry, dict) or not isinstance(video_entry.get("clips"), list):
            raise AnnotationError(f"{path}: videos[{v}] needs a list 'clips'")
        video_uid = video_entry.get("video_uid")
        for c, clip in enumerate(video_entry["clips"]):
            where = f"{path}: videos[{v}].clips[{c}]"
            if not isinstance(clip, dict):
                raise AnnotationError(f"{where}: expected an object")
            clip_uid = _text(clip.get("clip_uid"), "clip_uid", where)
            where = f"{path}: clip {clip_uid}"
            clip_start = as_seconds(clip.get("video_start_sec"), "video_start_sec", where)
            if video_time:
                vid = _text(video_uid, "video_uid", f"{path}: videos[{v}]")
                video = resolver.path(vid, bare_id=True)
                duration = _duration(resolver, None, vid, video, durations, where)
                offset = clip_start
            else:
                vid, video = clip_uid, resolver.path(clip_uid, bare_id=True)
                clip_end = as_seconds(clip.get("video_end_sec"), "video_end_sec", where)
                duration, offset = clip_end - clip_start, 0.0
            annotations = clip.get("annotations") or []
            if not isinstance(annotations, list):
                raise AnnotationError(f"{where}: 'annotations' must be a list")
            for a, annotation in enumerate(annotations):
                queries = annotation.get("language_queries") if isinstance(annotation, dict) else None
                if not isinstance(queries, list):
                    raise AnnotationError(f"{where}: annotations[{a}] needs a list 'language_queries'")
                uid = annotation.get("annotation_uid")
                for q, item in enumerate(queries):
                    at = f"{where}, annotation {uid if uid is not None else a}, query {q}"
                    if not isinstance(item, dict):
                        raise AnnotationError(f"{at}: expected an object")
                    text = item.get("query")
                    total += 1
                    if text is None or (isinstance(text, str) and not text.strip()):
                        no_text += 1
                        text = ""  # the validation policy drops it ("empty query") and counts it
                    start = as_seconds(item.get("clip_start_sec"), "clip_start_sec", at) + offset
                    end = as_seconds(item.get("clip_end_sec"), "clip_end_sec", at) + offset
                    qid = f"{uid}:{q}" if uid is not None else f"{source}:{clip_uid}#{a}.{q}"
                    yield Sample(video=video, query=_text(text, "query", at), start=start, end=end,
                                 duration=duration, qid=qid, source=source)
    if no_text:
        logger.warning("%s: %d of %d language queries have no text; the validation policy drops them", path, no_text,
                       total)


def read_ego4d_nlq(path: str | os.PathLike, *, video_root: str | os.PathLike | None = None,
                   durations: dict[str, float] | None = None) -> Iterator[Sample]:
    """Ego4D Episodic Memory NLQ (Grauman et al., "Ego4D: Around the World in 3,000 Hours of Egocentric Video", CVPR
    2022; the public ``nlq_train.json`` / ``nlq_val.json``, the test set's windows are hidden behind its server):
    ``{"videos": [{video_uid, clips: [{clip_uid, video_start_sec, video_end_sec, annotations: [{annotation_uid,
    language_queries: [{clip_start_sec, clip_end_sec, query, template, ...}]}]}]}]}``.

    One sample per language query, on its clip as the benchmark scores it: the video is ``<clip_uid>.mp4`` (the
    8-minute clips of Ego4D's ``clips`` download), the window ``clip_start_sec``–``clip_end_sec`` in clip time, the
    duration ``video_end_sec − video_start_sec`` of the clip. A query without text (Ego4D has some) becomes an empty
    query that :func:`grounding_rl.data.samples.validate` drops and counts; how many is logged. The qid is
    ``<annotation_uid>:<query index>``, the pair Ego4D's evaluation and submissions key a query by. ``--format
    ego4d_nlq_video`` (:func:`read_ego4d_nlq_video`) gives the same queries in the full video's time.

    Raises:
        AnnotationError: not Ego4D-NLQ's shape, a missing clip field, or a non-numeric time (names the file, the clip
            and the query).
    """
    path = str(path)
    return _ego4d_nlq(path, VideoResolver(path, video_root), durations, video_time=False)


def read_ego4d_nlq_video(path: str | os.PathLike, *, video_root: str | os.PathLike | None = None,
                         durations: dict[str, float] | None = None) -> Iterator[Sample]:
    """Ego4D-NLQ's queries (:func:`read_ego4d_nlq`) mapped to the full video's time: the video is
    ``<video_uid>.mp4``, the window the clip's ``video_start_sec`` plus the clip-time window, the duration the full
    video's (not in the NLQ file: from ``durations`` keyed by video_uid, else probed from the video). For grounding
    over a whole recording instead of the benchmark's clips.

    Raises:
        AnnotationError: as :func:`read_ego4d_nlq`, and a video without a duration.
    """
    path = str(path)
    return _ego4d_nlq(path, VideoResolver(path, video_root), durations, video_time=True)


def _rows(path: str) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` of a file of JSON rows: a ``.jsonl`` file (one object a line; blank lines skipped), a JSON
    list, or a JSON object with a list ``questions`` (what ExtremeWhenBench's reference script reads)."""
    if path.lower().endswith(".jsonl"):
        for number, row in JsonLines(path):
            yield f"{path}:{number}", row
        return
    data = _load_json(path, object)
    if isinstance(data, dict):
        data = data.get("questions")
    if not isinstance(data, list):
        raise AnnotationError(f"{path}: expected a JSON list of rows, or an object with a list 'questions'")
    for index, row in enumerate(data):
        yield f"{path}: row {index}", row


def read_extremewhenbench(path: str | os.PathLike, *, video_root: str | os.PathLike | None = None,
                          durations: dict[str, float] | None = None) -> Iterator[Sample]:
    """ExtremeWhenBench (Seo and Kim, "Natural-Language Temporal Grounding in Hour-Long Videos is a Search Problem",
    arXiv:2606.12300; the gated hub dataset ``min1321/extreme-when-bench``, exported with ``datasets``'
    ``to_json``): rows ``{qid, video_id, source_corpus, question, correct_interval: [s, e], video_duration_s, ...}``,
    2,273 queries over 194 videos of LVBench, MLVU and VideoMME, in seconds.

    The video is ``<video_id>.mp4`` under ``video_root`` (the layout of the benchmark's reference script); the duration
    is ``video_duration_s`` (the row's ``duration_s`` is the event's length, not the video's); the qid is the row's.
    A ``.jsonl`` file, a JSON list or ``{"questions": [...]}`` is read.

    Raises:
        AnnotationError: a row that is not an object, a missing or non-string question or video id, an interval that
            is not ``[start, end]`` in seconds, or no duration (names the file and row).
    """
    path = str(path)
    resolver = VideoResolver(path, video_root)
    seen: dict[str, int] = defaultdict(int)
    for where, row in _rows(path):
        if not isinstance(row, dict):
            raise AnnotationError(f"{where}: expected an object, got {excerpt(row)}")
        vid = _text(row.get("video_id"), "video_id", where)
        video = resolver.path(vid, bare_id=True)
        start, end = _pair(row.get("correct_interval"), where)
        qid, index = row.get("qid"), seen[vid]
        seen[vid] += 1
        yield Sample(video=video, query=_text(row.get("question"), "question", where),
                     start=as_seconds(start, "start", where), end=as_seconds(end, "end", where),
                     duration=_duration(resolver, row.get("video_duration_s"), vid, video, durations, where),
                     qid=as_qid(qid, f"extremewhenbench:{vid}#{index}", where),
                     source="extremewhenbench")


# ------------------------------------------------------------------------------------------- interval-set readers
def read_timelens2(path: str | os.PathLike, *, video_root: str | os.PathLike | None = None,
                   durations: dict[str, float] | None = None) -> Iterator[Sample]:
    """TimeLens2's annotation rows (MCG-NJU/TimeLens2, grpo/timelens/data/sources.py; TimeLens2-93K): JSONL, either
    grouped ``{"video_path", "duration", "events": [{"query", "span": [[s, e], ...]}, ...]}`` or flat
    ``{"video_path", "duration", "query", "span": [[s, e], ...]}``, seconds; a flat ``[s, e]`` span is one span.

    Every sample carries ``spans`` (validated per span: :func:`grounding_rl.data.samples.validate_spans`);
    ``start``/``end`` are the hull. A relative ``video_path`` resolves against ``video_root`` (TimeLens2's
    ``mp4_root``) or the file's folder; the qid is the row's ``qid`` when it has one, else
    ``timelens2:<video_path>#<index>`` (index among that video's queries in the file). Frame-directory rows
    (TimeLens2's ``frames_root``) are not read: give the mp4.

    Raises:
        AnnotationError: a row without ``video_path``, with neither ``events`` nor ``query``/``span``, a span that is
            not ``[[start, end], ...]``, or no duration (names the file and line).
    """
    path = str(path)
    resolver = VideoResolver(path, video_root)
    seen: dict[str, int] = defaultdict(int)
    for where, row in _rows(path):
        if not isinstance(row, dict):
            raise AnnotationError(f"{where}: expected an object, got {excerpt(row)}")
        name = _text(row.get("video_path"), "video_path", where)
        video = resolver.path(name)
        duration = _duration(resolver, row.get("duration"), Path(name).stem, video, durations, where)
        if "events" in row:
            if not isinstance(row["events"], list):
                raise AnnotationError(f"{where}: events must be a list of {{query, span}}")
            events = row["events"]
        elif "query" in row and "span" in row:
            events = [row]
        else:
            raise AnnotationError(f"{where}: a TimeLens2 row needs 'events' or 'query' and 'span'")
        for event in events:
            at = f"{where}, event {seen[name]}"
            if not isinstance(event, dict):
                raise AnnotationError(f"{at}: expected {{query, span}}, got {excerpt(event)}")
            spans = as_spans(event.get("span"), "span", at)
            qid = event.get("qid", row.get("qid") if event is row else None)
            yield Sample(video=video, query=_text(event.get("query"), "query", at), start=spans[0][0],
                         end=spans[-1][1], duration=duration,
                         qid=as_qid(qid, f"timelens2:{name}#{seen[name]}", at), source="timelens2",
                         spans=spans)
            seen[name] += 1


def rollout_intervals(item: Any) -> list[list[float]]:
    """One TimeLens2 rollout as an interval set ``[[s, e], ...]`` (MCG-NJU/TimeLens2 @a5ce450,
    ``grpo/timelens/data/sources.py``, ``_one_rollout_intervals``): a decoded string is read as a Python literal
    (``ast.literal_eval``: literals only, never code; anything else → ``[]``); a flat ``[s, e]`` is one span; pairs
    with ``s ≥ e`` or non-numbers are dropped; what is not a list → ``[]`` (the rollout then scores 0)."""
    import ast

    if isinstance(item, str):
        text = item.strip()
        if not text:
            return []
        try:
            item = ast.literal_eval(text)
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
            return []
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    if isinstance(item, (list, tuple)) and len(item) == 2 and all(number(v) for v in item):
        return [[float(item[0]), float(item[1])]] if item[0] < item[1] else []
    if not isinstance(item, (list, tuple)):
        return []
    out = []
    for pair in item:
        if isinstance(pair, (list, tuple)) and len(pair) >= 2 and number(pair[0]) and number(pair[1]):
            if pair[0] < pair[1]:
                out.append([float(pair[0]), float(pair[1])])
    return out


def timelens2_rollouts(path: str | os.PathLike) -> dict[str, list[list[list[float]]]]:
    """``{qid: K interval sets}`` of a TimeLens2 rollout file (``grpo/data/rollouts/*.jsonl``: flat rows with
    ``rollouts``, the K decoded answers of its 4B SFT model, or already parsed ``rollout_intervals``), qids as
    :func:`read_timelens2` numbers them; rows with neither field are left out. Each rollout is
    :func:`rollout_intervals`."""
    seen: dict[str, int] = defaultdict(int)
    out: dict[str, list] = {}
    for _, row in _rows(str(path)):
        if not isinstance(row, dict) or not isinstance(row.get("video_path"), str):
            continue
        name = row["video_path"].strip()
        events = row["events"] if isinstance(row.get("events"), list) else [row]
        for event in events:
            qid = event.get("qid", row.get("qid") if event is row else None)
            qid = as_qid(qid, f"timelens2:{name}#{seen[name]}", f"{path}: {name}")
            seen[name] += 1
            raw = event.get("rollout_intervals", event.get("rollouts"))
            if raw is not None:
                out[qid] = [rollout_intervals(r) for r in (raw if isinstance(raw, list) else [raw])]
    return out


def read_qvhighlights(path: str | os.PathLike, *, video_root: str | os.PathLike | None = None,
                      durations: dict[str, float] | None = None) -> Iterator[Sample]:
    """QVHighlights moment retrieval (Lei et al., "QVHighlights: Detecting Moments and Highlights in Videos via
    Natural Language Queries", NeurIPS 2021; jayleicn/moment_detr ``data/highlight_{train,val}_release.jsonl``): rows
    ``{qid, query, duration, vid, relevant_windows: [[s, e], ...], ...}`` in seconds, one sample per query with all
    its ``relevant_windows`` as ``spans``. The video is ``<vid>.mp4`` under ``video_root``; the qid is the row's.
    The test split has no ``relevant_windows`` (its answers are hidden): it is refused.

    Raises:
        AnnotationError: a row without ``query``, ``vid`` or ``relevant_windows``, or no duration (names the line).
    """
    path = str(path)
    resolver = VideoResolver(path, video_root)
    for where, row in _rows(path):
        if not isinstance(row, dict):
            raise AnnotationError(f"{where}: expected an object, got {excerpt(row)}")
        vid = _text(row.get("vid"), "vid", where)
        if row.get("relevant_windows") is None:
            raise AnnotationError(f"{where}: no relevant_windows (the test split's answers are hidden; use val)")
        spans = as_spans(row["relevant_windows"], "relevant_windows", where)
        video = resolver.path(vid, bare_id=True)
        yield Sample(video=video, query=_text(row.get("query"), "query", where), start=spans[0][0],
                     end=spans[-1][1], duration=_duration(resolver, row.get("duration"), vid, video, durations, where),
                     qid=as_qid(row.get("qid"), f"qvhighlights:{where}", where),
                     source="qvhighlights", spans=spans)


def read_canonical(path: str | os.PathLike, *, video_root: str | os.PathLike | None = None,
               durations: dict[str, float] | None = None) -> Iterator[Sample]:
    """Canonical JSONL (see :func:`grounding_rl.data.samples.iter_samples`)."""
    return iter_samples(path, video_root=video_root, durations=durations)


READERS: dict[str, Callable[..., Iterator[Sample]]] = {
    "charades_sta": read_charades_sta,
    "activitynet": read_activitynet,
    "tacos": read_tacos,
    "time_r1": read_time_r1,
    "tvgbench": read_tvgbench,
    "timelens": read_timelens,
    "ego4d_nlq": read_ego4d_nlq,
    "ego4d_nlq_video": read_ego4d_nlq_video,
    "extremewhenbench": read_extremewhenbench,
    "timelens2": read_timelens2,
    "qvhighlights": read_qvhighlights,
    "jsonl": read_canonical,
}


def read_annotations(format_name: str, path: str | os.PathLike, *, video_root: str | os.PathLike | None = None,
                     durations: str | os.PathLike | dict[str, float] | None = None) -> Iterator[Sample]:
    """Samples (unvalidated) from ``path`` with the reader registered as ``format_name``.

    Args:
        format_name: a key of :data:`READERS`.
        path: the annotation file.
        video_root: folder for relative video paths (default: the annotation file's folder).
        durations: a durations file (see :func:`load_durations`) or a ready ``{video id: seconds}`` mapping.
    Raises:
        KeyError: unknown format (the message lists the known ones).
        FileNotFoundError: ``path`` does not exist.
        AnnotationError: see the readers.
    """
    if format_name not in READERS:
        raise KeyError(f"unknown annotation format {format_name!r}; known: {', '.join(READERS)}")
    if not os.path.isfile(path):
        raise FileNotFoundError(errno.ENOENT, "annotation file not found", str(path))
    if durations is not None and not isinstance(durations, dict):
        durations = load_durations(durations)
    return READERS[format_name](path, video_root=video_root, durations=durations)


__all__ = ["READERS", "Reader", "count_several_spans", "load_durations", "read_activitynet", "read_annotations",
           "read_canonical", "read_charades_sta", "read_ego4d_nlq", "read_ego4d_nlq_video", "read_extremewhenbench",
           "read_qvhighlights", "read_tacos", "read_time_r1", "read_timelens", "read_timelens2", "read_tvgbench",
           "rollout_intervals", "timelens2_rollouts",
           "timelens_query"]
