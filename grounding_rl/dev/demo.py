"""Procedural clips with a known event interval, for the offline CPU demo and tests (a development tool; the command
is ``grounding-rl demo-data``, :mod:`grounding_rl.cli.demo_data`).

Each clip shows a few coloured shapes on a dark background. One of them — the *target*, named by the query ("the red
circle appears.") — is visible only from ``start`` to ``end``; the distractors (other colours) stay visible for the
whole clip. Everything is drawn in numpy, encoded with PyAV (MPEG-4 Part 2 in .mp4, 8 fps, 112x112) and described by
canonical JSONL splits ``train.jsonl`` / ``test.jsonl`` (``video`` relative to the output folder, ``source`` "demo").

The task is made for a tiny model and a tiny pixel budget: sampled at 2 fps and ``max_pixels = 56*56`` a clip costs
4 video tokens per second (one 2x2-merged 56x56 frame pair), and the target covers ~10-25 % of the frame area in a
colour no distractor has, so its presence is salient in every frame pair. Durations and event boundaries are whole
seconds: at 2 fps with Qwen2.5-VL's temporal patch of 2 frames, one video-token row covers exactly one second, so every
row either shows the target in both its frames or in neither (no row straddles a boundary).

*Time code* (on by default): the background colour turns one step round a hue circle every second (second ``k`` has
hue angle ``k * 30°`` around grey :data:`TIME_CODE_GREY`, chroma amplitude :data:`TIME_CODE_CHROMA`; the circle repeats
after 12 s), like a timestamp burned into the picture. Every video token then carries the second it shows in its
pixels, so a tiny randomly initialised model can read "when" from the tokens that show the target instead of having
to learn to decode 3D-RoPE position differences, which the demo's tiny model did not learn within its CPU budget
(docs/BENCHMARKS.md, "CPU demo"). A hue, not a brightness: the vision tower's RMSNorms keep only the direction of a
uniform patch's (mean/std-normalised) pixel vector, which a grey ramp hardly changes. The background stays ≥ 60 levels
(max over channels) from every shape colour. ``time_code=False`` (``--no-time-code``) gives a constant background.

*Long clips* (``long=True``, ``grounding-rl demo-data --long``): clips of :data:`LONG_MIN_DURATION` to
:data:`LONG_MAX_DURATION` seconds (a few minutes) written at :data:`LONG_FPS`, events of :data:`LONG_EVENT_SECONDS`
(2 to 5 s), and a time code that does not wrap over the clip: a black *time bar* along the bottom
:data:`TIME_BAR_ROWS` rows whose length grows one step per second, ``round(SIZE · floor(t) / LONG_MAX_DURATION)``
pixels (the whole width at :data:`LONG_MAX_DURATION`), drawn over the hue clock, which stays for the second within
its 12 s turn. At a budget that sees one frame every few seconds an event of 2-5 s falls between frames or in one or
two of them: a zoom pass (``eval --zoom``) has something to find.

*Multi-span clips* (``multi_span=True``, ``grounding-rl demo-data --multi-span``): the target appears in one to three
windows (:data:`MULTI_SPAN_WINDOWS`, drawn uniformly) of whole seconds, at least one second apart, together
:data:`EVENT_FRACTION` of the clip (at least one second each); the other draws are as for single-span clips. The
canonical line carries ``spans`` (sorted, disjoint) when there are several windows, ``start``/``end`` their hull;
a one-window clip is a plain single-span line. For interval-set training and set-IoU scoring (``default_multi``).

Deterministic: clip ``i`` of a split depends only on (seed, split, i) — same JSONL, same decoded frames.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Colour names -> RGB. Chosen far apart in hue and brightness so they stay distinct after yuv420 chroma subsampling
# and a 2x downscale.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 30, 30),
    "green": (30, 200, 50),
    "blue": (40, 80, 250),
    "yellow": (245, 225, 30),
    "purple": (170, 50, 210),
    "orange": (250, 140, 10),
    "white": (245, 245, 245),
    "cyan": (30, 225, 225),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "cross")
QUERY_TEMPLATES: tuple[str, ...] = ("the {colour} {shape} appears.", "a {colour} {shape} is shown.",
                                    "the {colour} {shape} is visible.")

SIZE = 112  # frame side, pixels
FPS = 8  # frames per second of the written clips
BACKGROUND = (28, 28, 32)
TIME_STEP = 1.0  # seconds: durations and event boundaries are multiples of this (one video-token row at 2 fps)
SPLITS = {"train": 0, "test": 1}
MIN_DURATION, MAX_DURATION = 6.0, 12.0  # default clip length range, seconds
NUM_TRAIN, NUM_TEST = 1000, 200  # default split sizes (what scripts/demo.sh trains and evaluates on)
EVENT_FRACTION = (0.2, 0.5)  # event length as a fraction of the clip (at least 2 s)
TIME_CODE_GREY, TIME_CODE_CHROMA, TIME_CODE_PERIOD = 112, 40, 12  # background of second k: hue k/PERIOD of a turn
LONG_MIN_DURATION, LONG_MAX_DURATION = 120.0, 180.0  # --long clip length range, seconds
LONG_EVENT_SECONDS = (2, 5)  # --long event length range, whole seconds
LONG_FPS = 4  # frames per second of the written long clips (fewer frames to encode; a window of 4 s holds 16)
LONG_NUM_TRAIN, LONG_NUM_TEST = 300, 50  # --long default split sizes
TIME_BAR_ROWS = 10  # height of the long clips' time bar, pixels
MULTI_SPAN_WINDOWS = (1, 3)  # --multi-span: windows per clip, inclusive range
RECORD = "demo_data.json"  # the files generate_demo wrote into its folder (grounding_rl.dev.written)


@dataclass(frozen=True)
class ShapeSpec:
    """One shape: colour name, kind, centre (x, y) and radius in pixels of the 112x112 frame."""

    colour: str
    shape: str
    cx: int
    cy: int
    radius: int


@dataclass(frozen=True)
class ClipSpec:
    """A demo clip's content: duration and event (seconds), target and distractors, query text."""

    name: str
    duration: float
    start: float
    end: float
    target: ShapeSpec
    distractors: tuple[ShapeSpec, ...]
    query: str
    time_code: bool = True
    long: bool = False
    spans: tuple[tuple[float, float], ...] | None = None  # the windows of a multi-span clip (start/end: their hull)

    @property
    def windows(self) -> tuple[tuple[float, float], ...]:
        """Where the target is visible: ``spans``, else ``((start, end),)`` (seconds)."""
        return self.spans if self.spans is not None else ((self.start, self.end),)

    @property
    def fps(self) -> int:
        """Frames per second of the written clip (:data:`LONG_FPS` for a long clip, else :data:`FPS`)."""
        return LONG_FPS if self.long else FPS

    @property
    def num_frames(self) -> int:
        return int(round(self.duration * self.fps))


def demo_queries() -> list[str]:
    """Every query the generator can write (all templates x colours x shapes); used to train the tiny tokenizer."""
    return [t.format(colour=c, shape=s) for t in QUERY_TEMPLATES for c in COLOURS for s in SHAPES]


def shape_mask(shape: str, cx: int, cy: int, radius: int, size: int = SIZE) -> np.ndarray:
    """Boolean (size, size) mask of a filled shape centred at (cx, cy) with half-extent ``radius`` pixels.

    Raises:
        ValueError: unknown shape name.
    """
    yy, xx = np.mgrid[0:size, 0:size]
    dx, dy = xx - cx, yy - cy
    if shape == "circle":
        return dx * dx + dy * dy <= radius * radius
    if shape == "square":
        r = int(round(radius * 0.85))
        return (np.abs(dx) <= r) & (np.abs(dy) <= r)
    if shape == "triangle":  # apex up, base at cy + radius
        height = 2 * radius
        rel = dy + radius  # 0 at apex .. height at base
        return (rel >= 0) & (rel <= height) & (np.abs(dx) <= rel / 2 + 0.5)
    if shape == "cross":
        arm = max(2, radius // 3)
        return ((np.abs(dx) <= radius) & (np.abs(dy) <= arm)) | ((np.abs(dy) <= radius) & (np.abs(dx) <= arm))
    raise ValueError(f"unknown shape {shape!r}; known: {SHAPES}")


def multi_span_windows(rng: np.random.Generator, steps: int) -> tuple[tuple[float, float], ...]:
    """The windows of a multi-span clip of ``steps`` whole seconds: k uniform in :data:`MULTI_SPAN_WINDOWS`, a total
    of ``max(k, round(u · steps))`` seconds (u uniform in :data:`EVENT_FRACTION`) split into k windows of ≥ 1 s
    (uniform composition), the free seconds spread over the k + 1 gaps (uniform composition), inner gaps ≥ 1 s.
    Sorted, disjoint, not touching, inside [0, steps]. Raises ValueError when ``steps`` < 5 (three windows and two
    gaps)."""
    lowest, highest = MULTI_SPAN_WINDOWS
    if steps < 2 * highest - 1:
        raise ValueError(f"multi-span clips need at least {2 * highest - 1} s, got {steps} s")
    k = int(rng.integers(lowest, highest + 1))
    total = max(k, int(round(rng.uniform(*EVENT_FRACTION) * steps)))
    total = min(total, steps - (k - 1))
    cuts = np.sort(rng.choice(np.arange(1, total), size=k - 1, replace=False)) if k > 1 else np.array([], int)
    lengths = np.diff(np.concatenate([[0], cuts, [total]]))
    free = steps - total - (k - 1)
    slots = np.sort(rng.integers(0, free + 1, size=k))  # k cut points over free seconds: k + 1 gaps
    gaps = np.diff(np.concatenate([[0], slots, [free]]))
    windows, t = [], 0
    for i, length in enumerate(lengths):
        t += int(gaps[i]) + (1 if i > 0 else 0)
        windows.append((float(t * TIME_STEP), float((t + int(length)) * TIME_STEP)))
        t += int(length)
    return tuple(windows)


def clip_spec(seed: int, split: str, index: int, min_duration: float = MIN_DURATION,
              max_duration: float = MAX_DURATION, time_code: bool = True, long: bool = False,
              multi_span: bool = False) -> ClipSpec:
    """The random content of clip ``index`` of ``split``: a pure function of (seed, split, index).

    Duration uniform on the :data:`TIME_STEP` grid in [min_duration, max_duration]; event length
    :data:`EVENT_FRACTION` of it (≥ 2 steps) on the same grid, placed uniformly; target and 1-3 distractors each in
    their own quadrant (no overlap), distractor colours all different from the target's. ``time_code`` only changes
    the rendering (:func:`background_colour`), not the random draws. ``long``: the event lasts
    :data:`LONG_EVENT_SECONDS` whole seconds instead (the clip length still comes from min/max_duration; the
    module docstring gives the long clips' defaults) and the clip is rendered with the time bar at :data:`LONG_FPS`.
    ``multi_span``: the target's windows come from :func:`multi_span_windows` in place of the single event (the
    draws before and after it are as for a single-span clip; the single-span draws are unchanged).

    Raises:
        ValueError: unknown split, durations not in 3 ≤ min ≤ max, ``multi_span`` with ``long`` or a clip < 5 s.
    """
    if multi_span and long:
        raise ValueError("multi_span and long clips do not combine")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {sorted(SPLITS)}")
    if not 3.0 <= min_duration <= max_duration:
        raise ValueError(f"need 3 <= min_duration <= max_duration, got {min_duration}, {max_duration}")
    rng = np.random.default_rng([seed, SPLITS[split], index])
    steps = rng.integers(int(min_duration / TIME_STEP), int(max_duration / TIME_STEP) + 1)
    duration = steps * TIME_STEP
    spans = None
    if multi_span:
        windows = multi_span_windows(rng, int(steps))
        start, end = windows[0][0], windows[-1][1]
        spans = windows if len(windows) > 1 else None
    else:
        if long:
            length = int(rng.integers(LONG_EVENT_SECONDS[0], LONG_EVENT_SECONDS[1] + 1))
        else:
            length = max(2, int(round(rng.uniform(*EVENT_FRACTION) * steps)))
        first = int(rng.integers(0, steps - length + 1))
        start, end = first * TIME_STEP, (first + length) * TIME_STEP

    colours = list(COLOURS)
    order = rng.permutation(len(colours))
    quadrants = rng.permutation(4)
    half = SIZE // 2

    def place(colour: str, quadrant: int) -> ShapeSpec:
        radius = int(rng.integers(15, 22))
        qx, qy = (quadrant % 2) * half, (quadrant // 2) * half
        cx = qx + half // 2 + int(rng.integers(-(half // 2 - radius - 1), half // 2 - radius))
        cy = qy + half // 2 + int(rng.integers(-(half // 2 - radius - 1), half // 2 - radius))
        return ShapeSpec(colour, SHAPES[int(rng.integers(len(SHAPES)))], cx, cy, radius)

    target = place(colours[order[0]], int(quadrants[0]))
    n_distractors = int(rng.integers(1, 4))
    distractors = tuple(place(colours[order[1 + k]], int(quadrants[1 + k])) for k in range(n_distractors))
    template = QUERY_TEMPLATES[int(rng.integers(len(QUERY_TEMPLATES)))]
    return ClipSpec(name=f"{split}_{index:05d}", duration=float(duration), start=float(start), end=float(end),
                    target=target, distractors=distractors,
                    query=template.format(colour=target.colour, shape=target.shape), time_code=time_code,
                    long=long, spans=spans)


def background_colour(seconds, time_code: bool = True) -> np.ndarray:
    """Background RGB (uint8, shape ``seconds.shape + (3,)``) at each time in seconds.

    With the time code, second ``k = floor(t)`` has channel ``c`` (R, G, B) equal to
    ``round(TIME_CODE_GREY + TIME_CODE_CHROMA * cos(2π (k / TIME_CODE_PERIOD - c / 3)))``; without it,
    :data:`BACKGROUND` everywhere.
    """
    seconds = np.asarray(seconds, dtype=np.float64)
    if not time_code:
        return np.broadcast_to(np.array(BACKGROUND, np.uint8), seconds.shape + (3,)).copy()
    angle = 2 * np.pi * np.floor(seconds + 1e-9) / TIME_CODE_PERIOD
    channels = [TIME_CODE_GREY + TIME_CODE_CHROMA * np.cos(angle - 2 * np.pi * c / 3) for c in range(3)]
    return np.round(np.stack(channels, axis=-1)).astype(np.uint8)


def time_bar_length(seconds) -> np.ndarray:
    """Pixels of the long clips' time bar at each time: ``round(SIZE · floor(t) / LONG_MAX_DURATION)``, at most
    SIZE (0 at 0-1 s, 56 at 90 s, 112 from 180 s)."""
    seconds = np.floor(np.asarray(seconds, dtype=np.float64) + 1e-9)
    return np.minimum(SIZE, np.round(SIZE * seconds / LONG_MAX_DURATION)).astype(np.int64)


def render_frames(spec: ClipSpec) -> np.ndarray:
    """uint8 frames (T, 112, 112, 3) of a clip; frame i shows time i / fps s (``spec.fps``) and has the target iff
    start ≤ t < end for one of its windows (``spec.windows``); its background is :func:`background_colour` of that time; a long clip with the time code has
    the time bar (:func:`time_bar_length`) black over its bottom :data:`TIME_BAR_ROWS` rows."""
    times = np.arange(spec.num_frames) / spec.fps
    frames = np.empty((len(times), SIZE, SIZE, 3), np.uint8)
    frames[:] = background_colour(times, spec.time_code)[:, None, None, :]
    for d in spec.distractors:
        frames[:, shape_mask(d.shape, d.cx, d.cy, d.radius)] = COLOURS[d.colour]
    t = spec.target
    visible = np.zeros(len(times), bool)
    for start, end in spec.windows:
        visible |= (times >= start - 1e-9) & (times < end - 1e-9)
    shown = frames[visible]
    shown[:, shape_mask(t.shape, t.cx, t.cy, t.radius)] = COLOURS[t.colour]
    frames[visible] = shown
    if spec.long and spec.time_code:
        for i, length in enumerate(time_bar_length(times)):
            frames[i, SIZE - TIME_BAR_ROWS:, :length] = 0
    return frames


def write_video(path: str | Path, frames: np.ndarray, fps: int = FPS, codec: str = "mpeg4") -> None:
    """Encode uint8 RGB frames (T, H, W, 3) with PyAV (single-threaded, so the output is deterministic)."""
    import av

    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.bit_rate = 600_000
        stream.codec_context.thread_count = 1
        for array in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(array), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


EARLIER_FILE = re.compile(r"(train|test)\.jsonl|videos/(train|test)_\d{5}\.mp4")


def earlier_output(out: Path) -> list[str] | None:
    """The files of a folder demo-data wrote before it left ``demo_data.json``: nothing but ``train.jsonl`` /
    ``test.jsonl`` whose every line has ``"source": "demo"`` and clips named as demo-data names them; else None (so
    ``scripts/demo.sh`` goes on replacing its ``data/demo`` without a flag, and a user's splits stay refused)."""
    import json

    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if not p.is_dir())
    if not files or not all(EARLIER_FILE.fullmatch(name) for name in files):
        return None
    for name in ("train.jsonl", "test.jsonl"):
        if name in files:
            try:
                lines = (out / name).read_text(encoding="utf-8").splitlines()
                if not all(json.loads(line).get("source") == "demo" for line in lines if line.strip()):
                    return None
            except (ValueError, AttributeError):
                return None
    return files


def generate_demo(out: str | Path, num_train: int = NUM_TRAIN, num_test: int = NUM_TEST, seed: int = 0,
                  min_duration: float = MIN_DURATION, max_duration: float = MAX_DURATION, progress: bool = True,
                  time_code: bool = True, long: bool = False, multi_span: bool = False,
                  overwrite: bool = False) -> dict:
    """Write ``out/videos/*.mp4`` and ``out/train.jsonl`` / ``out/test.jsonl`` (canonical JSONL), and the record of
    what was written, ``out/demo_data.json`` (:mod:`grounding_rl.dev.written`): a rerun into ``out`` removes those
    files first (another seed's clips do not linger) and refuses a folder holding anything else.

    Args:
        out: output folder (created).
        num_train, num_test: clips per split (one query per clip).
        seed: the whole output is a function of it.
        min_duration, max_duration: clip length range, seconds.
        progress: show a tqdm bar.
        time_code: burn the time into the background hue (and the time bar of a long clip; module docstring).
        long: long clips (the module docstring; pass the long durations as min/max_duration).
        multi_span: the target appears in one to three windows (module docstring); lines carry ``spans``.
        overwrite: write over a folder holding files demo-data did not write (a user's ``train.jsonl``); they are
            left where they are, or written over where the names are the same.

    Returns:
        ``{"train": path, "test": path, "clips": n, "seconds": wall time}``.

    Raises:
        UserError: ``out`` holds files demo-data did not write and ``overwrite`` is false (before anything is
            written).
        ValueError: durations :func:`clip_spec` refuses (before anything is written).
    """
    from tqdm import tqdm

    from grounding_rl.data.samples import Sample, write_samples

    from grounding_rl.dev.written import claim_folder, record_folder

    out = Path(out)
    clip_spec(seed, "train", 0, min_duration, max_duration, time_code, long, multi_span)  # its ValueError: before writing
    before = claim_folder(out, RECORD, overwrite, "demo-data", unrecorded=earlier_output)
    (out / "videos").mkdir(parents=True, exist_ok=True)
    began = time.time()
    jobs = [("train", i) for i in range(num_train)] + [("test", i) for i in range(num_test)]
    rows: dict[str, list[Sample]] = {"train": [], "test": []}
    for split, index in tqdm(jobs, desc="demo clips", disable=not progress):
        spec = clip_spec(seed, split, index, min_duration, max_duration, time_code, long, multi_span)
        rel = f"videos/{spec.name}.mp4"
        write_video(out / rel, render_frames(spec), fps=spec.fps)
        rows[split].append(Sample(video=rel, query=spec.query, start=spec.start, end=spec.end,
                                  duration=spec.duration, qid=f"demo:{spec.name}", source="demo", spans=spec.spans))
    paths = {}
    for split, samples in rows.items():
        paths[split] = str(out / f"{split}.jsonl")
        write_samples(paths[split], samples)
    record_folder(out, RECORD, "grounding-rl demo-data", before)
    return {**paths, "clips": len(jobs), "seconds": round(time.time() - began, 2)}
