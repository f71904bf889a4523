"""Frame sampling at an exact fps and pixel budget, with the metadata the Qwen2.5-VL processor needs.

Sizes follow ``qwen_vl_utils.fetch_video`` exactly (its ``smart_nframes`` and ``smart_resize``, and its inline rule that
turns ``total_pixels`` into a per-frame maximum), so a model trained with qwen-vl-utils sees the same tensor shapes.
Frame *times* do not: qwen-vl-utils spreads T frames uniformly over the clip (``linspace``), whose spacing drifts from
1 / fps; we take frame k at t = k / f on an exact time scale (see :func:`frame_times`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
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
IMAGE_FACTOR = PATCH_SIZE * SPATIAL_MERGE_SIZE  # 28: H and W are multiples of this
DEFAULT_MIN_PIXELS = VIDEO_MIN_TOKEN_NUM * IMAGE_FACTOR * IMAGE_FACTOR  # 100,352 (qwen-vl-utils default)
DEFAULT_MAX_PIXELS = VIDEO_MAX_TOKEN_NUM * IMAGE_FACTOR * IMAGE_FACTOR  # 602,112 (qwen-vl-utils default)


class VideoLoadError(RuntimeError):
    """A video file could not be read, or yielded fewer than 2 frames. The message names the file."""


@dataclass(frozen=True)
class VideoSettings:
    """How frames are sampled from a clip (the names and defaults of qwen-vl-utils).

    Attributes:
        fps: frames per second to sample (TimeZero and Time-R1 use 2.0).
        min_frames: lower bound on the number of frames T (rounded up to an even number).
        max_frames: upper bound on T (rounded down to an even number); when it caps T, the time scale stretches to
            T / duration frames per second so the whole clip is covered.
        min_pixels: minimum H·W per frame.
        max_pixels: maximum H·W per frame.
        total_pixels: budget for T·H·W over the whole clip (TimeZero: 3584·28·28); None = qwen-vl-utils' default
            (MODEL_SEQ_LEN·28·28·0.9, effectively off).
    """

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    min_pixels: int = DEFAULT_MIN_PIXELS
    max_pixels: int = DEFAULT_MAX_PIXELS
    total_pixels: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SampledVideo:
    """Frames of one clip and how they were taken.

    Attributes:
        path: the resolved file path.
        frames: uint8 array (T, H, W, 3), RGB; T even, H and W multiples of 28.
        source_fps: the container's average frame rate.
        duration: seconds, number of decoded frames / source_fps.
        frame_indices: source frame index of each sampled frame (length T).
        timestamps: seconds of each sampled frame, index / source_fps, counted from the first decoded frame.
        sampled_fps: the effective sampling rate f (fps, or T / duration when max_frames or min_frames change T);
            Qwen2.5-VL's ``second_per_grid_ts`` is 2 / f.
    """

    path: str
    frames: np.ndarray
    source_fps: float
    duration: float
    frame_indices: list[int]
    timestamps: list[float]
    sampled_fps: float
    extra: dict = field(default_factory=dict)

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])


def num_sampled_frames(settings: VideoSettings, total_frames: int, source_fps: float) -> int:
    """T, from ``qwen_vl_utils.vision_process.smart_nframes`` (fps, min_frames, max_frames; even; ≤ total_frames).

    Raises:
        VideoLoadError: when fewer than 2 frames can be sampled.
    """
    try:
        return smart_nframes(
            {"fps": settings.fps, "min_frames": settings.min_frames, "max_frames": settings.max_frames},
            total_frames=total_frames,
            video_fps=source_fps,
        )
    except ValueError as err:
        raise VideoLoadError(str(err)) from err


def frame_times(num_frames: int, duration: float, fps: float) -> tuple[np.ndarray, float]:
    """Sampling times t_k = k / f for k < T, and f.

    f = fps when T frames at that rate fit in the clip and T is what fps alone asks for (T = floor2(duration·fps));
    otherwise (T capped by max_frames or raised by min_frames) f = T / duration, an exact time scale over the clip.

    Returns:
        (times in seconds, shape (T,), f in frames per second).
    """
    wanted = duration * fps
    if num_frames / fps <= duration + 1e-9 and num_frames > wanted - FRAME_FACTOR:
        f = fps
    else:
        f = num_frames / duration
    return np.arange(num_frames, dtype=np.float64) / f, float(f)


def frame_size(height: int, width: int, num_frames: int, settings: VideoSettings) -> tuple[int, int]:
    """(H, W) per frame, exactly as ``qwen_vl_utils.fetch_video`` computes it.

    Reproduces qwen-vl-utils 0.0.14 ``vision_process.py`` ``fetch_video`` (lines 449-464): the per-frame maximum is
    ``max(min(VIDEO_FRAME_MAX_PIXELS, total_pixels / nframes * FRAME_FACTOR), int(min_pixels * 1.05))``, then capped
    by the requested ``max_pixels``, then ``smart_resize`` to multiples of 28.
    """
    min_pixels = settings.min_pixels
    total_pixels = settings.total_pixels
    if total_pixels is None:
        total_pixels = MODEL_SEQ_LEN * IMAGE_FACTOR * IMAGE_FACTOR * 0.9
    max_pixels = max(min(DEFAULT_MAX_PIXELS, total_pixels / num_frames * FRAME_FACTOR), int(min_pixels * 1.05))
    max_pixels = min(settings.max_pixels, max_pixels)
    return smart_resize(height, width, factor=IMAGE_FACTOR, min_pixels=min_pixels, max_pixels=max_pixels)


def _decode_decord(path: str, plan) -> np.ndarray:
    """Decode the planned frames with decord (one batched ``get_batch``)."""
    import decord

    reader = decord.VideoReader(path, num_threads=1)
    indices = plan(len(reader), float(reader.get_avg_fps()))
    return reader.get_batch(indices).asnumpy()


def _decode_pyav(path: str, plan) -> np.ndarray:
    """Decode with PyAV (sequential, keeps only the planned frames): for files decord cannot open or seek."""
    import av

    with av.open(path) as container:
        stream = container.streams.video[0]
        source_fps = float(stream.average_rate or stream.guessed_rate or 0)
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
    indices = plan(len(frames), source_fps)
    return np.stack([frames[i] for i in indices])


def sample_frames(path: str | Path, settings: VideoSettings = VideoSettings(), cache=None) -> SampledVideo:
    """Sample a clip at an exact fps and pixel budget.

    Args:
        path: a video file (anything decord or PyAV reads).
        settings: fps and pixel budget.
        cache: optional :class:`grounding_rl.data.cache.FrameCache`; a hit returns identical frames and metadata.

    Returns:
        :class:`SampledVideo` with uint8 frames (T, H, W, 3).

    Raises:
        VideoLoadError: the file is missing, unreadable by both decord and PyAV, or yields fewer than 2 frames.
    """
    path = str(Path(path).resolve())
    if not Path(path).is_file():
        raise VideoLoadError(f"{path}: no such video file")
    if cache is not None:
        hit = cache.get(path, settings)
        if hit is not None:
            return hit

    chosen: dict = {}

    def plan(total_frames: int, source_fps: float) -> list[int]:
        """Pick the source frame nearest each t_k = k / f; remembers what it chose."""
        if total_frames < 2 or not source_fps or source_fps <= 0:
            raise VideoLoadError(f"{path}: {total_frames} frame(s) at fps {source_fps}; need at least 2 frames")
        duration = total_frames / source_fps
        times, f = frame_times(num_sampled_frames(settings, total_frames, source_fps), duration, settings.fps)
        indices = np.minimum(np.round(times * source_fps).astype(np.int64), total_frames - 1).tolist()
        chosen.update(source_fps=source_fps, duration=duration, sampled_fps=f, indices=indices)
        return indices

    errors = []
    for decode in (_decode_decord, _decode_pyav):
        try:
            raw = decode(path, plan)
            break
        except VideoLoadError:
            raise
        except Exception as err:  # decord raises its own DECORDError types; fall back to PyAV
            errors.append(f"{decode.__name__[8:]}: {err}".strip())
    else:
        raise VideoLoadError(f"{path}: cannot read video ({'; '.join(errors)[:300]})")

    indices = chosen["indices"]
    height, width = frame_size(raw.shape[1], raw.shape[2], len(indices), settings)
    video = SampledVideo(
        path=path,
        frames=resize_frames(raw, height, width),
        source_fps=chosen["source_fps"],
        duration=chosen["duration"],
        frame_indices=indices,
        timestamps=[i / chosen["source_fps"] for i in indices],
        sampled_fps=chosen["sampled_fps"],
    )
    if cache is not None:
        cache.put(path, settings, video)
    return video


def resize_frames(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """One batched bicubic, antialiased resize of uint8 frames (T, h, w, 3) → (T, height, width, 3) uint8.

    Same interpolation as qwen-vl-utils (torchvision bicubic with antialias).
    """
    from torchvision.transforms.functional import InterpolationMode, resize

    if frames.shape[1] == height and frames.shape[2] == width:
        return np.ascontiguousarray(frames)
    tensor = torch.from_numpy(frames).permute(0, 3, 1, 2)
    out = resize(tensor, [height, width], interpolation=InterpolationMode.BICUBIC, antialias=True)
    return out.permute(0, 2, 3, 1).contiguous().numpy()


def seconds_per_grid(video: SampledVideo, temporal_patch_size: int = 2) -> float:
    """Qwen2.5-VL's ``second_per_grid_ts`` for this clip: temporal_patch_size / sampled_fps (1.0 at 2 fps)."""
    return temporal_patch_size / video.sampled_fps
