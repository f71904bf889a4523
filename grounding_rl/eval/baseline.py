"""``grounding-rl baseline``: the trivial prior — always predict the training set's mean normalized interval.

For every test query of duration D it predicts ``(mean(s/D_train)·D, mean(e/D_train)·D)``. Any model worth training
must beat it; on datasets with a strong position bias (Charades-STA) it is surprisingly high.

    grounding-rl baseline --train TRAIN.jsonl --data TEST.jsonl --out PRED.jsonl [--metrics metrics.json]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from grounding_rl.data.samples import read_jsonl, validate
from grounding_rl.errors import UserError


def mean_normalized_interval(train_file: str | Path) -> tuple[float, float]:
    """(mean start / duration, mean end / duration) over a canonical JSONL, after the validation policy.

    Raises:
        ValueError: the file has no sample with a positive duration.
    """
    pairs = [(s.start / s.duration, s.end / s.duration) for s in validate(read_jsonl(train_file))[0]]
    if not pairs:
        raise ValueError(f"{train_file}: no samples with a positive duration")
    return sum(p[0] for p in pairs) / len(pairs), sum(p[1] for p in pairs) / len(pairs)


def baseline_predictions(train_file: str | Path, data_file: str | Path) -> list[dict]:
    """One prediction line ``{"qid", "start", "end"}`` (seconds) per query of ``data_file``."""
    lo, hi = mean_normalized_interval(train_file)
    return [{"qid": s.qid, "start": round(lo * s.duration, 2), "end": round(hi * s.duration, 2)}
            for s in validate(read_jsonl(data_file))[0]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grounding-rl baseline", description=__doc__.splitlines()[0])
    parser.add_argument("--train", required=True, help="canonical JSONL whose mean normalized interval is used")
    parser.add_argument("--data", required=True, help="canonical JSONL to predict for")
    parser.add_argument("--out", required=True, type=Path, help="predictions JSONL (qid, start, end)")
    parser.add_argument("--metrics", type=Path, help="also score against --data and write metrics JSON here")
    args = parser.parse_args(argv)
    try:
        predictions = baseline_predictions(args.train, args.data)
    except ValueError as err:  # a file without a usable sample; a missing file is an OSError naming it
        raise UserError(str(err)) from None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(p) + "\n" for p in predictions), encoding="utf-8")
    if args.metrics is not None:
        from grounding_rl.eval.score import main as score_main

        return score_main(["--predictions", str(args.out), "--annotations", str(args.data), "--out",
                           str(args.metrics)])
    return 0
