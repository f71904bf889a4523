"""``grounding-rl score``: metrics of a predictions file against canonical annotations (:mod:`grounding_rl.eval.score`).

    grounding-rl score --predictions PRED.jsonl --annotations GT.jsonl [--out metrics.json] [--prompt-template NAME]
                       [--scoring NAME|all ...]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from grounding_rl.cli.eval import add_scoring_flag
    from grounding_rl.eval.score import score
    from grounding_rl.prompts.templates import PROMPT_TEMPLATES
    from grounding_rl.reward.metrics import scoring_table

    parser = argparse.ArgumentParser(
        prog="grounding-rl score", description="Score predictions against annotations (R1@m, mIoU)."
    )
    parser.add_argument("--predictions", type=Path, required=True, help="JSONL: qid plus answer and/or start/end")
    parser.add_argument("--annotations", type=Path, required=True, help="canonical JSONL of the queries")
    parser.add_argument("--out", type=Path, default=None, help="write the metrics as JSON here")
    parser.add_argument("--prompt-template", default="default", choices=sorted(PROMPT_TEMPLATES),
                        help="the template the predictions were made with (its answer format sets the format rate)")
    add_scoring_flag(parser)
    args = parser.parse_args(argv)
    metrics = score(args.predictions, args.annotations, args.prompt_template, args.scoring)
    print(scoring_table(metrics))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
