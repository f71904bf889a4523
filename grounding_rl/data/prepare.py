"""Benchmark annotation file → canonical JSONL (what ``grounding-rl prepare``, :mod:`grounding_rl.cli.prepare`, runs).

:func:`prepare` reads with the reader ``NAME`` of :data:`grounding_rl.data.readers.READERS`, applies the one validation policy
(:func:`grounding_rl.data.samples.validate`), writes the output atomically and returns the counts the command prints,
``{"kept", "dropped", "clamped", "missing_videos", "unreadable_videos", "duration_mismatch"}``. With ``--video-root``
the distinct videos of the kept samples are checked: ``missing_videos`` counts those that are not files,
``unreadable_videos`` those that exist but whose duration cannot be read (each opened once with
:func:`grounding_rl.data.probe.probe_duration`, a tqdm bar on a terminal); both are listed on stderr (the first few)
and held against ``--max-missing-fraction``. Each query's duration is compared with its video's: a ratio outside
[0.5, 2] is a unit mistake (milliseconds, frames) and refused, naming the first queries; ``duration_mismatch`` counts
the other queries whose duration differs from the video's (real annotation sets differ by fractions of a second). Without
``--video-root`` nothing is checked: the three are ``null`` and stderr says "not checked". A file whose every query
was clamped into its video gets a warning naming the likely unit mistake. Video paths are written
relative to the output's folder when the video lies inside it, else absolute.

Every qid must be unique (``eval`` resumes and merges predictions by qid): the readers make them unique
(``<format>:<video id>#<index>``) except where the file gives its own (``jsonl``, ``time_r1``), and a repeated one is
refused, naming the qid and both queries.
"""
from __future__ import annotations

import logging
import os
import sys

from tqdm import tqdm

from grounding_rl.data.durations import check_durations
from grounding_rl.data.missing import DEFAULT_MAX_MISSING_FRACTION, check_fraction, missing_videos
from grounding_rl.data.probe import VideoProbeError, probe_duration
from grounding_rl.data.readers import count_several_spans, read_annotations, timelens2_rollouts
from grounding_rl.data.samples import Sample, validate, write_samples
from grounding_rl.errors import UserError
from grounding_rl.jsonl_files import write_jsonl_atomic

logger = logging.getLogger(__name__)


def _relative_to_out(sample: Sample, out_dir: str) -> Sample:
    """The sample with its video path relative to ``out_dir`` when the video lies inside it (portable output)."""
    rel = os.path.relpath(sample.video, out_dir)
    if rel.startswith(os.pardir + os.sep) or rel == os.pardir or os.path.isabs(rel):
        return sample
    return Sample(rel, sample.query, sample.start, sample.end, sample.duration, sample.qid, sample.source,
                  spans=sample.spans, spans_all=sample.spans_all, raw_spans=sample.raw_spans)


def _unique_qids(samples, annotations: str, first: dict[str, int] | None = None):
    """``samples`` as they come, refusing a qid seen before; ``first`` (when given) receives ``{qid: query number}``
    (1-based, file order).

    Raises:
        UserError: ``"FILE: qid 'x' of query 7 repeats query 3's (queries counted in file order) ..."``.
    """
    first = {} if first is None else first
    for number, sample in enumerate(samples, 1):
        earlier = first.setdefault(sample.qid, number)
        if earlier != number:
            raise UserError(f"{annotations}: qid {sample.qid!r} of query {number} repeats query {earlier}'s (queries "
                            "counted in file order); give each query its own qid (eval resumes and merges by qid)")
        yield sample


def unreadable_videos(videos: list[str], progress: bool = True) -> list[str]:
    """The videos of ``videos`` (existing files) whose duration cannot be read: each is opened once with
    :func:`grounding_rl.data.probe.probe_duration` (decord, then PyAV), the check training's clips also pass.
    Returns them in the given order."""
    broken = []
    for video in tqdm(videos, desc="prepare: opening videos", unit=" videos", disable=None if progress else True,
                      file=sys.stderr):
        try:
            probe_duration(video)
        except VideoProbeError:
            broken.append(video)
    return broken


def _check_durations(kept: list[Sample], videos: list[str], numbers: dict[str, int], annotations: str) -> int:
    """Probe ``videos`` and refuse a gross duration mismatch (:func:`grounding_rl.data.durations.check_durations`,
    the rule ``eval`` applies too), naming the first queries; return the count of small ones (``duration_mismatch``).

    Raises:
        UserError: ``"FILE: 8 of 8 durations differ from their video's by a factor outside [0.5, 2] (query 1, qid 'a':
        30740 s, v.mp4 lasts 30.74 s; also query 2, 3, …): milliseconds or frames, not seconds?"``.
    """
    small = check_durations(kept, {video: probe_duration(video) for video in videos}, annotations, numbers)
    if small:
        logger.info("%s: %d of %d queries give a duration other than their video's (kept as given)", annotations,
                    small, len(kept))
    return small


def _timelens2_rows(samples: list[Sample], annotations: str, split_prompt) -> tuple[list[dict], dict]:
    """Canonical rows of TimeLens2 samples with their rollouts (``difficulty.rollout_intervals``) and, where
    ``split_prompt`` recognises a baked prompt, the bare query and its ``prompt_template``; and the counts."""
    from grounding_rl.data.selection import FIELD, ROLLOUTS

    rollouts = timelens2_rollouts(annotations)
    rows, templates = [], {}
    for sample in samples:
        row = sample.to_dict()
        split = split_prompt(sample.query) if split_prompt is not None else None
        if split is not None:
            row["query"], row["prompt_template"] = split
            templates[split[1]] = templates.get(split[1], 0) + 1
        if sample.qid in rollouts:
            row[FIELD] = {ROLLOUTS: rollouts[sample.qid]}
        rows.append(row)
    return rows, {"with_rollouts": sum(1 for r in rows if FIELD in r), "prompt_templates": templates}


def prepare(format_name: str, annotations: str, out: str, *, durations: str | None = None,
            video_root: str | None = None, progress: bool = True,
            max_missing_fraction: float = DEFAULT_MAX_MISSING_FRACTION, split_prompt=None) -> dict[str, int]:
    """Read, validate and write; return the counts printed by the CLI.

    Args:
        format_name: reader name (a key of ``READERS``).
        annotations: annotation file.
        out: output JSONL path.
        durations: optional durations file (Charades json or csv).
        video_root: optional video folder; when given, missing and unreadable videos are counted.
        progress: show a tqdm bar (stderr).
        max_missing_fraction: with ``video_root``, fail when a larger share of the distinct videos is missing, or
            missing or unreadable (:func:`grounding_rl.data.missing.check_fraction`).
        split_prompt: for ``timelens2``, a function ``query -> (query, template name) | None``
            (:func:`grounding_rl.prompts.templates.split_prompt`): a query with a known prompt baked in (TimeLens2's
            rollout files) is written as the bare query plus that row's ``prompt_template``.
    Returns:
        ``{"kept", "dropped", "clamped", "missing_videos", "unreadable_videos", "duration_mismatch"}`` (the last
        three None without ``video_root``: not checked); for ``timelens2`` also ``"with_rollouts"`` (rows whose ``rollouts`` /
        ``rollout_intervals`` became ``difficulty.rollout_intervals``, what ``difficulty_sampling: dispersion`` reads)
        and ``"prompt_templates"`` (``{template: rows}`` split off by ``split_prompt``); for ``timelens`` also
        ``"several_spans"``, the queries
        listing more than one span (scored against the first:
        :func:`grounding_rl.data.readers.read_timelens`).
    Raises:
        KeyError, FileNotFoundError, AnnotationError, VideoProbeError: see
        :func:`grounding_rl.data.readers.read_annotations`.
        UserError: no line of the input is usable, a qid repeats (naming it and both queries), more than
            ``max_missing_fraction`` of the videos are missing or unreadable, or a query's duration is off its
            video's by a factor outside [0.5, 2] (nothing is written).
    """
    stream = read_annotations(format_name, annotations, video_root=video_root, durations=durations)
    # no bar when stderr is not a terminal (disable=None), so a log or a test sees only messages
    numbers: dict[str, int] = {}
    bar = tqdm(_unique_qids(stream, annotations, numbers), desc=f"prepare {format_name}", unit=" queries",
               disable=None if progress else True, file=sys.stderr)
    kept, counts = validate(bar)
    if not kept:
        raise UserError(f"{annotations}: no usable line ({counts['dropped']} dropped by the validation policy, "
                        f"{format_name} format); nothing written to {out}")
    missing = unreadable = mismatch = None
    if video_root is not None:
        absent, total = missing_videos(sample.video for sample in kept)
        check_fraction(absent, total, max_missing_fraction, f"{annotations}: missing under {video_root}:",
                       "check --video-root")
        broken = unreadable_videos(sorted({s.video for s in kept} - set(absent)), progress)
        check_fraction(absent + broken, total, max_missing_fraction,
                       f"{annotations}: missing or unreadable under {video_root}:", "check the videos")
        missing, unreadable = len(absent), len(broken)
        readable = sorted({s.video for s in kept} - set(absent) - set(broken))
        mismatch = _check_durations(kept, readable, numbers, annotations)
        for what, videos in (("missing", absent), ("unreadable", broken)):
            if videos:
                logger.warning("%d of %d videos are %s under %s, e.g. %s", len(videos), total, what, video_root,
                               ", ".join(videos[:3]))
    if counts["clamped"] == len(kept):
        logger.warning("%s: all %d queries were clamped into their videos (times past the duration): are the times "
                       "in milliseconds or frames? prepare reads seconds", annotations, len(kept))
    out_dir = os.path.dirname(os.path.abspath(out))
    extra: dict = {}
    if format_name == "timelens2":
        rows, extra = _timelens2_rows([_relative_to_out(sample, out_dir) for sample in kept], annotations, split_prompt)
        write_jsonl_atomic(out, rows)
    else:
        write_samples(out, (_relative_to_out(sample, out_dir) for sample in kept))
    counts = {**counts, "missing_videos": missing, "unreadable_videos": unreadable, "duration_mismatch": mismatch,
              **extra}
    if format_name == "timelens":
        counts["several_spans"] = count_several_spans(annotations)["several_spans"]
    return counts
