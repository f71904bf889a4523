"""``grounding-rl prepare``: convert a benchmark annotation file to canonical JSONL.

    grounding-rl prepare --format NAME --annotations FILE [--durations FILE] [--video-root DIR] --out OUT.jsonl

Reads with the reader ``NAME`` of :data:`grounding_rl.data.readers.READERS`, applies the one validation policy
(:func:`grounding_rl.data.samples.validate`), writes ``OUT.jsonl`` atomically and prints, as the last stdout line,
``{"kept", "dropped", "clamped", "missing_videos"}``. ``missing_videos`` is the number of distinct video files of the
kept samples that do not exist; it is checked only with ``--video-root`` (else 0). Video paths are written relative
to the output's folder when the video lies inside it, else absolute.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from tqdm import tqdm

from grounding_rl.data.missing import DEFAULT_MAX_MISSING_FRACTION, check_fraction, missing_videos
from grounding_rl.data.probe import VideoProbeError
from grounding_rl.data.readers import READERS, count_several_spans, read_annotations
from grounding_rl.data.samples import Sample, validate, write_jsonl
from grounding_rl.errors import UserError

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grounding-rl prepare",
                                     description="Convert benchmark annotations to canonical JSONL "
                                                 "(video, query, start, end, duration, qid, source; seconds).")
    parser.add_argument("--format", required=True, choices=list(READERS), help="annotation format (reader name)")
    parser.add_argument("--annotations", required=True, help="annotation file to read")
    parser.add_argument("--durations", default=None,
                        help="video durations by id: a Charades json ({id: {duration}}) or a csv with 'id' and "
                             "'length' columns; used where the annotations have none")
    parser.add_argument("--video-root", default=None,
                        help="folder of the videos (relative video paths resolve here; default: the annotation "
                             "file's folder); also turns on the missing-video check")
    parser.add_argument("--out", required=True, help="output canonical JSONL (written atomically)")
    parser.add_argument("--max-missing-fraction", type=float, default=DEFAULT_MAX_MISSING_FRACTION,
                        help="with --video-root: fail when more than this share of the videos is missing (1.0: never)")
    return parser


def _relative_to_out(sample: Sample, out_dir: str) -> Sample:
    """The sample with its video path relative to ``out_dir`` when the video lies inside it (portable output)."""
    rel = os.path.relpath(sample.video, out_dir)
    if rel.startswith(os.pardir + os.sep) or rel == os.pardir or os.path.isabs(rel):
        return sample
    return Sample(rel, sample.query, sample.start, sample.end, sample.duration, sample.qid, sample.source)


def prepare(format_name: str, annotations: str, out: str, *, durations: str | None = None,
            video_root: str | None = None, progress: bool = True,
            max_missing_fraction: float = DEFAULT_MAX_MISSING_FRACTION) -> dict[str, int]:
    """Read, validate and write; return the counts printed by the CLI.

    Args:
        format_name: reader name (a key of ``READERS``).
        annotations: annotation file.
        out: output JSONL path.
        durations: optional durations file (Charades json or csv).
        video_root: optional video folder; when given, missing videos are counted.
        progress: show a tqdm bar (stderr).
        max_missing_fraction: with ``video_root``, fail when a larger share of the distinct videos is missing
            (:func:`grounding_rl.data.missing.check_fraction`).
    Returns:
        ``{"kept", "dropped", "clamped", "missing_videos"}``; for ``timelens`` also ``"several_spans"``, the queries
        listing more than one span (scored against the first:
        :func:`grounding_rl.data.readers.read_timelens`).
    Raises:
        KeyError, FileNotFoundError, AnnotationError, VideoProbeError: see
        :func:`grounding_rl.data.readers.read_annotations`.
        UserError: no line of the input is usable, or more than ``max_missing_fraction`` of the videos are missing
            (nothing is written).
    """
    stream = read_annotations(format_name, annotations, video_root=video_root, durations=durations)
    # no bar when stderr is not a terminal (disable=None), so a log or a test sees only messages
    bar = tqdm(stream, desc=f"prepare {format_name}", unit=" queries", disable=None if progress else True,
               file=sys.stderr)
    kept, counts = validate(bar)
    if not kept:
        raise UserError(f"{annotations}: no usable line ({counts['dropped']} dropped by the validation policy, "
                        f"{format_name} format); nothing written to {out}")
    missing = 0
    if video_root is not None:
        absent, total = missing_videos(sample.video for sample in kept)
        check_fraction(absent, total, max_missing_fraction, f"{annotations}: missing under {video_root}:",
                       "check --video-root")
        missing = len(absent)
        if absent:
            logger.warning("%d of %d videos are missing under %s, e.g. %s", missing, total, video_root,
                           ", ".join(absent[:3]))
    out_dir = os.path.dirname(os.path.abspath(out))
    write_jsonl(out, (_relative_to_out(sample, out_dir) for sample in kept))
    counts = {**counts, "missing_videos": missing}
    if format_name == "timelens":
        counts["several_spans"] = count_several_spans(annotations)["several_spans"]
    return counts


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (``grounding-rl prepare``). Returns 0 on success.

    Raises:
        UserError: an unknown format, an output path that is a folder, a video that cannot be probed, an input with
            no usable line; the readers' :class:`AnnotationError` (a subclass) for a bad file or line. The
            ``grounding-rl`` command prints each as one line with exit status 2.
    """
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if os.path.isdir(args.out):
        raise UserError(f"{args.out}: --out is a folder; give the path of the .jsonl file to write")
    try:
        counts = prepare(args.format, args.annotations, args.out, durations=args.durations,
                         video_root=args.video_root, max_missing_fraction=args.max_missing_fraction)
    except (KeyError, VideoProbeError) as err:
        raise UserError(err.args[0] if err.args else str(err)) from None
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
