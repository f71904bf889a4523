"""``grounding-rl compare``: one table of several runs' metrics, e.g. baseline vs SFT vs GRPO.

    grounding-rl compare NAME=PATH [NAME=PATH ...] [--json-key metric ...]

PATH is a ``metrics.json`` or an evaluation folder holding one. Prints a markdown table of R1@0.3/0.5/0.7, mIoU and
format rate, one row per run; with ``--json-key`` a last line of JSON ``{"<name>_<key>": value}`` follows.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from grounding_rl.errors import UserError

COLUMNS = ("R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "format_rate", "n")


def load_metrics(path: str | Path) -> dict:
    """The metrics dict of a ``metrics.json`` file or of ``DIR/metrics.json``.

    Raises:
        FileNotFoundError: neither exists (names the path).
        ValueError: the file is not JSON (names the path).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics.json")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise ValueError(f"{path}: not a metrics.json ({err})") from None


def comparison_table(runs: dict[str, dict]) -> str:
    """Markdown table: one row per run, the columns of :data:`COLUMNS` (percent, 2 decimals; missing → -)."""

    def cell(value):
        if value is None:
            return "-"
        return f"{value:.2f}" if isinstance(value, float) else str(value)

    lines = ["| run | " + " | ".join(COLUMNS) + " |", "|---|" + "|".join("---:" for _ in COLUMNS) + "|"]
    lines += [f"| {name} | " + " | ".join(cell(m.get(c)) for c in COLUMNS) + " |" for name, m in runs.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grounding-rl compare", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="NAME=PATH (metrics.json or a folder holding one)")
    parser.add_argument("--json-key", action="append", default=[], metavar="NAME:METRIC",
                        help="add NAME_METRIC to the last JSON line (e.g. grpo:mIoU); repeatable")
    args = parser.parse_args(argv)
    runs = {}
    try:
        for spec in args.runs:
            name, sep, path = spec.partition("=")
            if not sep:
                raise ValueError(f"expected NAME=PATH, got {spec!r}")
            runs[name] = load_metrics(path)
    except (OSError, ValueError) as err:  # a missing path, a file that is not JSON, a run not written NAME=PATH
        raise UserError(str(err)) from None
    print(comparison_table(runs))
    if args.json_key:
        summary = {}
        for key in args.json_key:
            name, _, metric = key.partition(":")
            summary[f"{name}_{metric}"] = runs.get(name, {}).get(metric)
        print(json.dumps(summary))
    return 0
