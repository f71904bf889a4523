"""The registry of named scorings (a plain dict by name) and what the evaluators' scorings share."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

THRESHOLDS = (0.3, 0.5, 0.7)


@dataclass(frozen=True)
class Scoring:
    """A named scoring: ``score(records) -> metrics`` (see the module), and ``source``: the repository @ commit and
    file it follows, in words (recorded in ``metrics.json``)."""

    name: str
    source: str
    score: Callable[[Sequence[Mapping]], dict]


REGISTRY: dict[str, Scoring] = {}


def register(scoring: Scoring) -> Scoring:
    """Add ``scoring`` under its name (ValueError when the name is taken); returns it."""
    if scoring.name in REGISTRY:
        raise ValueError(f"scoring {scoring.name!r} is already registered")
    REGISTRY[scoring.name] = scoring
    return scoring


def get_scoring(name: str) -> Scoring:
    """The registered scoring ``name``; ValueError naming the known ones otherwise."""
    if name not in REGISTRY:
        raise ValueError(f"unknown scoring {name!r}; known: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def annotation(record: Mapping) -> tuple[float, float]:
    """The annotation as written: ``(raw_start, raw_end)``, else ``(start, end)``."""
    start = record.get("raw_start") if record.get("raw_start") is not None else record["start"]
    end = record.get("raw_end") if record.get("raw_end") is not None else record["end"]
    return float(start), float(end)


def key(record: Mapping, span) -> str:
    """The ``video>>>query>>>span`` key under which TimeLens and lmms-eval store a prediction (``span`` written by
    ``str``): two queries with the same key are one entry, the later prediction kept at the earlier's place."""
    return f"{record.get('video')}>>>{record.get('query')}>>>{span}"

