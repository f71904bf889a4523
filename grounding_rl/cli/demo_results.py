"""``grounding-rl demo-results``: record one ``scripts/demo.sh`` run's table, settings and digests in the demo results
file (:mod:`grounding_rl.dev.demo_results`; ``docs/demo_results.json``, which the README's demo tables must equal).

    grounding-rl demo-results --out FILE --family F --seed S --lock LOCK [--setting KEY=VALUE ...]
                              [--digest NAME=PATH ...] NAME=EVAL_DIR [NAME=EVAL_DIR ...]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grounding_rl.errors import UserError


def main(argv: list[str] | None = None) -> int:
    from grounding_rl.dev.demo_results import record, row_of, run_versions, tree_sha256
    from grounding_rl.family import families

    parser = argparse.ArgumentParser(prog="grounding-rl demo-results",
                                     description="Record one demo run's table in the demo results file.")
    parser.add_argument("runs", nargs="+", help="NAME=PATH (an evaluation folder or its metrics.json), in table order")
    parser.add_argument("--out", required=True, help="the results file (docs/demo_results.json)")
    parser.add_argument("--family", required=True, choices=[f.name for f in families()])
    parser.add_argument("--seed", required=True, type=int)
    parser.add_argument("--lock", required=True, help="the lock file of the environment the demo ran in")
    parser.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the run (configs, template, extra arguments); repeatable")
    parser.add_argument("--digest", action="append", default=[], metavar="NAME=PATH",
                        help="record the SHA-256 of a stage's output file or folder; repeatable")
    args = parser.parse_args(argv)
    try:
        rows = {}
        for spec in args.runs:
            name, sep, path = spec.partition("=")
            if not sep:
                raise ValueError(f"expected NAME=PATH, got {spec!r}")
            path = Path(path) / "metrics.json" if Path(path).is_dir() else Path(path)
            rows[name] = row_of(json.loads(path.read_text(encoding="utf-8")))
        settings = {**dict(s.partition("=")[::2] for s in args.setting), "versions": run_versions()}
        digests = {name: tree_sha256(path) for name, _, path in (d.partition("=") for d in args.digest)}
        entry = {"family": args.family, "seed": args.seed, "rows": rows, "settings": settings, "sha256": digests,
                 "lock_sha256": tree_sha256(args.lock)}
        record(args.out, entry)
    except (OSError, ValueError) as err:  # a missing folder or lock, a metrics file that is not JSON
        raise UserError(str(err)) from None
    print(f"demo results: {args.out} ({args.family}, seed {args.seed})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
