"""``grounding-rl prepare``: convert a benchmark annotation file to canonical JSONL.

    grounding-rl prepare --format NAME --annotations FILE [--durations FILE] [--video-root DIR] --out OUT.jsonl
    grounding-rl prepare --benchmark evaluation/X.yaml [--data-root DIR] [--video-root DIR] --out OUT.jsonl

The second form takes the format, annotation file, durations file and video root from a benchmark definition
(:mod:`grounding_rl.eval.benchmarks`; ``scripts/eval.sh`` uses it). The work is :func:`grounding_rl.data.prepare.
prepare`; the last stdout line is its counts as JSON, ``{"kept", "dropped", "clamped", "missing_videos",
"unreadable_videos", "duration_mismatch"}`` (the video counts ``null``, "not checked", without a video root).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from grounding_rl.errors import UserError, check_number


def build_parser() -> argparse.ArgumentParser:
    from grounding_rl.data.missing import DEFAULT_MAX_MISSING_FRACTION
    from grounding_rl.data.readers import READERS
    from grounding_rl.paths import DATA_ENV

    parser = argparse.ArgumentParser(prog="grounding-rl prepare",
                                     usage="grounding-rl prepare --format NAME --annotations FILE [--durations FILE] "
                                           "[--video-root DIR] --out OUT.jsonl\n"
                                           "       grounding-rl prepare --benchmark evaluation/X.yaml [--data-root DIR] "
                                           "[--video-root DIR] --out OUT.jsonl",
                                     description="Convert benchmark annotations to canonical JSONL "
                                                 "(video, query, start, end, duration, qid, source; seconds).")
    parser.add_argument("--format", choices=list(READERS), help="annotation format (reader name); required unless --benchmark")
    parser.add_argument("--annotations", help="annotation file to read; required unless --benchmark")
    parser.add_argument("--benchmark", default=None,
                        help="a benchmark definition (evaluation/*.yaml) giving the format, annotations, durations "
                             "and video root instead")
    parser.add_argument("--data-root", default=None,
                        help=f"with --benchmark: folder of its annotation files (default: ${DATA_ENV}, else the test "
                             "data)")
    parser.add_argument("--durations", default=None,
                        help="video durations by id: a Charades json ({id: {duration}}) or a csv with 'id' and "
                             "'length' columns; used where the annotations have none")
    parser.add_argument("--video-root", default=None,
                        help="folder of the videos (relative video paths resolve here; default: the annotation "
                             "file's folder); also turns on the check for missing and unreadable videos")
    parser.add_argument("--out", required=True, help="output canonical JSONL (written atomically)")
    parser.add_argument("--max-missing-fraction", type=float, default=None,
                        help="with --video-root: fail when more than this share of the videos is missing or unreadable "
                             f"(1.0: never; default {DEFAULT_MAX_MISSING_FRACTION})")
    return parser


def _from_benchmark(args) -> None:
    """Fill ``args.format``, ``annotations``, ``durations`` and ``video_root`` from ``--benchmark``.

    Raises:
        UserError: ``--benchmark`` together with ``--format`` / ``--annotations`` / ``--durations``; a bad YAML; no video
            root in the YAML nor on the command line (:class:`grounding_rl.eval.benchmarks.BenchmarkError`).
    """
    from grounding_rl.eval.benchmarks import BenchmarkError, load_benchmark

    given = [flag for flag, value in (("--format", args.format), ("--annotations", args.annotations),
                                      ("--durations", args.durations)) if value is not None]
    if given:
        raise UserError(f"--benchmark {args.benchmark} gives {', '.join(given)} itself; drop {' and '.join(given)}")
    bench = load_benchmark(args.benchmark, build_protocol=False, data_root_dir=args.data_root)
    args.video_root = args.video_root or bench.video_root
    if not args.video_root:
        raise BenchmarkError(f"{bench.path}: no video_root in the benchmark; pass --video-root DIR (the folder of the "
                             f"{bench.name} videos)")
    args.format, args.annotations, args.durations = bench.format, bench.annotations, bench.durations


def main(argv: list[str] | None = None) -> int:
    """Returns 0 on success.

    Raises:
        UserError: an unknown format, an output path that is a folder, a video that cannot be probed, an input with
            no usable line; the readers' :class:`AnnotationError` (a subclass) for a bad file or line. The
            ``grounding-rl`` command prints each as one line with exit status 2.
    """
    from grounding_rl.data.missing import DEFAULT_MAX_MISSING_FRACTION
    from grounding_rl.data.prepare import prepare
    from grounding_rl.data.probe import VideoProbeError

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.benchmark:
        _from_benchmark(args)
    elif args.format is None or args.annotations is None:
        parser.error("give --format and --annotations, or --benchmark")
    elif args.data_root is not None:
        parser.error("--data-root goes with --benchmark")
    if args.max_missing_fraction is not None and not args.video_root:
        parser.error("--max-missing-fraction goes with --video-root (without it no video is checked)")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    check_number("--max-missing-fraction", args.max_missing_fraction, minimum=0.0, maximum=1.0)
    if args.max_missing_fraction is None:
        args.max_missing_fraction = DEFAULT_MAX_MISSING_FRACTION
    if os.path.isdir(args.out):
        raise UserError(f"{args.out}: --out is a folder; give the path of the .jsonl file to write")
    try:
        from grounding_rl.prompts.templates import split_prompt

        counts = prepare(args.format, args.annotations, args.out, durations=args.durations,
                         video_root=args.video_root, max_missing_fraction=args.max_missing_fraction,
                         split_prompt=split_prompt)
    except (KeyError, VideoProbeError) as err:
        raise UserError(err.args[0] if err.args else str(err)) from None
    if counts["missing_videos"] is None:
        print("prepare: missing and unreadable videos not checked (give --video-root to check them)", file=sys.stderr)
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
