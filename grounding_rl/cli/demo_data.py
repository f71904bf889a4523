"""``grounding-rl demo-data``: write the procedural demo clips and their train/test splits
(:mod:`grounding_rl.dev.demo`).

    grounding-rl demo-data --out DIR [--num-train N] [--num-test N] [--seed S] [--min-duration S] [--max-duration S]
                           [--long | --multi-span]

``--long``: clips of a few minutes (120-180 s by default, 300 train / 50 test) with events of 2-5 s and a time bar
that does not wrap over the clip, for the zoom evaluation (``eval --zoom``; configs/demo_long_sft.yaml).
``--multi-span``: the target appears in one to three windows of whole seconds; lines carry ``spans`` (interval-set
training with ``prompt_template: default_multi`` and set-IoU scoring; docs/BENCHMARKS.md).
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    from grounding_rl.dev import demo

    parser = argparse.ArgumentParser(prog="grounding-rl demo-data",
                                     description="Procedural clips with a known event interval (the CPU demo).")
    parser.add_argument("--out", required=True,
                        help="output folder (videos/, train.jsonl, test.jsonl); refused when it holds files demo-data "
                             "did not write unless --overwrite; its own earlier output (demo_data.json) is replaced")
    parser.add_argument("--overwrite", action="store_true",
                        help="write over a folder holding other files (train.jsonl and test.jsonl are written over; "
                             "other files are left)")
    parser.add_argument("--num-train", type=int, default=None,
                        help=f"default {demo.NUM_TRAIN} ({demo.LONG_NUM_TRAIN} with --long)")
    parser.add_argument("--num-test", type=int, default=None,
                        help=f"default {demo.NUM_TEST} ({demo.LONG_NUM_TEST} with --long)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-duration", type=float, default=None,
                        help=f"seconds; default {demo.MIN_DURATION} ({demo.LONG_MIN_DURATION} with --long)")
    parser.add_argument("--max-duration", type=float, default=None,
                        help=f"seconds; default {demo.MAX_DURATION} ({demo.LONG_MAX_DURATION} with --long)")
    parser.add_argument("--long", action="store_true",
                        help="clips of a few minutes, events of 2-5 s, a time bar that does not wrap (for --zoom)")
    parser.add_argument("--multi-span", action="store_true",
                        help="the target appears in one to three windows (spans in the JSONL; clips >= 5 s)")
    parser.add_argument("--no-time-code", dest="time_code", action="store_false",
                        help="constant background (no hue time code)")
    args = parser.parse_args(argv)
    long = args.long
    num_train = args.num_train if args.num_train is not None else (demo.LONG_NUM_TRAIN if long else demo.NUM_TRAIN)
    num_test = args.num_test if args.num_test is not None else (demo.LONG_NUM_TEST if long else demo.NUM_TEST)
    lowest = args.min_duration if args.min_duration is not None else (
        demo.LONG_MIN_DURATION if long else demo.MIN_DURATION)
    highest = args.max_duration if args.max_duration is not None else (
        demo.LONG_MAX_DURATION if long else demo.MAX_DURATION)
    if num_train < 0 or num_test < 0:
        parser.error("--num-train and --num-test must be >= 0")
    if long and lowest < demo.LONG_EVENT_SECONDS[1]:
        parser.error(f"--long needs --min-duration >= {demo.LONG_EVENT_SECONDS[1]} (got {lowest})")
    if long and args.multi_span:
        parser.error("--long and --multi-span do not combine")
    if args.multi_span and lowest < 2 * demo.MULTI_SPAN_WINDOWS[1] - 1:
        parser.error(f"--multi-span needs --min-duration >= {2 * demo.MULTI_SPAN_WINDOWS[1] - 1} (got {lowest})")
    try:
        result = demo.generate_demo(args.out, num_train, num_test, args.seed, lowest, highest,
                                    time_code=args.time_code, long=long,
                                    multi_span=args.multi_span, overwrite=args.overwrite)
    except ValueError as err:
        parser.error(str(err))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
