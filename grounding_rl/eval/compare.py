"""One table of several runs' metrics, e.g. baseline vs SFT vs GRPO (``grounding-rl compare``).

    grounding-rl compare NAME=PATH [NAME=PATH ...] [--json-key metric ...] [--scoring NAME|all ...]

PATH is a ``metrics.json`` or an evaluation folder holding one. Prints a markdown table of R1@0.3/0.5/0.7, mIoU and
format rate, one row per run (the headline scoring, ``standard``); with ``--scoring`` one row per run and scoring,
each with its own n — a scoring the ``metrics.json`` lacks is computed from the ``predictions.jsonl`` beside it
(:func:`with_scorings`), without running the model. With ``--json-key`` a last line of JSON
``{"<name>_<key>": value}`` follows.
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
    records, _ = read_predictions(folder / PREDICTIONS)
    if not records:
        missing = [n for n in names if n not in have]
        raise ValueError(f"{folder}: metrics.json has no scoring {', '.join(missing)} and there is no "
                         f"{PREDICTIONS} to compute it from")
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
