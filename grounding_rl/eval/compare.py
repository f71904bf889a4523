"""One table of several runs' metrics, e.g. baseline vs SFT vs GRPO (``grounding-rl compare``).

    grounding-rl compare NAME=PATH [NAME=PATH ...] [--json-key metric ...] [--scoring NAME|all ...]

PATH is a ``metrics.json`` or an evaluation folder holding one. Prints a markdown table of R1@0.3/0.5/0.7, mIoU and
format rate, one row per run (the headline scoring, ``standard``); with ``--scoring`` one row per run and scoring,
each with its own n — a scoring the ``metrics.json`` lacks is computed from the ``predictions.jsonl`` beside it
(:func:`with_scorings`), without running the model. With ``--json-key`` a last line of JSON
``{"<name>_<key>": value}`` follows. Runs evaluated on different data files are refused (:func:`data_of`): one
table compares one test set.
"""
from __future__ import annotations

import json
from pathlib import Path

COLUMNS = ("R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "format_rate", "length_ratio", "n")
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


def data_of(path: str | Path, metrics: dict) -> tuple[str, str] | None:
    """``(data file, SHA-256 of its content)`` an evaluation ran on: from the ``eval_config.json`` beside the
    ``metrics.json`` at ``path`` (``data``, ``data_sha256``), else from ``metrics.json``'s own ``data`` and
    ``data_sha256`` (``score`` / ``baseline`` write them), else the ``data`` it names when that file is still here;
    None when none tells (metrics written before ``score`` recorded its data)."""
    from grounding_rl.run_record import file_sha256, read_record

    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    record = read_record(folder / "eval_config.json") or {}
    if record.get("data") and record.get("data_sha256"):
        return str(record["data"]), str(record["data_sha256"])
    data = metrics.get("data")
    if isinstance(data, str) and metrics.get("data_sha256"):
        return data, str(metrics["data_sha256"])
    if isinstance(data, str) and Path(data).is_file():
        return data, file_sha256(data)
    return None


def check_same_data(data: dict[str, tuple[str, str] | None]) -> None:
    """Refuse runs (name -> :func:`data_of`) evaluated on data files of different content (runs with None are not
    compared).

    Raises:
        UserError: one line naming two runs and their data files.
    """
    from grounding_rl.errors import UserError

    known = [(name, d) for name, d in data.items() if d is not None]
    for name, (file, sha) in known[1:]:
        first, (first_file, first_sha) = known[0]
        if sha != first_sha:
            same = " (the same path, its content changed)" if file == first_file else ""
            raise UserError(f"runs evaluated on different data: {first} on {first_file}, {name} on {file}{same}; "
                            "compare runs of one test set")


def with_scorings(path: str | Path, metrics: dict, scorings) -> dict:
    """``metrics`` (of the ``metrics.json`` at ``path``) with every scoring of ``scorings`` (names or ``all``, see
    :func:`grounding_rl.reward.metrics.scoring_names`) under ``by_scoring``: those it lacks are computed from the
    ``predictions.jsonl`` in the same folder (its prompt template and dropped annotations from ``metrics.json``).

    Raises:
        ValueError: an unknown scoring, or a scoring missing with no ``predictions.jsonl`` to compute it from.
    """
    from grounding_rl.eval.evaluate import PREDICTIONS, read_predictions
    from grounding_rl.reward.metrics import scoring_names
    from grounding_rl.reward.records import metrics_from_records

    names = scoring_names(scorings)
    have = metrics.get("by_scoring", {})
    if all(name in have for name in names):
        return metrics
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    given = Path(path) / "metrics.json" if Path(path).is_dir() else Path(path)
    records, _ = read_predictions(folder / PREDICTIONS)
    if not records:
        missing = [n for n in names if n not in have]
        raise ValueError(f"{given}: no scoring {', '.join(missing)} in it and no {folder / PREDICTIONS} to compute "
                         "it from")
    template = metrics.get("sampling", {}).get("prompt_template") or "default"
    fresh = metrics_from_records(records, template, metrics.get("dropped_annotations", 0), scorings)
    return {**metrics, "by_scoring": {**fresh["by_scoring"], **have}}


def comparison_table(runs: dict[str, dict], scorings=None) -> str:
    """Markdown table: one row per run, the columns of :data:`COLUMNS` (percent, 2 decimals, ``length_ratio`` a ratio;
    missing → -), then
    :data:`SET_COLUMNS` when any run is an interval-set run (so single- and multi-span runs compare side by side), from
    each run's top level (the headline scoring). With ``scorings`` (names or ``all``; runs prepared by
    :func:`with_scorings`): one row per run and scoring, from ``by_scoring``, each with its own n."""

    def cell(value):
        if value is None:
            return "-"
        return f"{value:.2f}" if isinstance(value, float) else str(value)

    if not scorings:
        columns = COLUMNS + tuple(c for c in SET_COLUMNS if any(c in m for m in runs.values()))
        lines = ["| run | " + " | ".join(columns) + " |", "|---|" + "|".join("---:" for _ in columns) + "|"]
        lines += [f"| {name} | " + " | ".join(cell(m.get(c)) for c in columns) + " |" for name, m in runs.items()]
        return "\n".join(lines)
    from grounding_rl.reward.metrics import HEADLINE_SCORING, scoring_names

    lines = ["| run | scoring | " + " | ".join(COLUMNS) + " |", "|---|---|" + "|".join("---:" for _ in COLUMNS) + "|"]
    for name, m in runs.items():
        for scoring in scoring_names(scorings):
            row = m.get("by_scoring", {}).get(scoring, {})
            label = scoring + (" (headline)" if scoring == HEADLINE_SCORING else "")
            lines.append(f"| {name} | {label} | " + " | ".join(cell(row.get(c)) for c in COLUMNS) + " |")
    return "\n".join(lines)
