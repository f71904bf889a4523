"""``grounding-rl compare``: one table of several runs' metrics, e.g. baseline vs SFT vs GRPO
(:mod:`grounding_rl.eval.compare`).

    grounding-rl compare NAME=PATH [NAME=PATH ...] [--json-key NAME:METRIC ...] [--scoring NAME|all ...]
"""
from __future__ import annotations

import argparse
import json
import sys

from grounding_rl.errors import UserError


def main(argv: list[str] | None = None) -> int:
    from grounding_rl.cli.eval import add_scoring_flag
    from grounding_rl.eval.compare import check_same_data, comparison_table, data_of, load_metrics, with_scorings

    parser = argparse.ArgumentParser(prog="grounding-rl compare", description="One table of several runs' metrics.")
    parser.add_argument("runs", nargs="+", help="NAME=PATH (metrics.json or a folder holding one); each NAME once, "
                                                "every run evaluated on the same data file")
    parser.add_argument("--json-key", action="append", default=[], metavar="NAME:METRIC",
                        help="add NAME_METRIC to the last JSON line (e.g. grpo:mIoU); repeatable")
    add_scoring_flag(parser)
    args = parser.parse_args(argv)
    names = [spec.partition("=")[0] for spec in args.runs if "=" in spec]
    twice = next((name for i, name in enumerate(names) if name in names[:i]), None)
    if twice is not None:  # a dict keyed by name would keep one of the two runs without a word
        raise UserError(f"run name {twice!r} is given twice; give each NAME=PATH a name of its own")
    runs, data = {}, {}
    try:
        for spec in args.runs:
            name, sep, path = spec.partition("=")
            if not sep:
                raise ValueError(f"expected NAME=PATH, got {spec!r}")
            runs[name] = load_metrics(path)
            data[name] = data_of(path, runs[name])
            if args.scoring:
                runs[name] = with_scorings(path, runs[name], args.scoring)
    except (OSError, ValueError) as err:  # a missing path, a file that is not JSON, a run not written NAME=PATH
        raise UserError(str(err)) from None
    check_same_data(data)
    summary = {}
    for key in args.json_key:  # checked before anything is printed: a wrong key would be a silent null
        name, sep, metric = key.partition(":")
        if not sep or not metric or name not in runs:
            raise UserError(f"--json-key {key!r}: expected NAME:METRIC with NAME one of {', '.join(runs)} (e.g. "
                            f"{next(iter(runs))}:mIoU)")
        if metric not in runs[name]:
            raise UserError(f"--json-key {key!r}: run {name!r} has no metric {metric!r} (its metrics: "
                            f"{', '.join(k for k, v in runs[name].items() if not isinstance(v, (dict, list)))})")
        summary[f"{name}_{metric}"] = runs[name][metric]
    print(comparison_table(runs, args.scoring))
    if args.json_key:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
