"""One table of several runs' metrics, e.g. baseline vs SFT vs GRPO (``grounding-rl compare``).

    grounding-rl compare NAME=PATH [NAME=PATH ...] [--json-key metric ...]

PATH is a ``metrics.json`` or an evaluation folder holding one. Prints a markdown table of R1@0.3/0.5/0.7, mIoU and
format rate, one row per run; with ``--json-key`` a last line of JSON ``{"<name>_<key>": value}`` follows.
"""
from __future__ import annotations

import json
from pathlib import Path

COLUMNS = ("R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "format_rate", "n")
# Columns of interval-set runs (temporal precision and recall), shown when any run has them: a single-span run gets -.
SET_COLUMNS = ("precision", "recall")


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
    """Markdown table: one row per run, the columns of :data:`COLUMNS` (percent, 2 decimals; missing → -), then
    :data:`SET_COLUMNS` when any run is an interval-set run (so single- and multi-span runs compare side by side)."""

    def cell(value):
        if value is None:
            return "-"
        return f"{value:.2f}" if isinstance(value, float) else str(value)

    columns = COLUMNS + tuple(c for c in SET_COLUMNS if any(c in m for m in runs.values()))
    lines = ["| run | " + " | ".join(columns) + " |", "|---|" + "|".join("---:" for _ in columns) + "|"]
    lines += [f"| {name} | " + " | ".join(cell(m.get(c)) for c in columns) + " |" for name, m in runs.items()]
    return "\n".join(lines)
