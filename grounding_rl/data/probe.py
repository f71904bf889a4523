"""Video duration probing: decoded frames / average fps, with decord and a PyAV fallback.

The time base matches :mod:`grounding_rl.data.video` (duration = number of decoded frames / source fps, counted from the
first decoded frame), so a probed duration and the sampler's duration agree on the same file.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path


class VideoProbeError(RuntimeError):
    """A video's duration could not be read. The message names the file."""


def _probe_decord(path: str) -> float:
    import decord

    reader = decord.VideoReader(path, num_threads=1)
    frames, fps = len(reader), float(reader.get_avg_fps())
    if frames < 1 or not fps > 0:
        raise ValueError(f"decord reports {frames} frames at {fps} fps")
    return frames / fps


def _probe_pyav(path: str) -> float:
    import av

    with av.open(path) as container:
        if not container.streams.video:
            raise ValueError("no video stream")
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate
        frames = stream.frames
        if not frames and rate:  # e.g. mkv without per-stream frame counts: count packets, no decoding
            frames = sum(1 for packet in container.demux(stream) if packet.size)
        if frames and rate:
            return frames / float(rate)
        if container.duration:  # microseconds (av.time_base)
            return container.duration / 1e6
    raise ValueError("neither a frame count with a frame rate nor a container duration")


def probe_duration(path: str | os.PathLike) -> float:
    """Duration of a video in seconds: number of frames / average frame rate.

    Each version of a file is probed once per process (cached by path, modification time and size). Tries decord
    first, then PyAV (which counts demuxed packets when the stream has no frame count, and falls back to
    the container duration).

    Args:
        path: a video file.
    Returns:
        duration in seconds (float > 0).
    Raises:
        VideoProbeError: the file is missing or neither backend can read a duration; the message names the file and
            both backends' errors.
    """
    path = str(Path(path))
    if not os.path.isfile(path):
        what = ("is a folder, not a video file" if os.path.isdir(path) else
                "is a broken link" if os.path.lexists(path) else "video file not found")
        raise VideoProbeError(f"{path}: {what}")
    stat = os.stat(path)
    return _probe(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=None)
def _probe(path: str, mtime_ns: int, size: int) -> float:
    """:func:`probe_duration` of one version of a file (its modification time and size are the cache key, so a
    reader and ``prepare --video-root`` probe each video once per process; a failure is not cached)."""
    errors = []
    for name, probe in (("decord", _probe_decord), ("pyav", _probe_pyav)):
        try:
            duration = probe(path)
        except Exception as err:  # noqa: BLE001 - backends raise their own error types; report them all
            errors.append(f"{name}: {err}")
            continue
        if duration > 0:
            return float(duration)
        errors.append(f"{name}: non-positive duration {duration}")
    raise VideoProbeError(f"{path}: cannot read the video duration ({'; '.join(errors)})")
