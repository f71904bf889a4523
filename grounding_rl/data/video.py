"""Frame sampling at an exact fps and pixel budget, with the true frame times the Qwen-VL processors need.

Sizes follow ``qwen_vl_utils.fetch_video`` exactly (its ``smart_nframes`` and ``smart_resize``, and its inline rule that
turns ``total_pixels`` into a per-frame maximum), so a model trained with qwen-vl-utils sees the same tensor shapes.
Frame *times* do not: qwen-vl-utils spreads T frames uniformly over the clip (``linspace``), whose spacing drifts from
1 / fps; we take frame k at t = k / f on an exact time scale (see :func:`frame_times`). Decoding: decord's batched
``get_batch`` (PyAV when decord fails), then one batched uint8 resize; timings in docs/BENCHMARKS.md.

``VideoSettings.sampler`` chooses: ``exact`` (the above, default) or ``qwen_vl_utils`` —
``qwen_vl_utils.fetch_video``'s own frames (``linspace(0, total − 1, T)``) and its claimed rate ``T / total · fps``
(so its ``second_per_grid_ts``), which is how the TimeZero, Time-R1 and VideoChat-R1 checkpoints were trained and
evaluated. Its claimed frame times ``k / rate`` drift from the frames' true times (about 0.5 s on 10 s clips, 1.53 s
computed for a 20-minute one; docs/BENCHMARKS.md). ``lmms_eval_qwen2_5_vl`` reproduces lmms-eval's Qwen2.5-VL backend
(EvolvingLMMs-Lab/lmms-eval @75571cf ``lmms_eval/models/simple/qwen2_5_vl.py``, ``generate_until``): qwen-vl-utils
samples (as ``qwen_vl_utils``, sizes from its fps and pixel budget, the long-video settings ``total_tokens`` /
``min_tokens`` / ``total_pixels`` / ``min_pixels`` respected), then :func:`lmms_eval_indices` keeps 32 of those frames
by ``linspace`` plus the last, at the size computed for all of them, and the processor is called without fps or
metadata: it assumes 2 fps (:data:`LMMS_EVAL_CLAIMED_FPS`, transformers 4.x) whatever the frames' true spacing.

Long videos (TimeLens2's budget, ``grpo/timelens/data/video.py`` of MCG-NJU/TimeLens2): ``total_tokens`` and
``min_tokens`` give the budget in merged video tokens, ``total_pixels = total_tokens · factor²`` and ``min_pixels =
min_tokens · factor²`` with the family's pixel factor, so one number means the same for Qwen2.5-VL (28) and Qwen3-VL
(32). ``budget_lowers_fps`` lowers T once the frames would fall to ``min_pixels`` (:func:`budget_max_frames`);
``cover_tail`` puts the T frames on the scale T / duration, which covers the clip to its end (by default up to about
three frame periods at the end are never sampled: :func:`sampling_plan`). :func:`sample_window` samples [a, b] of a
video on the whole video's time grid, with absolute times. A file whose key frames are no clean decoder starts
(:func:`seeks_cleanly`; decord's seeking returns grey frames there) is decoded by PyAV from its start.
"""
from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import torch
from qwen_vl_utils.vision_process import (
    FRAME_FACTOR,
    MODEL_SEQ_LEN,
    SPATIAL_MERGE_SIZE,
    VIDEO_MAX_TOKEN_NUM,
    VIDEO_MIN_TOKEN_NUM,
    smart_nframes,
    smart_resize,
)

PATCH_SIZE = 14
IMAGE_FACTOR = PATCH_SIZE * SPATIAL_MERGE_SIZE  # 28: the default pixel factor (Qwen2.5-VL; Qwen3-VL's is 32)
DEFAULT_MIN_PIXELS = VIDEO_MIN_TOKEN_NUM * IMAGE_FACTOR * IMAGE_FACTOR  # 100,352 (qwen-vl-utils default)
DEFAULT_MAX_PIXELS = VIDEO_MAX_TOKEN_NUM * IMAGE_FACTOR * IMAGE_FACTOR  # 602,112 (qwen-vl-utils default)


VIDEO_SAMPLERS = ("exact", "qwen_vl_utils", "lmms_eval_qwen2_5_vl")
LMMS_EVAL_NUM_FRAMES = 32  # lmms-eval's Qwen2_5_VL(max_num_frames=32)
LMMS_EVAL_CLAIMED_FPS = 2.0  # the rate transformers 4.x's Qwen2.5-VL processor assumes when called without fps


class VideoLoadError(RuntimeError):
    """A video file could not be read, or yielded fewer than 2 frames. The message names the file."""


class WindowError(ValueError):
    """A window [start, end] that is empty, outside the clip, or too short to sample (:func:`window_indices`)."""


@dataclass(frozen=True)
class VideoSettings:
    """How frames are sampled from a clip (the names and defaults of qwen-vl-utils). Raises ValueError when the
    settings contradict each other (fps ≤ 0, min above max).

    Each setting is declared here once, its documentation the field's ``help`` (:func:`setting_fields`): it is
    ``video_<name>`` in a training YAML (:class:`grounding_rl.prompts.preprocessing.PreprocessingArguments`),
    ``--video-<name>`` on ``eval`` / ``infer`` / ``difficulty``
    (:class:`grounding_rl.eval.settings.PreprocessingOverrides`) and ``video.<name>`` in ``grounding_config.json``.
    ``pixel_factor`` alone has no help: H and W are multiples of it, the vision tower's patch size × spatial merge
    size (28 for Qwen2.5-VL, 32 for Qwen3-VL; qwen-vl-utils' ``image_patch_size`` × 2), set from the model family
    (:meth:`grounding_rl.family.Family.video_settings`), not by hand. The module docstring describes the samplers,
    the token budget (:attr:`budget_pixels`, :attr:`floor_pixels`, :attr:`ceiling_pixels`) and the tail
    (:func:`sampling_plan`, :func:`budget_max_frames`).
    """

    fps: float = field(default=2.0, metadata={"help": "Frames per second sampled from each clip (TimeZero and "
                                              "Time-R1: 2.0)."})
    min_frames: int = field(default=4, metadata={"help": "Minimum number of sampled frames T (rounded up to an even "
                                                 "number)."})
    max_frames: int = field(default=768, metadata={"help": "Maximum number of sampled frames T (rounded down to an "
                                                   "even number); when it caps T, the frames spread over the whole "
                                                   "clip (T / duration frames per second)."})
    min_pixels: int = field(default=DEFAULT_MIN_PIXELS, metadata={"help": "Minimum H·W per frame."})
    max_pixels: int = field(default=DEFAULT_MAX_PIXELS, metadata={
        "help": "Maximum H·W per frame (with video_total_tokens and this at its default: qwen-vl-utils' own cap for "
                "the model family, 768 merged tokens)."})
    total_pixels: int | None = field(default=None, metadata={
        "help": "Pixel budget T·H·W for a whole clip (TimeZero: 2809856 = 3584·28·28); none: qwen-vl-utils' "
                "default, effectively off."})
    sampler: str = field(default="exact", metadata={
        "help": f"Frame sampler, one of {list(VIDEO_SAMPLERS)}: 'exact' (frame k at k / fps, ours), 'qwen_vl_utils' "
                "(fetch_video's frames and claimed fps, how TimeZero, Time-R1 and VideoChat-R1 checkpoints were "
                "trained and evaluated) or 'lmms_eval_qwen2_5_vl' (lmms-eval's Qwen2.5-VL backend: fetch_video's "
                "frames cut to 32 by linspace plus the last, 2 fps claimed; for evaluation).",
        "choices": VIDEO_SAMPLERS})
    pixel_factor: int = IMAGE_FACTOR
    total_tokens: int | None = field(default=None, metadata={
        "help": "Budget of merged video tokens a clip (TimeLens2: 16384): total_pixels = tokens * factor^2 with the "
                "model family's factor (28 Qwen2.5-VL, 32 Qwen3-VL). Not with video_total_pixels."})
    min_tokens: int | None = field(default=None, metadata={
        "help": "Per-frame floor in merged tokens (TimeLens2's scripts: 1): min_pixels = tokens * factor^2. Not with "
                "a video_min_pixels of its own."})
    budget_lowers_fps: bool = field(default=False, metadata={
        "help": "When the budget cannot hold the frames fps asks for above the per-frame floor, take fewer frames "
                "spread over the clip (T <= 2 * budget / (1.05 * min_pixels)). Needs a budget."})
    cover_tail: bool = field(default=False, metadata={
        "help": "Put the T frames on the scale T / duration so they cover the clip to its end (default: frame k at "
                "k / fps, the last ~3 frame periods unsampled). Only with the exact sampler."})

    def __post_init__(self):
        problems = []
        if self.sampler not in VIDEO_SAMPLERS:
            problems.append(f"sampler must be one of {VIDEO_SAMPLERS} (got {self.sampler!r})")
        if not self.fps > 0:
            problems.append(f"fps must be > 0 (got {self.fps})")
        if not 1 <= self.min_frames <= self.max_frames:
            problems.append(f"need 1 ≤ min_frames ≤ max_frames (got {self.min_frames}, {self.max_frames})")
        if self.pixel_factor <= 0 or self.pixel_factor % 2:
            problems.append(f"pixel_factor must be a positive even number (got {self.pixel_factor})")
        for name in ("total_pixels", "total_tokens", "min_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value <= 0):
                problems.append(f"{name} must be > 0 or None (got {value})")
        if self.total_tokens is not None and self.total_pixels is not None:
            problems.append(f"give total_tokens ({self.total_tokens}) or total_pixels ({self.total_pixels}), not both")
        if self.min_tokens is not None and self.min_pixels != DEFAULT_MIN_PIXELS:
            problems.append(f"give min_tokens ({self.min_tokens}) or min_pixels ({self.min_pixels}), not both")
        if not problems and not 0 < self.floor_pixels <= self.ceiling_pixels:
            problems.append(f"need 0 < min_pixels ≤ max_pixels (got {self.floor_pixels}, {self.ceiling_pixels})")
        if self.budget_lowers_fps and self.total_pixels is None and self.total_tokens is None:
            problems.append("budget_lowers_fps needs a budget (total_tokens or total_pixels)")
        if self.cover_tail and self.sampler != "exact":
            problems.append(f"cover_tail is for the exact sampler ({self.sampler!r} spreads its frames over the clip "
                            "already)")
        if problems:
            raise ValueError("invalid VideoSettings: " + "; ".join(problems))

    @property
    def budget_pixels(self) -> int | None:
        """The clip's budget T·H·W / 2 in pixels: ``total_tokens · pixel_factor²``, else ``total_pixels`` (None: no
        budget, qwen-vl-utils' default)."""
        if self.total_tokens is not None:
            return self.total_tokens * self.pixel_factor ** 2
        return self.total_pixels

    @property
    def ceiling_pixels(self) -> int:
        """The per-frame cap H·W: ``max_pixels``; with a token budget (``total_tokens``) and ``max_pixels`` at its
        default, qwen-vl-utils' own cap ``VIDEO_MAX_TOKEN_NUM · pixel_factor²`` (768 merged tokens: 602,112 for
        Qwen2.5-VL's 28, the default itself; 786,432 for Qwen3-VL's 32), the cap ``process_vision_info`` applies when
        given a budget and no ``max_pixels`` (qwen-vl-utils 0.0.14 ``vision_process.py`` ``fetch_video``, lines
        446-449), as TimeLens2 calls it (``grpo/timelens/data/video.py``): one token budget then gives the family's
        own frames. A ``max_pixels`` of its own still caps."""
        if self.total_tokens is not None and self.max_pixels == DEFAULT_MAX_PIXELS:
            return VIDEO_MAX_TOKEN_NUM * self.pixel_factor ** 2
        return self.max_pixels

    @property
    def floor_pixels(self) -> int:
        """The per-frame floor H·W: ``min_tokens · pixel_factor²``, else ``min_pixels``."""
        if self.min_tokens is not None:
            return self.min_tokens * self.pixel_factor ** 2
        return self.min_pixels

    def to_dict(self) -> dict:
        """The settings as a dict (``grounding_config.json``, run fingerprints, frame-cache keys). A field added
        after :data:`FIRST_FIELDS` (the long-video ones) is left out while at its default, so settings written before
        it existed read, fingerprint and cache the same."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name in FIRST_FIELDS or getattr(self, f.name) != f.default}


# The fields recorded from the start; every later one is recorded only when set (VideoSettings.to_dict).
FIRST_FIELDS = ("fps", "min_frames", "max_frames", "min_pixels", "max_pixels", "total_pixels", "sampler",
                "pixel_factor")


def setting_fields() -> tuple:
    """The :class:`VideoSettings` fields a user sets, each with its ``help`` (field metadata; ``choices`` where the
    values are named): every field but ``pixel_factor`` (the model family's). Training's ``video_<name>`` keys and
    ``eval``'s ``--video-<name>`` flags are made from them."""
    return tuple(f for f in fields(VideoSettings) if "help" in f.metadata)


@dataclass
class SampledVideo:
    """Frames of one clip and how they were taken.

    Attributes:
        path: the resolved file path.
        frames: uint8 array (T, H, W, 3), RGB; T even, H and W multiples of the settings' pixel factor.
        source_fps: the container's average frame rate.
        duration: seconds, number of decoded frames / source_fps.
        frame_indices: source frame index of each sampled frame (length T).
        timestamps: seconds of each sampled frame: its presentation time (the container's pts, in display order)
            minus the first frame's, as annotations count from the start of the video; index / source_fps when the
            container has no usable pts.
        sampled_fps: the effective sampling rate f (fps, or T / duration when max_frames, min_frames, the budget or
            ``cover_tail`` change the scale); Qwen2.5-VL's ``second_per_grid_ts`` is 2 / f.
        backend: the decoder that produced the frames ("decord" or "pyav").
        window: ``(start, end)`` in seconds when only that part of the video was sampled (:func:`sample_window`;
            ``timestamps`` are then still seconds from the start of the video), None for the whole video.
    """

    path: str
    frames: np.ndarray
    source_fps: float
    duration: float
    frame_indices: list[int]
    timestamps: list[float]
    sampled_fps: float
    backend: str = "decord"
    window: tuple[float, float] | None = None

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    def sampling(self) -> dict:
        """What was sampled, for a per-sample record: ``{"fps": f, "frames": T, "height": H, "width": W}`` (and
        ``"window": [start, end]`` for a window), f rounded to 6 decimals."""
        out = {"fps": round(float(self.sampled_fps), 6), "frames": self.num_frames,
               "height": int(self.frames.shape[1]), "width": int(self.frames.shape[2])}
        if self.window is not None:
            out["window"] = [float(self.window[0]), float(self.window[1])]
        return out


def budget_max_frames(settings: VideoSettings) -> int | None:
    """With ``budget_lowers_fps``: the most frames the budget holds before the frames fall to the floor, else None.

    The rule: qwen-vl-utils gives each of T frames at most ``max(budget · 2 / T, ⌊1.05 · min_pixels⌋)`` pixels
    (:func:`frame_size`); once ``budget · 2 / T`` drops below ``⌊1.05 · min_pixels⌋`` the frames stop shrinking and
    T · H · W / 2 grows past the budget. So T ≤ ``floor2(2 · budget / ⌊1.05 · min_pixels⌋)`` (at least 2): the rate is
    lowered rather than the budget exceeded. With TimeLens2's training budget (16,384 tokens, ``min_tokens`` 64,
    factor 32) that is 486 frames; with its scripts' ``min_tokens`` 1 it is 31,212 (never binding).
    """
    if not settings.budget_lowers_fps:
        return None
    floor = int(settings.floor_pixels * 1.05)
    return max(FRAME_FACTOR, int(FRAME_FACTOR * settings.budget_pixels // floor) // FRAME_FACTOR * FRAME_FACTOR)


def _max_frames(settings: VideoSettings) -> int:
    """``max_frames``, lowered to :func:`budget_max_frames` when that applies."""
    cap = budget_max_frames(settings)
    return settings.max_frames if cap is None else min(settings.max_frames, cap)


def num_sampled_frames(settings: VideoSettings, total_frames: int, source_fps: float) -> int:
    """T, from ``qwen_vl_utils.vision_process.smart_nframes`` (fps, min_frames, max_frames — lowered by
    :func:`budget_max_frames` with ``budget_lowers_fps``; even; ≤ total_frames).

    Raises:
        ValueError: when fewer than 2 frames can be sampled (from ``smart_nframes``).
    """
    return smart_nframes(
        {"fps": settings.fps, "min_frames": settings.min_frames, "max_frames": _max_frames(settings)},
        total_frames=total_frames,
        video_fps=source_fps,
    )


def frame_times(num_frames: int, duration: float, fps: float, cover_tail: bool = False) -> tuple[np.ndarray, float]:
    """Sampling times t_k = k / f for k < T, and f.

    f = fps when T frames at that rate fit in the clip and T is what fps alone asks for (T = floor2(duration·fps));
    otherwise (T capped by max_frames or the budget, or raised by min_frames) and always with ``cover_tail``,
    f = T / duration, an exact time scale over the whole clip.

    Returns:
        (times in seconds, shape (T,), f in frames per second).
    """
    wanted = duration * fps
    if not cover_tail and num_frames / fps <= duration + 1e-9 and num_frames > wanted - FRAME_FACTOR:
        f = fps
    else:
        f = num_frames / duration
    return np.arange(num_frames, dtype=np.float64) / f, float(f)


# A nominal source rate for planning from a duration alone: high enough never to cap T (T ≤ total frames).
_PLAN_SOURCE_FPS = 1000.0


def sampling_plan(settings: VideoSettings, duration: float) -> tuple[int, float]:
    """(T, f) for a clip of ``duration`` seconds, from the duration alone (annotation files, ``fits``): the frame
    count :func:`num_sampled_frames` gives and the rate :func:`frame_times` gives, for a source rate that never caps
    T. Frame k sits at k / f; the last sampled frame at (T − 1) / f, and the end of its frame period at T / f. By
    default T = floor2(duration · fps) and f = fps, so up to about three periods at the end are not sampled (a
    35.2 s clip at 1 fps: 34 frames, the last at 33 s, the last textual timestamp ``<32.5 seconds>``); with
    ``cover_tail`` f = T / duration and T / f is the clip's end.

    Raises:
        ValueError: duration ≤ 0, or fewer than 2 frames.
    """
    if not duration > 0:
        raise ValueError(f"duration must be > 0 (got {duration})")
    frames = num_sampled_frames(settings, max(FRAME_FACTOR, round(duration * _PLAN_SOURCE_FPS)), _PLAN_SOURCE_FPS)
    return frames, frame_times(frames, duration, settings.fps, settings.cover_tail)[1]


def frame_size(height: int, width: int, num_frames: int, settings: VideoSettings) -> tuple[int, int]:
    """(H, W) per frame, exactly as ``qwen_vl_utils.fetch_video`` computes it.

    Reproduces qwen-vl-utils 0.0.14 ``vision_process.py`` ``fetch_video`` (lines 405-455) with ``image_patch_size =
    pixel_factor / 2``: the per-frame maximum is ``max(min(VIDEO_FRAME_MAX_PIXELS, total_pixels / nframes *
    FRAME_FACTOR), int(min_pixels * 1.05))`` (``VIDEO_FRAME_MAX_PIXELS = 768·factor²``), then capped by the requested
    ``max_pixels`` (:attr:`VideoSettings.ceiling_pixels`), then ``smart_resize`` to multiples of the factor.
    """
    factor = settings.pixel_factor
    min_pixels = settings.floor_pixels
    total_pixels = settings.budget_pixels
    if total_pixels is None:
        total_pixels = MODEL_SEQ_LEN * factor * factor * 0.9
    frame_max = VIDEO_MAX_TOKEN_NUM * factor * factor
    max_pixels = max(min(frame_max, total_pixels / num_frames * FRAME_FACTOR), int(min_pixels * 1.05))
    max_pixels = min(settings.ceiling_pixels, max_pixels)
    return smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)


def sample_indices(total_frames: int, source_fps: float, settings: VideoSettings) -> tuple[list[int], float]:
    """Source frame indices to sample, and the effective sampled fps f.

    T = :func:`num_sampled_frames`; frame k is the source frame nearest t_k = k / f (:func:`frame_times`), i.e. index
    round(t_k · source_fps), clipped to the last frame.

    Args:
        total_frames: number of decodable frames in the clip.
        source_fps: the container's average frame rate.
        settings: fps and frame bounds.

    Returns:
        (indices, length T, non-decreasing; f in frames per second).

    Raises:
        ValueError: fewer than 2 frames, or a non-positive fps.
    """
    if total_frames < 2 or not source_fps or source_fps <= 0:
        raise ValueError(f"{total_frames} frame(s) at fps {source_fps}; need at least 2 frames and a positive fps")
    times, f = frame_times(num_sampled_frames(settings, total_frames, source_fps), total_frames / source_fps,
                           settings.fps, settings.cover_tail)
    indices = np.minimum(np.round(times * source_fps).astype(np.int64), total_frames - 1)
    return indices.tolist(), f


def window_indices(total_frames: int, source_fps: float, settings: VideoSettings, start: float, end: float
                   ) -> tuple[list[int], float]:
    """Source frame indices for the window [start, end] (seconds) of a clip, and the effective sampled fps f.

    The frames sit on the whole clip's time grid t_k = k / fps: every k with start ≤ k / fps ≤ end, T = floor2 of
    their number, so the frames are exactly those a whole-clip sampling at fps takes in the window (index
    round(t_k · source_fps)). When min_frames, max_frames or the budget change T, or with ``cover_tail``, the T
    frames go on the exact scale f = T / (end − start) over the window instead (t_j = start + j / f). ``end`` past
    the clip is cut to its duration.

    Raises:
        WindowError: a window that is empty or starts before 0 or after the clip, fewer than 2 source frames in it,
            or fewer than 2 frames to sample.
        ValueError: fewer than 2 frames in the clip, or a non-positive source fps.
    """
    if total_frames < 2 or not source_fps or source_fps <= 0:
        raise ValueError(f"{total_frames} frame(s) at fps {source_fps}; need at least 2 frames and a positive fps")
    duration = total_frames / source_fps
    end = min(float(end), duration)
    if not 0.0 <= start < end:
        raise WindowError(f"window [{start}, {end}] is empty or outside the clip (0 to {duration:.3f} s)")
    eps = 1e-9
    available = min(math.floor(end * source_fps + eps), total_frames - 1) - math.ceil(start * source_fps - eps) + 1
    if available < FRAME_FACTOR:
        raise WindowError(f"window [{start}, {end}] holds {available} source frame(s); need at least 2")
    first, last = math.ceil(start * settings.fps - eps), math.floor(end * settings.fps + eps)
    wanted = max(0, last - first + 1) // FRAME_FACTOR * FRAME_FACTOR
    lowest = math.ceil(settings.min_frames / FRAME_FACTOR) * FRAME_FACTOR
    frames = min(max(wanted, lowest), _max_frames(settings) // FRAME_FACTOR * FRAME_FACTOR,
                 available // FRAME_FACTOR * FRAME_FACTOR)
    if frames < FRAME_FACTOR:
        raise WindowError(f"window [{start}, {end}] gives {frames} frame(s) to sample; need at least 2")
    if frames == wanted and not settings.cover_tail:
        f, times = float(settings.fps), (first + np.arange(frames, dtype=np.float64)) / settings.fps
    else:
        f = frames / (end - start)
        times = start + np.arange(frames, dtype=np.float64) / f
    indices = np.clip(np.round(times * source_fps).astype(np.int64), 0, total_frames - 1)
    return indices.tolist(), float(f)


# Source frames decoded (and resized) at a time: the peak memory of sampling a clip is one chunk of source-size frames
# plus the resized output, whatever the clip's length and resolution.
CHUNK_FRAMES = 16


def _decode_decord(path: str, settings: VideoSettings, num_threads: int, plan=None):
    """Decode and resize the sampled frames with decord, ``CHUNK_FRAMES`` source frames at a time (``get_batch``,
    which seeks to the key frame before a frame it has not reached rather than decoding every frame).

    ``plan(total_frames, source_fps) -> (indices, f)`` chooses the frames (default :func:`sample_indices` with
    ``settings``). Returns (frames (T, H, W, 3) uint8 at :func:`frame_size`, total_frames, source_fps, indices, f).
    Raises whatever decord raises.
    """
    import decord

    reader = decord.VideoReader(path, num_threads=num_threads)
    total, source_fps = len(reader), float(reader.get_avg_fps())
    indices, f = (plan or (lambda t, r: sample_indices(t, r, settings)))(total, source_fps)
    frames = None
    for start in range(0, len(indices), CHUNK_FRAMES):
        batch = reader.get_batch(indices[start:start + CHUNK_FRAMES])
        chunk = batch.asnumpy() if hasattr(batch, "asnumpy") else np.asarray(batch)  # another bridge may be set
        if frames is None:
            height, width = frame_size(chunk.shape[1], chunk.shape[2], len(indices), settings)
            frames = np.empty((len(indices), height, width, 3), dtype=np.uint8)
        frames[start:start + len(chunk)] = resize_frames(chunk, height, width)
        del batch, chunk
    return frames, total, source_fps, indices, f


def _pyav_pass(path: str, indices: list[int], num_threads: int, settings: VideoSettings
               ) -> tuple[list[np.ndarray], int]:
    """Decode every frame of the first video stream in order; convert only ``indices`` to RGB and resize each as it
    comes (so at most one source-size frame is held).

    Returns (resized RGB frames for the indices that exist, number of decoded frames).
    """
    import av

    wanted = set(indices)
    kept: dict[int, np.ndarray] = {}
    count = 0
    size = None
    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "FRAME"
        stream.thread_count = num_threads
        for count, frame in enumerate(container.decode(stream), start=1):
            if count - 1 in wanted:
                rgb = frame.to_ndarray(format="rgb24")[None]
                size = size or frame_size(rgb.shape[1], rgb.shape[2], len(indices), settings)
                kept[count - 1] = resize_frames(rgb, *size)[0]
    return [kept[i] for i in indices if i in kept], count


def _decode_pyav(path: str, settings: VideoSettings, num_threads: int, plan=None):
    """PyAV fallback for files decord cannot open or seek: sequential decoding of every frame (no seeking), each kept
    frame resized at once.

    The frame count comes from a demux pass (no decoding); if decoding yields a different count the indices are
    planned again from the decoded count and the file is decoded once more. ``plan`` and the return value as
    :func:`_decode_decord`.
    """
    import av

    with av.open(path) as container:
        stream = container.streams.video[0]
        source_fps = float(stream.average_rate or stream.guessed_rate or 0)
        total = sum(1 for packet in container.demux(stream) if packet.size)
    plan = plan or (lambda t, r: sample_indices(t, r, settings))
    for _ in range(2):
        indices, f = plan(total, source_fps)
        frames, decoded = _pyav_pass(path, indices, num_threads, settings)
        if decoded == total:
            return np.stack(frames), total, source_fps, indices, f
        total = decoded
    raise ValueError(f"PyAV decoded a different number of frames on each pass (last {decoded})")


def seeks_cleanly(path: str) -> bool:
    """Whether decoding from the file's second key frame starts cleanly: seeking there (PyAV) and decoding, the first
    frame is a key frame with that packet's pts. False for files whose "key frames" are no decoder refresh points,
    e.g. x264's intra-refresh recovery points (which the mp4 muxer flags as key frames): from them decord's
    ``get_batch``, which seeks to the key frame before a frame it has not reached, returns grey frames with blocky
    debris (mean absolute difference 78-106 per pixel against a sequential decode). True when there is no second key
    frame or PyAV cannot read the file (decord then decides). Cost: a demux up to that key frame and one decode.
    """
    import av

    try:
        with av.open(path) as container:
            stream = container.streams.video[0]
            keys = [packet.pts for packet in itertools.islice(
                (packet for packet in container.demux(stream) if packet.size and packet.is_keyframe), 2)]
            if len(keys) < 2 or keys[1] is None:  # no second key frame, or no pts
                return True
            target = keys[1]
            container.seek(target, stream=stream, backward=True)
            frame = next(container.decode(stream), None)
            return frame is not None and bool(frame.key_frame) and frame.pts == target
    except (av.error.FFmpegError, StopIteration, IndexError):
        return True


def presentation_times(path: str, total_frames: int, source_fps: float) -> list[float]:
    """Seconds of every frame in display order, measured from the first frame: the sorted pts of the first video
    stream's packets (one demux pass, no decoding), minus the smallest.

    Packets come in decoding order (B-frames: pts out of order), so the pts are sorted. When the container gives no
    pts for some packet, or a packet count different from ``total_frames``, the times are index / ``source_fps``.
    (decord's ``get_frame_timestamp`` is float32 and garbage for AVI files without pts.)
    """
    import av

    try:
        with av.open(path) as container:
            stream = container.streams.video[0]
            base = stream.time_base
            pts = [packet.pts for packet in container.demux(stream) if packet.size]
    except Exception:  # unreadable by PyAV: the nominal times
        pts = None
    if not pts or None in pts or len(pts) != total_frames or base is None:
        return [i / source_fps for i in range(total_frames)]
    pts.sort()
    return [float((p - pts[0]) * base) for p in pts]


def decode_threads() -> int:
    """Default decoder threads: the CPUs this process may use, at most 8.

    One per usable CPU is 5-10 % faster than FFmpeg's automatic choice (CPUs + 1) on 2 cores (docs/BENCHMARKS.md).
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


def _decode(path: str, settings: VideoSettings, num_threads: int | None, plan=None):
    """Decode with decord, else PyAV: ``(frames, total_frames, source_fps, indices, f, backend)`` (``plan`` as in
    :func:`_decode_decord`; ``num_threads`` None = :func:`decode_threads`). PyAV alone (sequential, no seeking) when
    the file does not :func:`seeks_cleanly`.

    Raises:
        WindowError: from ``plan`` (the same for every decoder).
        VideoLoadError: neither decoder reads the file (the message names it and both reasons).
    """
    if num_threads is None:
        num_threads = decode_threads()
    errors = []
    decoders = (("decord", _decode_decord), ("pyav", _decode_pyav))
    for backend, decode in decoders if seeks_cleanly(path) else decoders[1:]:
        try:
            return (*decode(path, settings, num_threads, plan), backend)
        except WindowError:
            raise
        except Exception as err:  # decord raises DECORDError/RuntimeError, PyAV av.error.*; try the next backend
            errors.append(f"{backend}: {str(err).strip() or type(err).__name__}"[:300])
    raise VideoLoadError(f"{path}: cannot read video ({'; '.join(errors)})")


def sample_frames(
    path: str | Path, settings: VideoSettings = VideoSettings(), cache=None, num_threads: int | None = None
) -> SampledVideo:
    """Sample a clip at an exact fps and pixel budget.

    Decodes with decord (batched ``get_batch`` over chunks of :data:`CHUNK_FRAMES` source frames, each chunk resized
    at once by :func:`resize_frames` to :func:`frame_size`), falling back to PyAV when decord cannot open the file or
    fetch the frames, or when the file does not :func:`seeks_cleanly` (decord's seeking would give grey frames).
    Peak memory: one chunk of source-size frames plus the output.

    Args:
        path: a video file (anything decord or PyAV reads).
        settings: fps, frame bounds and pixel budget.
        cache: optional :class:`grounding_rl.data.cache.FrameCache`; a hit returns identical frames and metadata,
            a miss stores the result.
        num_threads: decoder threads (None = :func:`decode_threads`, 0 = FFmpeg's automatic choice); frames do not
            depend on it. Use 1 inside many data-loader workers.

    Returns:
        :class:`SampledVideo`: uint8 frames (T, H, W, 3) with T even and H, W multiples of
        ``settings.pixel_factor``, at the sizes ``qwen_vl_utils.fetch_video`` gives for the same settings; timestamps
        the frames' presentation times in seconds from the first frame (:func:`presentation_times`).

    Raises:
        VideoLoadError: the file is missing, unreadable by both decord and PyAV, or yields fewer than 2 frames
            (the message names the file).
    """
    path = str(Path(path).resolve())
    if not Path(path).is_file():
        raise VideoLoadError(f"{path}: no such video file")
    if cache is not None:
        hit = cache.get(path, settings)
        if hit is not None:
            return hit

    if settings.sampler in ("qwen_vl_utils", "lmms_eval_qwen2_5_vl"):
        video = _sample_qwen_vl_utils(path, settings)
        if settings.sampler == "lmms_eval_qwen2_5_vl":
            video = _lmms_eval_subsample(video)
        if cache is not None:
            cache.put(path, settings, video)
        return video
    frames, total, source_fps, indices, f, backend = _decode(path, settings, num_threads)
    times = presentation_times(path, total, source_fps)
    video = SampledVideo(
        path=path,
        frames=frames,
        source_fps=source_fps,
        duration=total / source_fps,
        frame_indices=indices,
        timestamps=[times[i] for i in indices],
        sampled_fps=f,
        backend=backend,
    )
    if cache is not None:
        cache.put(path, settings, video)
    return video


def sample_window(path: str | Path, start: float, end: float, settings: VideoSettings = VideoSettings(),
                  num_threads: int | None = None) -> SampledVideo:
    """Sample the part [start, end] (seconds) of a clip, with absolute times: what a zoom pass or a crop tool feeds
    the model.

    The frames are chosen by :func:`window_indices` (on the whole clip's grid k / fps, so they are exactly the frames
    :func:`sample_frames` takes in [start, end], unless a frame cap or ``cover_tail`` puts them on the scale
    T / (end − start)) and sized by :func:`frame_size` for T frames. ``timestamps`` are presentation times from the
    start of the video, so Qwen3-VL's ``<t seconds>`` are absolute; Qwen2.5-VL's ``second_per_grid_ts`` = 2 / f
    carries only the spacing (its time starts at the window's first frame, ``timestamps[0]``). Decoded as
    :func:`sample_frames` decodes (PyAV from the start where the file does not :func:`seeks_cleanly`).

    Raises:
        WindowError: an empty window, or one outside the clip or too short (:func:`window_indices`).
        ValueError: a sampler other than ``exact``.
        VideoLoadError: as :func:`sample_frames`.
    """
    if settings.sampler != "exact":
        raise ValueError(f"sample_window uses the exact sampler (got {settings.sampler!r})")
    path = str(Path(path).resolve())
    if not Path(path).is_file():
        raise VideoLoadError(f"{path}: no such video file")
    frames, total, source_fps, indices, f, backend = _decode(
        path, settings, num_threads, lambda total, rate: window_indices(total, rate, settings, start, end))
    times = presentation_times(path, total, source_fps)
    return SampledVideo(path=path, frames=frames, source_fps=source_fps, duration=total / source_fps,
                        frame_indices=indices, timestamps=[times[i] for i in indices], sampled_fps=f,
                        backend=backend, window=(float(start), min(float(end), total / source_fps)))


def _sample_qwen_vl_utils(path: str, settings: VideoSettings) -> SampledVideo:
    """Frames, indices and claimed fps exactly as ``qwen_vl_utils.fetch_video`` gives them (its reader: decord here).

    ``sampled_fps`` is its ``sample_fps`` = T / total_frames · source_fps (what the processor turns into
    ``second_per_grid_ts``); ``frame_indices`` and ``timestamps`` are the true ones (``linspace(0, total − 1, T)``
    rounded, / source_fps). Raises VideoLoadError naming the clip and the reason when ``fetch_video`` fails (e.g. its
    torchvision fallback calls ``torchvision.io.read_video``, which torchvision 0.29 no longer has).
    """
    from qwen_vl_utils.vision_process import fetch_video

    element = {"video": path, "fps": settings.fps, "min_frames": settings.min_frames,
               "max_frames": _max_frames(settings), "min_pixels": settings.floor_pixels,
               "max_pixels": settings.ceiling_pixels}
    if settings.budget_pixels is not None:
        element["total_pixels"] = settings.budget_pixels
    try:
        (frames, metadata), claimed_fps = fetch_video(element, return_video_sample_fps=True,
                                                      return_video_metadata=True)
    except Exception as err:  # whatever its readers raise
        reason = f"{type(err).__name__}: {str(err).strip()}"[:300]
        raise VideoLoadError(f"{path}: qwen_vl_utils.fetch_video cannot read it ({reason})") from err
    source_fps = float(metadata["fps"])
    indices = [int(i) for i in metadata["frames_indices"]]
    frames = frames.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
    return SampledVideo(path=path, frames=frames, source_fps=source_fps,
                        duration=float(metadata["total_num_frames"]) / source_fps, frame_indices=indices,
                        timestamps=[i / source_fps for i in indices], sampled_fps=float(claimed_fps),
                        backend=f"qwen_vl_utils/{metadata.get('video_backend', '?')}")


def lmms_eval_indices(total: int, num_frames: int = LMMS_EVAL_NUM_FRAMES) -> np.ndarray:
    """Which of ``total`` sampled frames lmms-eval's Qwen2.5-VL backend keeps: ``unique(linspace(0, total − 1,
    num_frames, dtype=int))``, plus ``total − 1`` when missing (lmms-eval @75571cf
    ``lmms_eval/models/simple/qwen2_5_vl.py``). E.g. total 60 → 32 indices 0, 1, 3, 5, …, 59; total 10 → 0..9."""
    indices = np.unique(np.linspace(0, total - 1, num_frames, dtype=int))
    if total - 1 not in indices:
        indices = np.unique(np.append(indices, total - 1))
    return indices


def _lmms_eval_subsample(video: SampledVideo) -> SampledVideo:
    """The ``lmms_eval_qwen2_5_vl`` sampler's step after qwen-vl-utils: the frames of :func:`lmms_eval_indices`, and
    the rate the processor assumes without fps (:data:`LMMS_EVAL_CLAIMED_FPS`) as ``sampled_fps``."""
    keep = lmms_eval_indices(len(video.frames))
    return SampledVideo(path=video.path, frames=np.ascontiguousarray(video.frames[keep]), source_fps=video.source_fps,
                        duration=video.duration, frame_indices=[video.frame_indices[i] for i in keep],
                        timestamps=[video.timestamps[i] for i in keep], sampled_fps=LMMS_EVAL_CLAIMED_FPS,
                        backend=f"lmms_eval_qwen2_5_vl/{video.backend}")


def resize_frames(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """One batched bicubic, antialiased resize of uint8 frames (T, h, w, 3) → (T, height, width, 3) uint8.

    The filter of qwen-vl-utils (bicubic, antialias=True), computed by torch's native uint8 kernel on the
    channels-last tensor (``torch.nn.functional.interpolate``). torchvision's ``resize`` (what qwen-vl-utils calls)
    converts uint8 to float and back, about 10x slower on CPU; values differ from it by rounding only (mean 0.1,
    under 0.02% of values by more than 1; measured on the six clips in ../shared/data/videos).
    """
    if frames.shape[1] == height and frames.shape[2] == width:
        return np.ascontiguousarray(frames)
    tensor = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)  # NCHW view, channels-last memory
    out = torch.nn.functional.interpolate(tensor, size=(height, width), mode="bicubic", antialias=True)
    return out.permute(0, 2, 3, 1).contiguous().numpy()


def window_settings(settings: VideoSettings, first: dict, window: tuple[float, float], spend: str) -> VideoSettings:
    """Pass 2's sampling settings for ``window``, spending what pass 1 spent (T₁ frames of H₁ × W₁ at f₁: ``first``
    is pass 1's ``{"fps", "frames", "height", "width"}``, :meth:`grounding_rl.data.video.SampledVideo.sampling`).

    ``fps``: rate T₁ / (b − a) and at most T₁ frames; frame sizes follow the same budget rule as pass 1 (same T, same
    size). ``resolution``: pass 1's rate f₁ (so T₂ ≈ f₁ · (b − a) frames, at least ``min_frames``), a budget of
    pass 1's T₁·H₁·W₁ / 2 pixels, and a per-frame cap raised to T₁·H₁·W₁ / T₂ (within qwen-vl-utils' 768 merged
    tokens a frame), so each frame gets up to T₁ / T₂ times pass 1's pixels. ``budget_lowers_fps`` is off in pass 2
    (the frame count is set here).

    Raises:
        ValueError: an unknown ``spend``.
    """
    from qwen_vl_utils.vision_process import VIDEO_MAX_TOKEN_NUM

    length = max(window[1] - window[0], 1e-6)
    frames1, rate1 = int(first["frames"]), float(first["fps"])
    if spend == "fps":
        return replace(settings, fps=frames1 / length, max_frames=max(frames1, settings.min_frames),
                                   budget_lowers_fps=False)
    if spend == "resolution":
        spent = frames1 * int(first["height"]) * int(first["width"])
        frames2 = max(settings.min_frames, math.floor(rate1 * length / FRAME_FACTOR) * FRAME_FACTOR, FRAME_FACTOR)
        cap = VIDEO_MAX_TOKEN_NUM * settings.pixel_factor ** 2
        max_pixels = max(settings.ceiling_pixels, min(cap, spent // frames2))
        return replace(settings, fps=rate1, max_frames=max(frames1, settings.min_frames),
                                   total_tokens=None, total_pixels=spent // FRAME_FACTOR, max_pixels=max_pixels,
                                   budget_lowers_fps=False)
    raise ValueError(f"spend must be fps or resolution (got {spend!r})")
