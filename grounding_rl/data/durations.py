"""The annotations' durations against their videos': one rule for ``prepare --video-root`` and ``eval``.

A duration off its video's (:func:`grounding_rl.data.probe.probe_duration`) by a factor outside
[:data:`DURATION_RATIO_MIN`, :data:`DURATION_RATIO_MAX`] is a unit mistake (milliseconds, frames), refused
(:func:`check_durations`); a difference above :data:`DURATION_TOLERANCE` seconds (rounding) within it is counted (real
annotation sets differ from the files by fractions of a second). ``prepare --video-root`` probes every video
(it opens each once anyway); ``eval`` probes the first :data:`PROBED_VIDEOS` distinct ones (:func:`check_first_videos`:
a unit mistake runs through a whole file, and a benchmark's thousands of videos would cost minutes up front).
"""
from __future__ import annotations

import os

from grounding_rl.data.probe import VideoProbeError, probe_duration
from grounding_rl.data.samples import Sample
from grounding_rl.errors import UserError

DURATION_RATIO_MIN, DURATION_RATIO_MAX = 0.5, 2.0
DURATION_TOLERANCE = 0.001
SHOWN = 3  # queries named in the refusal
PROBED_VIDEOS = 16  # videos check_first_videos probes


def duration_mismatches(samples: list[Sample], probed: dict[str, float],
                        tolerance: float = DURATION_TOLERANCE) -> tuple[list[tuple[Sample, float]], int]:
    """Compare each sample's duration (as the annotations give it) with its video's probed duration.

    Args:
        samples: validated samples.
        probed: ``{video path: probed duration in seconds}`` (videos missing here are not compared).
        tolerance: seconds of difference still counted as agreement.
    Returns:
        ``(gross, small)``: the samples whose ratio claimed / probed lies outside [DURATION_RATIO_MIN,
        DURATION_RATIO_MAX] (a unit mistake: milliseconds, frames), each with its probed duration, in input order;
        and the number of the others that differ by more than ``tolerance`` (real annotation sets differ by
        fractions of a second). Example: 30740.0 claimed, 30.74 probed → gross; 35.2 claimed, 35.1415 probed → small.
    """
    gross, small = [], 0
    for sample in samples:
        actual = probed.get(sample.video)
        if actual is None:
            continue
        ratio = sample.duration / actual
        if not DURATION_RATIO_MIN <= ratio <= DURATION_RATIO_MAX:
            gross.append((sample, actual))
        elif abs(sample.duration - actual) > tolerance:
            small += 1
    return gross, small


def check_durations(samples: list[Sample], probed: dict[str, float], annotations: str,
                    numbers: dict[str, int] | None = None) -> int:
    """Refuse a gross duration mismatch (:func:`duration_mismatches`), naming the first queries; return the count of
    small ones.

    Args:
        samples: the validated samples compared (the count in the message is out of these).
        probed: ``{video path: probed duration in seconds}``.
        annotations: the file named first in the message.
        numbers: ``{qid: query number}`` (1-based, file order) to name queries by number too; None = by qid only.
    Raises:
        UserError: ``"FILE: 8 of 8 durations differ from their video's by a factor outside [0.5, 2] (query 1, qid 'a':
        30740 s, v.mp4 lasts 30.74 s; also query 2, 3, …): milliseconds or frames, not seconds?"`` (without
        ``numbers``: ``(qid 'a': …; also qid 'b', 'c', …)``).
    """
    gross, small = duration_mismatches(samples, probed)
    if gross:
        first, actual = gross[0]
        if numbers is None:
            named, others, word = f"qid {first.qid!r}", [repr(s.qid) for s, _ in gross[1:SHOWN]], "qid"
        else:
            named = f"query {numbers.get(first.qid, '?')}, qid {first.qid!r}"
            others, word = [str(numbers.get(s.qid, "?")) for s, _ in gross[1:SHOWN]], "query"
        others_text = f"; also {word} {', '.join(others)}{', …' if len(gross) > SHOWN else ''}" if others else ""
        raise UserError(f"{annotations}: {len(gross)} of {len(samples)} durations differ from their video's by a "
                        f"factor outside [{DURATION_RATIO_MIN:g}, {DURATION_RATIO_MAX:g}] ({named}: "
                        f"{first.duration:g} s, {os.path.basename(first.video)} lasts {actual:.2f} s{others_text}): "
                        "milliseconds or frames, not seconds?")
    return small


def check_first_videos(samples: list[Sample], annotations: str, max_videos: int = PROBED_VIDEOS) -> int:
    """:func:`check_durations` on the queries of the first ``max_videos`` distinct videos of ``samples`` (file order),
    each probed with :func:`grounding_rl.data.probe.probe_duration` (2-8 ms a clip: the container's frame count, no
    frame decoded); a missing or unreadable one is skipped (counted where the clips are loaded).

    Returns:
        the number of those queries whose duration differs slightly from their video's.
    Raises:
        UserError: as :func:`check_durations`, the count out of the queries compared.
    """
    probed: dict[str, float] = {}
    for video in list(dict.fromkeys(sample.video for sample in samples))[:max_videos]:
        try:
            probed[video] = probe_duration(video)
        except VideoProbeError:
            continue
    return check_durations([sample for sample in samples if sample.video in probed], probed, annotations)
