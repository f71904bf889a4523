"""``grounding-rl demo-data``: write the procedural demo clips and their train/test splits
(:mod:`grounding_rl.dev.demo`).

    grounding-rl demo-data --out DIR [--num-train N] [--num-test N] [--seed S] [--min-duration S] [--max-duration S]
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    from grounding_rl.dev.demo import MAX_DURATION, MIN_DURATION, NUM_TEST, NUM_TRAIN, generate_demo

    parser = argparse.ArgumentParser(prog="grounding-rl demo-data",
                                     description="Procedural clips with a known event interval (the CPU demo).")
    parser.add_argument("--out", required=True, help="output folder (videos/, train.jsonl, test.jsonl)")
    parser.add_argument("--num-train", type=int, default=NUM_TRAIN)
    parser.add_argument("--num-test", type=int, default=NUM_TEST)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-duration", type=float, default=MIN_DURATION, help="seconds")
    parser.add_argument("--max-duration", type=float, default=MAX_DURATION, help="seconds")
    parser.add_argument("--no-time-code", dest="time_code", action="store_false",
                        help="constant background (no hue time code)")
    args = parser.parse_args(argv)
    if args.num_train < 0 or args.num_test < 0:
        parser.error("--num-train and --num-test must be >= 0")
    result = generate_demo(args.out, args.num_train, args.num_test, args.seed, args.min_duration, args.max_duration,
                           time_code=args.time_code)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
