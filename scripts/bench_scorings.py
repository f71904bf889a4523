"""The two scorings and TimeZero's published formula on Charades-STA test, with synthetic predictions.

    python scripts/bench_scorings.py [--benchmarks ../shared/data/benchmarks] [--sigma 2.0] [--seed 0]

Predictions: each annotated end ± N(0, sigma) seconds, ordered, start ≥ 0, one decimal; once as they come (some end
past the video) and once clamped inside the video. Prints R1@0.3/0.5/0.7 and mIoU under ``standard``, ``clamped`` and
the formula of www-Ye/TimeZero ``evaluate.py`` (hull union, ``thresh <= iou``), and how many exact ties (IoU = m in
exact arithmetic, as ``standard`` computes it) that formula loses to float error. The numbers are in evaluation/README.md.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from grounding_rl.data.readers import read_annotations
from grounding_rl.data.samples import validate
from grounding_rl.reward.metrics import THRESHOLDS, compute_metrics, exact_time, standard_iou


def timezero_iou(pred, gt) -> float:
    """www-Ye/TimeZero evaluate.py: (min(ends) − max(starts)).clip(0) / (max(ends) − min(starts))."""
    (s, e), (gs, ge) = pred, gt
    return max(min(e, ge) - max(s, gs), 0.0) / (max(e, ge) - min(s, gs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmarks", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" /
                        "data" / "benchmarks")
    parser.add_argument("--sigma", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    folder = args.benchmarks / "charades_sta"
    raw = list(read_annotations("charades_sta", folder / "charades_sta_test.txt", durations=folder / "charades.json"))
    kept, counts = validate(raw, log_limit=0)
    print(f"{len(raw)} queries: {counts}")
    rng = np.random.default_rng(args.seed)
    for name, inside in (("may end past the video", False), ("inside the video", True)):
        records, published, exact = [], [], []
        for sample in kept:
            s = sample.raw_start + rng.normal(0, args.sigma)
            e = sample.raw_end + rng.normal(0, args.sigma)
            s, e = round(max(0.0, min(s, e)), 1), round(max(s, e), 1)
            if inside:
                s, e = min(s, sample.duration), min(e, sample.duration)
            if e <= s:
                e = s + 0.1
            records.append({"start": sample.start, "end": sample.end, "raw_start": sample.raw_start,
                            "raw_end": sample.raw_end, "duration": sample.duration, "pred_start": s, "pred_end": e})
            published.append(timezero_iou((s, e), (sample.raw_start, sample.raw_end)))
            exact.append(standard_iou((s, e), (sample.raw_start, sample.raw_end)))
        published = np.array(published)
        rows = {"standard": compute_metrics(records, "standard"), "clamped": compute_metrics(records, "clamped"),
                "TimeZero's formula": {**{f"R1@{m}": 100 * float(np.mean(published >= m)) for m in THRESHOLDS},
                                       "mIoU": 100 * float(published.mean())}}
        print(f"predictions {name}:")
        for label, m in rows.items():
            print(f"  {label:20s}" + " ".join(f"{k} {m[k]:6.2f}" for k in ("R1@0.3", "R1@0.5", "R1@0.7", "mIoU")))
        lost = {m: int(sum(p < m and x >= exact_time(m) for p, x in zip(published, exact))) for m in THRESHOLDS}
        print(f"  exact ties TimeZero's formula loses: {lost}")


if __name__ == "__main__":
    main()
