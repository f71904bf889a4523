"""The trivial prior — always predict the training set's mean normalized interval (``grounding-rl baseline``).

For every test query of duration D it predicts ``(mean(s/D_train)·D, mean(e/D_train)·D)``. Any model worth training
must beat it; on datasets with a strong position bias (Charades-STA) it is surprisingly high.

    grounding-rl baseline --train TRAIN.jsonl --data TEST.jsonl --out PRED.jsonl [--metrics metrics.json]
"""
from __future__ import annotations

from pathlib import Path

from grounding_rl.data.samples import load_samples


def mean_normalized_interval(train_file: str | Path) -> tuple[float, float]:
    """(mean start / duration, mean end / duration) over a canonical JSONL, after the validation policy.

    Raises:
        ValueError: the file has no sample with a positive duration.
    """
    pairs = [(s.start / s.duration, s.end / s.duration) for s in load_samples(train_file)]
    if not pairs:
        raise ValueError(f"{train_file}: no samples with a positive duration")
    return sum(p[0] for p in pairs) / len(pairs), sum(p[1] for p in pairs) / len(pairs)


def baseline_predictions(train_file: str | Path, data_file: str | Path) -> list[dict]:
    """One prediction line ``{"qid", "start", "end"}`` (seconds) per query of ``data_file``."""
    lo, hi = mean_normalized_interval(train_file)
    return [{"qid": s.qid, "start": round(lo * s.duration, 2), "end": round(hi * s.duration, 2)}
            for s in load_samples(data_file)]
