"""Benchmark of frame sampling: our sampler cold, from the cache, and qwen-vl-utils.

    python scripts/bench_video.py [--videos DIR] [--repeats 5]
    python scripts/bench_video.py --memory [--long-clip PATH] [--mem-cap-gb 16]
    python scripts/bench_video.py --long [--long-clip PATH] [--mem-cap-gb 16]

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

``--memory``: peak memory of sampling one long, large clip — a generated 5-minute 1920x1080 30 fps h264 clip (written
once to ``--long-clip``, default in the temp folder) at TimeZero's budget (fps 2, total_pixels 3584·28·28, min_pixels
16·28·28) — with our sampler (decoding and resizing ``CHUNK_FRAMES`` source frames at a time) and with
``qwen_vl_utils.fetch_video`` (decord backend), each in its own subprocess whose address space is capped at
``--mem-cap-gb`` (``RLIMIT_AS``), so an out-of-memory is reported as such instead of taking the machine down. Peak =
the child's ``ru_maxrss``; the same child's RSS after its imports is reported too. Last line:
``{"peak_mem_ours_mib": a, "peak_mem_qwen_vl_utils_mib": b | "out of memory at N GB", "ours_vs_qwen_vl_utils": a/b}``.

``--long``: an hour in bounded memory — a generated one-hour 1280x720 clip at 8 fps with a long GOP (a key frame
every 30 s; written once to ``--long-clip``, default in the temp folder, in a few minutes) sampled at TimeLens2's budget
(2 fps, at most 512 frames, 16,384 tokens of 32x32 pixels a clip, 1 token a frame at least: Qwen3-VL) by our sampler
(decord's ``get_batch``, which seeks to the key frame before a frame it has not reached instead of decoding every
frame), by our PyAV fallback (which decodes every frame in order) and by ``qwen_vl_utils.fetch_video`` (its decord
backend: one ``get_batch`` of all frames at source size, which seeks the same way), each in its own subprocess under
the same ``--mem-cap-gb`` address-space cap (``RLIMIT_AS``; an out-of-memory is reported as such). Peak = the child's
``ru_maxrss``; seconds = the sampling call alone (imports and start-up not counted). Last line:
``{"peak_mem_ours_mib", "seconds_ours", "peak_mem_fetch_video_mib", "seconds_fetch_video", "peak_mem_ours_pyav_mib",
"seconds_ours_pyav", ...}`` (an out-of-memory or error in place of the numbers).

Record results in docs/BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
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
from grounding_rl.dev.demo_results import cpu_name as cpu_model  # noqa: E402
from grounding_rl.paths import shared_dir  # noqa: E402

SETTINGS = V.VideoSettings(fps=2.0, max_pixels=448 * 448)  # min_pixels: qwen-vl-utils' default; total_pixels off


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def methods(path: Path, cache: FrameCache) -> dict:
    """The four timed callables for one clip."""
    ele = {"video": str(path), "fps": SETTINGS.fps, "max_pixels": SETTINGS.max_pixels}
    return {
        "qwen": lambda: qwen.fetch_video(ele),
        "cold": lambda: V.sample_frames(path, SETTINGS),
        "cached": lambda: V.sample_frames(path, SETTINGS, cache=cache),
        "decode": lambda: decode_only(path),
    }


def decode_only(path: Path):
    """Our decord call for the sampled frames, uint8 at source size, no resize: the limit for ``cold``."""
    import decord

    reader = decord.VideoReader(str(path), num_threads=V.decode_threads())
    indices, _ = V.sample_indices(len(reader), float(reader.get_avg_fps()), SETTINGS)
    return reader.get_batch(indices).asnumpy()


# ------------------------------------------------------------------------------------------------------ memory
LONG_SECONDS, LONG_FPS, LONG_SIZE = 300, 30, (1920, 1080)
TIMEZERO = V.VideoSettings(fps=2.0, min_pixels=16 * 28 * 28, total_pixels=3584 * 28 * 28)


def make_long_clip(path: Path) -> Path:
    """Write the 5-minute 1080p test clip (moving colour bars and a frame counter pattern) unless it exists."""
    import av
    import numpy as np

    if path.is_file() and path.stat().st_size > 0:
        return path
    width, height = LONG_SIZE
    tmp = path.with_suffix(".part.mp4")
    with av.open(str(tmp), "w") as container:
        stream = container.add_stream("libx264", rate=LONG_FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "30"}
        x = np.arange(width, dtype=np.int32)
        for i in range(LONG_SECONDS * LONG_FPS):
            row = np.stack([(x + 7 * i) % 256, (2 * x + 3 * i) % 256, (x // 4 + i) % 256], axis=-1).astype(np.uint8)
            frame = np.broadcast_to(row, (height, width, 3))
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    tmp.rename(path)
    return path


def memory_child(method: str, clip: Path) -> None:
    """Sample ``clip`` once with ``method``; print peak RSS (and RSS after imports) in MiB as one JSON line."""
    import resource

    after_imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if method == "ours":
        frames = V.sample_frames(clip, TIMEZERO).frames
        shape = list(frames.shape)
    else:
        frames = qwen.fetch_video({"video": str(clip), "fps": TIMEZERO.fps, "min_pixels": TIMEZERO.min_pixels,
                                   "total_pixels": TIMEZERO.total_pixels})
        frames = frames[0] if isinstance(frames, tuple) else frames
        shape = list(frames.shape)
    print(json.dumps({"method": method, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "after_imports_mib": after_imports, "shape": shape}))


# ------------------------------------------------------------------------------------------------- an hour (--long)
HOUR_SECONDS, HOUR_FPS, HOUR_SIZE, HOUR_GOP = 3600, 8, (1280, 720), 240
# TimeLens2's budget (grpo/timelens/data/video.py, grpo/scripts/train.sh): 16,384 tokens of 32x32 px, min_tokens 1,
# 2 fps, at most 512 frames; per-frame ceiling qwen-vl-utils' for patch 16 (768 tokens).
HOUR_SETTINGS = V.VideoSettings(fps=2.0, max_frames=512, total_tokens=16384, min_tokens=1, max_pixels=768 * 32 * 32,
                                pixel_factor=32)


def make_hour_clip(path: Path) -> Path:
    """Write the one-hour 720p 8 fps clip (a luma gradient drifting 7 px a frame over fixed colours, a key frame every
    ``HOUR_GOP`` frames) unless a non-empty file is there already. Frames are made in YUV 4:2:0 directly (no colour
    conversion per frame); x264 ``ultrafast`` writes it in about 4 minutes on 2 busy cores (about 0.8 GB)."""
    import av
    import numpy as np

    if path.is_file() and path.stat().st_size > 0:
        return path
    width, height = HOUR_SIZE
    tmp = path.with_suffix(".part.mp4")
    luma = (np.add.outer(np.arange(height) // 3, np.arange(2 * width) // 5) % 220 + 16).astype(np.uint8)
    chroma = (np.add.outer(np.arange(height // 2), np.arange(width // 2)) % 200 + 28).astype(np.uint8)
    total = HOUR_SECONDS * HOUR_FPS
    with av.open(str(tmp), "w") as container:
        stream = container.add_stream("libx264", rate=HOUR_FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "32", "g": str(HOUR_GOP), "keyint_min": str(HOUR_GOP),
                          "sc_threshold": "0"}
        for i in range(total):
            shift = (7 * i) % width
            plane = np.concatenate([luma[:, shift:shift + width], chroma, chroma[::-1]], axis=None)
            frame = av.VideoFrame.from_ndarray(plane.reshape(height * 3 // 2, width), format="yuv420p")
            for packet in stream.encode(frame):
                container.mux(packet)
            if i % (600 * HOUR_FPS) == 0:
                print(f"# writing {path.name}: {i / HOUR_FPS / 60:.0f} of {HOUR_SECONDS // 60} min", flush=True)
        for packet in stream.encode():
            container.mux(packet)
    tmp.rename(path)
    return path


def hour_child(method: str, clip: Path) -> None:
    """Sample the hour with ``method`` (``ours``, ``ours_pyav``, ``fetch_video``); print one JSON line: peak RSS and
    RSS after imports (MiB), seconds of the sampling call, the frames' shape and the decoder."""
    import resource

    after_imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    if method in ("ours", "ours_pyav"):
        if method == "ours_pyav":
            def no_decord(*args, **kwargs):
                raise RuntimeError("decord switched off for this measurement")

            V._decode_decord = no_decord
        video = V.sample_frames(clip, HOUR_SETTINGS)
        shape, backend = list(video.frames.shape), video.backend
    else:
        frames = qwen.fetch_video({"video": str(clip), "fps": HOUR_SETTINGS.fps, "max_frames": HOUR_SETTINGS.max_frames,
                                   "min_pixels": HOUR_SETTINGS.floor_pixels,
                                   "total_pixels": HOUR_SETTINGS.budget_pixels}, image_patch_size=16)
        shape, backend = list(frames.shape), "qwen_vl_utils/decord"
    seconds = time.perf_counter() - start
    print(json.dumps({"method": method, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "after_imports_mib": after_imports, "seconds": seconds, "shape": shape, "backend": backend}))


def run_hour(clip: Path, cap_gb: float, methods: tuple[str, ...], timeout: float) -> dict:
    """Each method in a subprocess under the address-space cap (and a wall-clock ``timeout``)."""
    out = {}
    for method in methods:
        out[method] = _capped_child(["--hour-child", method, "--long-clip", str(clip)], method, cap_gb, timeout)
    return out


def _capped_child(argv: list[str], method: str, cap_gb: float, timeout: float | None = None) -> dict:
    """Run this script with ``argv`` in a child capped at ``cap_gb`` of address space; its last JSON line, or
    ``{"method", "error"}`` ("out of memory at N GB" when the cap was hit)."""
    import resource
    import subprocess

    def cap():
        limit = int(cap_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    try:
        proc = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, preexec_fn=cap,
                              check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"method": method, "error": f"over the {timeout:g} s limit"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    tail = (proc.stderr.strip().splitlines() or ["killed"])[-1]
    oom = "MemoryError" in proc.stderr or "memory" in proc.stderr.lower() or "bad_alloc" in proc.stderr
    return {"method": method, "error": f"out of memory at {cap_gb:g} GB" if oom or proc.returncode < 0
            else tail[:200]}


def run_memory(clip: Path, cap_gb: float) -> dict:
    """Both methods, each in a subprocess with an address-space cap; ``"out of memory"`` when the cap is hit."""
    return {method: _capped_child(["--memory-child", method, "--long-clip", str(clip)], method, cap_gb)
            for method in ("ours", "qwen")}


def main_long(args) -> int:
    """``--long``: write (or reuse) the hour, run each method capped, print a table and the JSON line."""
    clip = args.long_clip
    if clip == DEFAULT_LONG_CLIP:
        clip = Path(tempfile.gettempdir()) / "bench_video_1h_720p_8fps.mp4"
    start = time.perf_counter()
    clip = make_hour_clip(clip)
    written = time.perf_counter() - start
    import subprocess

    commit = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}  commit {commit}  {cpu_model()}  nproc={os.cpu_count()}  "
          f"load={' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"# clip {clip} ({clip.stat().st_size / 2**20:.0f} MiB, {HOUR_SECONDS} s {HOUR_SIZE[0]}x{HOUR_SIZE[1]} "
          f"{HOUR_FPS} fps, key frame every {HOUR_GOP} frames; ready in {written:.0f} s)")
    v = HOUR_SETTINGS
    print(f"# settings: fps {v.fps}, max_frames {v.max_frames}, {v.total_tokens} tokens = {v.budget_pixels} px a clip, "
          f"{v.min_tokens} token = {v.floor_pixels} px a frame at least, max_pixels {v.max_pixels}, factor "
          f"{v.pixel_factor}; CHUNK_FRAMES={V.CHUNK_FRAMES}; cap {args.mem_cap_gb:g} GB")
    result = run_hour(clip, args.mem_cap_gb, tuple(args.long_methods), args.child_timeout)
    for method, r in result.items():
        print(f"{method:12} " + (f"peak {r['peak_mib']:.0f} MiB (after imports {r['after_imports_mib']:.0f} MiB), "
                                 f"{r['seconds']:.1f} s, frames {r['shape']} ({r['backend']})" if "peak_mib" in r
                                 else r["error"]))
    print(f"# load after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; whole run "
          f"{time.perf_counter() - start:.0f} s")
    line = {}
    for method, key in (("ours", "ours"), ("fetch_video", "fetch_video"), ("ours_pyav", "ours_pyav")):
        r = result.get(method)
        if r is None:
            continue
        line[f"peak_mem_{key}_mib"] = round(r["peak_mib"]) if "peak_mib" in r else r["error"]
        line[f"seconds_{key}"] = round(r["seconds"], 2) if "seconds" in r else r["error"]
    print(json.dumps(line))
    return 0


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


DEFAULT_LONG_CLIP = Path(tempfile.gettempdir()) / "bench_video_5min_1080p.mp4"  # --memory's; --long has its own


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=Path, default=None, help="folder of clips (default ../shared/data/videos)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per clip (median reported)")
    parser.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--memory", action="store_true", help="peak memory on a generated 5-minute 1080p clip")
    parser.add_argument("--long-clip", type=Path, default=DEFAULT_LONG_CLIP,
                        help="the generated clip (written once; default in the temp folder)")
    parser.add_argument("--mem-cap-gb", type=float, default=16.0, help="address-space cap of each memory child")
    parser.add_argument("--memory-child", choices=["ours", "qwen"], help=argparse.SUPPRESS)
    parser.add_argument("--long", action="store_true",
                        help="an hour of 720p at TimeLens2's budget: ours against fetch_video under the memory cap")
    parser.add_argument("--long-methods", nargs="+", default=["ours", "fetch_video", "ours_pyav"],
                        choices=["ours", "fetch_video", "ours_pyav"], help=argparse.SUPPRESS)
    parser.add_argument("--child-timeout", type=float, default=240.0, help="--long: seconds allowed each method")
    parser.add_argument("--hour-child", choices=["ours", "ours_pyav", "fetch_video"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    if args.memory_child or args.hour_child:
        qwen.get_video_reader_backend = lambda: "decord"
        if args.hour_child:
            hour_child(args.hour_child, args.long_clip)
        else:
            memory_child(args.memory_child, args.long_clip)
        return 0
    if args.long:
        return main_long(args)
    if args.memory:
        start = time.perf_counter()
        clip = make_long_clip(args.long_clip)
        print(f"# {time.strftime('%Y-%m-%d %H:%M')}  {cpu_model()}  clip {clip} ({clip.stat().st_size / 2**20:.0f} MiB, "
              f"{LONG_SECONDS} s {LONG_SIZE[0]}x{LONG_SIZE[1]} {LONG_FPS} fps; ready in {time.perf_counter() - start:.0f} s)"
              f"  settings={TIMEZERO}  CHUNK_FRAMES={V.CHUNK_FRAMES}  cap={args.mem_cap_gb:g} GB")
        result = run_memory(clip, args.mem_cap_gb)
        for method, r in result.items():
            print(f"{method:5} " + (f"peak {r['peak_mib']:.0f} MiB (after imports {r['after_imports_mib']:.0f} MiB), "
                                     f"frames {r['shape']}" if "peak_mib" in r else r["error"]))
        ours, theirs = result["ours"].get("peak_mib"), result["qwen"].get("peak_mib")
        print(json.dumps({"peak_mem_ours_mib": round(ours) if ours else result["ours"]["error"],
                          "peak_mem_qwen_vl_utils_mib": round(theirs) if theirs else result["qwen"]["error"],
                          "ours_vs_qwen_vl_utils": round(ours / theirs, 3) if ours and theirs else None}))
        return 0

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
