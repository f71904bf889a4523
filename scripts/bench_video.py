"""Benchmark of frame sampling: our sampler cold, from the cache, and qwen-vl-utils.

    python scripts/bench_video.py [--videos DIR] [--repeats 5]

On every clip in ../shared/data/videos, with the same settings for all methods (fps 2, max_pixels 448*448 per frame,
qwen-vl-utils' default min_pixels, no total budget):

- ``qwen``: ``qwen_vl_utils.fetch_video`` with its decord backend;
- ``cold``: :func:`grounding_rl.data.video.sample_frames` without a cache;
- ``cached``: the same through a :class:`grounding_rl.data.cache.FrameCache` hit (cache file in the page cache);
- ``decode``: decoding the needed frames only (our decord call with our thread count, uint8 at source size; no
  resize, no conversion), the limit for ``cold``.

Per clip: one untimed warm-up per method (it also fills the cache), then 5 rounds with the methods interleaved (the
order rotates each round, so no method always runs right after another); the median of each method is reported. Prints a table, then a last line of JSON with geometric means over the clips of
per-clip speed-ups: ``{"cold_vs_qwen_vl_utils": X, "cached_vs_cold": Y, "decode_only_vs_qwen_vl_utils": L}``.
Record results in docs/BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("FORCE_QWENVL_VIDEO_READER", "decord")  # read by qwen-vl-utils at import

import torch  # noqa: E402
import qwen_vl_utils.vision_process as qwen  # noqa: E402

from grounding_rl.data import video as V  # noqa: E402
from grounding_rl.data.cache import FrameCache  # noqa: E402
from grounding_rl.data.samples import VIDEO_EXTENSIONS  # noqa: E402
from grounding_rl.paths import shared_dir  # noqa: E402

SETTINGS = V.VideoSettings(fps=2.0, max_pixels=448 * 448)  # min_pixels: qwen-vl-utils' default; total_pixels off


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def methods(path: Path, cache: FrameCache) -> dict:
    """The four timed callables for one clip."""
    ele = {"video": str(path), "fps": SETTINGS.fps, "max_pixels": SETTINGS.max_pixels}
    return {
        "qwen": lambda: qwen.fetch_video(ele),
        "cold": lambda: V.sample_frames(path, SETTINGS),
        "cached": lambda: V.sample_frames(path, SETTINGS, cache=cache),
        "decode": lambda: V._decode_decord(str(path), SETTINGS, V.decode_threads()),
    }


def bench_clip(path: Path, cache: FrameCache, repeats: int) -> dict:
    """Median seconds per method on one clip (warm-up untimed, methods interleaved) and the output shape."""
    calls = methods(path, cache)
    shape = calls["cold"]().frames.shape  # warm-ups
    for name in ("qwen", "cached", "decode"):
        calls[name]()
    names = list(calls)
    times = {name: [] for name in names}
    for round_ in range(repeats):
        for name in names[round_ % len(names):] + names[: round_ % len(names)]:  # rotate: no method always follows another
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return {"shape": shape, **{name: statistics.median(ts) for name, ts in times.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=Path, default=None, help="folder of clips (default ../shared/data/videos)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per clip (median reported)")
    parser.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    videos = args.videos or ((shared_dir() or Path("../shared")) / "data" / "videos")
    clips = sorted(p for p in videos.iterdir() if p.suffix.lower() in VIDEO_EXTENSIONS) if videos.is_dir() else []
    if not clips:
        print(f"no video clips in {videos}", file=sys.stderr)
        return 1
    qwen.get_video_reader_backend = lambda: "decord"  # whatever else is installed (torchcodec), compare with decord
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')}  {cpu_model()}  nproc={os.cpu_count()}  torch threads="
        f"{torch.get_num_threads()}  decode threads={V.decode_threads()}  load={' '.join(f'{x:.2f}' for x in os.getloadavg())}  settings={SETTINGS}"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_video_cache_") as tmp:
        cache = FrameCache(tmp, max_bytes=4 * 2**30)
        for path in clips:
            rows.append((path.name, bench_clip(path, cache, args.repeats)))
    header = f"{'clip':40} {'T x H x W':>14} {'qwen ms':>8} {'cold ms':>8} {'cache ms':>8} {'decode ms':>9} " \
             f"{'cold/qwen':>9} {'cache/cold':>10} {'decode/qwen':>11}"
    print(header)
    print("-" * len(header))
    x, y, lim = [], [], []
    for name, r in rows:
        x.append(r["qwen"] / r["cold"])
        y.append(r["cold"] / r["cached"])
        lim.append(r["qwen"] / r["decode"])
        t, h, w, _ = r["shape"]
        print(f"{name:40} {f'{t}x{h}x{w}':>14} {r['qwen'] * 1e3:8.1f} {r['cold'] * 1e3:8.1f} "
              f"{r['cached'] * 1e3:8.2f} {r['decode'] * 1e3:9.1f} {x[-1]:9.2f} {y[-1]:10.1f} {lim[-1]:11.2f}")
    print(f"# load after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(json.dumps({
        "cold_vs_qwen_vl_utils": round(geometric_mean(x), 2),
        "cached_vs_cold": round(geometric_mean(y), 1),
        "decode_only_vs_qwen_vl_utils": round(geometric_mean(lim), 2),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
