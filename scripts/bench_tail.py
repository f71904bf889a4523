"""The unsampled tail: how often a benchmark's ground truth ends where the default frame times never look.

    python scripts/bench_tail.py [--benchmarks DIR] [--fps 1 2 4]

By default T = floor2(duration · fps) frames sit at k / fps (:func:`grounding_rl.data.video.sampling_plan`), so the
last sampled frame is at (T − 1) / f and the end of its frame period at T / f, up to about three periods before the
clip's end. Per benchmark and fps this prints the share of queries whose ground-truth end (clamped into the video, as
validation keeps it) falls after T / f and after (T − 1) / f, and the mean depth of those ends past that point, in
seconds; then the same with ``cover_tail`` (f = T / duration). Computed from the annotation durations alone, no video
is read; min_frames 4 and max_frames 768 (the defaults) apply, so ActivityNet's long videos at 4 fps are stretched to
768 frames. The last line is JSON. The figures are in docs/BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from grounding_rl.data.readers import read_annotations
from grounding_rl.data.samples import Sample, validate
from grounding_rl.data.video import VideoSettings, sampling_plan
from grounding_rl.paths import data_root

BENCHMARKS = {  # name: (format, annotation file, durations file) under the benchmarks folder
    "charades_sta_test": ("charades_sta", "charades_sta/charades_sta_test.txt", "charades_sta/charades.json"),
    "activitynet_val2": ("activitynet", "activitynet_captions/val_2.json", None),
}


def tail_figures(samples: list[Sample], settings: VideoSettings) -> dict:
    """Where the samples' ground-truth ends fall against the sampled times of their clips.

    Returns:
        ``{"queries": n, "after_period_pct", "after_period_depth_s", "after_last_frame_pct",
        "after_last_frame_depth_s"}``: the share (percent) of samples with ``end`` > T / f (the end of the last sampled
        frame's period) and with ``end`` > (T − 1) / f (the last sampled frame), and the mean of ``end`` minus that
        time over those samples (0.0 when there are none); (T, f) from :func:`sampling_plan` of each duration.
    """
    plans: dict[float, tuple[int, float]] = {}
    after = {"period": [], "last_frame": []}
    for sample in samples:
        if sample.duration not in plans:
            plans[sample.duration] = sampling_plan(settings, sample.duration)
        frames, f = plans[sample.duration]
        for key, at in (("period", frames / f), ("last_frame", (frames - 1) / f)):
            if sample.end > at + 1e-9:
                after[key].append(sample.end - at)
    n = len(samples)
    out: dict = {"queries": n}
    for key, depths in after.items():
        out[f"after_{key}_pct"] = 100.0 * len(depths) / n if n else 0.0
        out[f"after_{key}_depth_s"] = sum(depths) / len(depths) if depths else 0.0
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmarks", type=Path, default=None,
                        help="folder of the annotation files (default: $GROUNDING_RL_DATA, else ../shared's)")
    parser.add_argument("--fps", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    args = parser.parse_args(argv)
    args.benchmarks = args.benchmarks or data_root()
    if args.benchmarks is None:
        parser.error("no benchmarks folder: pass --benchmarks DIR")
    results = {}
    print(f"{'benchmark':18} {'fps':>4} {'rule':10} {'queries':>7} {'end > T/f':>10} {'depth s':>8} "
          f"{'end > (T-1)/f':>13} {'depth s':>8}")
    for name, (fmt, annotation_file, durations) in BENCHMARKS.items():
        samples, _ = validate(read_annotations(fmt, args.benchmarks / annotation_file,
                                               durations=args.benchmarks / durations if durations else None),
                              log_limit=0)
        for fps in args.fps:
            for rule, cover in (("default", False), ("cover_tail", True)):
                r = tail_figures(samples, replace(VideoSettings(fps=fps), cover_tail=cover))
                results[f"{name}@{fps:g}fps/{rule}"] = {k: round(v, 4) for k, v in r.items()}
                print(f"{name:18} {fps:4g} {rule:10} {r['queries']:7d} {r['after_period_pct']:9.2f}% "
                      f"{r['after_period_depth_s']:8.2f} {r['after_last_frame_pct']:12.2f}% "
                      f"{r['after_last_frame_depth_s']:8.2f}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
