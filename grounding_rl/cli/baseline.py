"""``grounding-rl baseline``: the trivial prior — always predict the training set's mean normalized interval
(:mod:`grounding_rl.eval.baseline`).

    grounding-rl baseline --train TRAIN.jsonl --data TEST.jsonl --out PRED.jsonl [--metrics metrics.json]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grounding_rl.errors import UserError
from grounding_rl.jsonl_files import write_jsonl_atomic


def main(argv: list[str] | None = None) -> int:
    from grounding_rl.eval.baseline import baseline_predictions

    parser = argparse.ArgumentParser(prog="grounding-rl baseline",
                                     description="Predict the training set's mean normalized interval (a prior).")
    parser.add_argument("--train", required=True, help="canonical JSONL whose mean normalized interval is used")
    parser.add_argument("--data", required=True, help="canonical JSONL to predict for")
    parser.add_argument("--out", required=True, type=Path, help="predictions JSONL (qid, start, end)")
    parser.add_argument("--metrics", type=Path, help="also score against --data and write metrics JSON here")
    args = parser.parse_args(argv)
    try:
        predictions = baseline_predictions(args.train, args.data)
    except ValueError as err:  # a file without a usable sample; a missing file is an OSError naming it
        raise UserError(str(err)) from None
    write_jsonl_atomic(args.out, predictions)
    if args.metrics is not None:
        from grounding_rl.cli.score import main as score_main

        return score_main(["--predictions", str(args.out), "--annotations", str(args.data), "--out",
                           str(args.metrics)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
