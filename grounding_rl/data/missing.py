"""Missing data fails loudly: the share of videos that are missing (found up front) or unreadable (counted as they
come) is held against ``max_missing_fraction``. Above it ``eval``, ``train``, ``sft`` and ``prepare --video-root`` stop
with one line giving the count and the first paths; at or below it they proceed and report the count.

The default, 0.05, tolerates the few broken clips every benchmark copy has; 1.0 never fails (substitutes and IoU-0
failures only, as before the check existed); 0.0 fails on any missing video.
"""
from __future__ import annotations

import os
from collections.abc import Iterable

from grounding_rl.errors import UserError

DEFAULT_MAX_MISSING_FRACTION = 0.05
SHOWN = 3  # paths quoted in the error line


def missing_videos(videos: Iterable[str]) -> tuple[list[str], int]:
    """``(sorted distinct videos that are not files, number of distinct videos)``."""
    distinct = sorted(set(videos))
    return [video for video in distinct if not os.path.isfile(video)], len(distinct)


def check_fraction(bad: list[str] | int, total: int, max_fraction: float, what: str, hint: str = "") -> None:
    """Raise when more than ``max_fraction`` of ``total`` videos are ``bad``.

    Args:
        bad: the bad video paths (the first few are quoted), or just their count.
        total: number of distinct videos.
        max_fraction: the allowed share in [0, 1].
        what: what was checked, e.g. ``"data/test.jsonl: missing"`` (starts the message).
        hint: appended to the message (e.g. ``"check --video-root"``).

    Raises:
        UserError: ``count / total > max_fraction``: ``"WHAT 11 of 12 videos (92 %, more than
        max_missing_fraction 0.05), e.g. a.mp4, b.mp4, c.mp4 in /data/videos; HINT"``.
        ValueError: ``max_fraction`` outside [0, 1].
    """
    if not 0.0 <= max_fraction <= 1.0:
        raise ValueError(f"max_missing_fraction must be in [0, 1], got {max_fraction}")
    count = bad if isinstance(bad, int) else len(bad)
    if total <= 0 or count / total <= max_fraction:
        return
    shown = "" if isinstance(bad, int) else ", e.g. " + _quoted(bad[:SHOWN])
    raise UserError(f"{what} {count} of {total} videos ({100 * count / total:.0f} %, more than max_missing_fraction "
                    f"{max_fraction}){shown}" + (f"; {hint}" if hint else "")
                    + "; max_missing_fraction 1.0 goes on anyway")


def _quoted(paths: list[str]) -> str:
    """``paths`` joined by commas, their common folder written once (``a.mp4, b.mp4 in /data/videos``) so that a
    long video root does not push the names past the one error line's width."""
    try:
        folder = os.path.commonpath([os.path.dirname(path) for path in paths]) if len(paths) > 1 else ""
    except ValueError:  # absolute and relative paths mixed
        folder = ""
    if not folder:
        return ", ".join(paths)
    return ", ".join(os.path.relpath(path, folder) for path in paths) + f" in {folder}"
