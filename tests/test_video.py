"""Frame sampler on the six real clips in ../shared/data/videos, and its pure functions."""
import math

import numpy as np
import pytest
import torch

from grounding_rl.data import video as V
from grounding_rl.data.video import (
    VideoLoadError,
    VideoSettings,
    frame_size,
    frame_times,
    resize_frames,
    sample_frames,
    sample_indices,
)

torch.set_num_threads(1)

CLIPS = [
    "charades_OHOFG.mp4",  # 9.53 fps (10000/1049)
    "mmaction2_basketball_drill.mp4",  # 29.97 fps
    "mmaction2_kinetics_arm_wrestling.mp4",
    "decord_flipping_a_pancake.mkv",  # mkv without per-stream duration
    "mmaction2_pool_cleaning.mp4",
    "mmaction2_eye_makeup.avi",  # mpeg4 ASP, first pts 0.04
]
# The benchmark settings and TimeZero's (total_pixels turns into a per-frame maximum).
BENCH = VideoSettings(fps=2.0, max_pixels=448 * 448)
TIMEZERO = VideoSettings(fps=2.0, min_pixels=16 * 28 * 28, total_pixels=3584 * 28 * 28)


@pytest.fixture(scope="module")
def sampled(videos_dir):
    """Each clip sampled once with the benchmark settings."""
    return {name: sample_frames(videos_dir / name, BENCH) for name in CLIPS}


@pytest.fixture(scope="module")
def qwen_fetch():
    """``qwen_vl_utils.fetch_video`` forced onto its decord backend."""
    import qwen_vl_utils.vision_process as qv

    saved = qv.get_video_reader_backend
    qv.get_video_reader_backend = lambda: "decord"
    yield qv.fetch_video
    qv.get_video_reader_backend = saved


@pytest.mark.parametrize("name", CLIPS)
def test_invariants_and_exact_time_scale(sampled, name):
    video = sampled[name]
    t, h, w, c = video.frames.shape
    assert video.frames.dtype == np.uint8 and c == 3
    assert t % 2 == 0 and h % 28 == 0 and w % 28 == 0
    assert len(video.frame_indices) == len(video.timestamps) == t
    assert video.sampled_fps == 2.0  # all clips are long enough for T = floor2(2 * duration) frames
    assert t == 2 * math.floor(video.duration * 2.0 / 2)
    interval = 1.0 / video.source_fps
    for k, ts in enumerate(video.timestamps):
        assert abs(ts - k / video.sampled_fps) <= interval / 2 + 1e-9, (name, k, ts)
    assert video.timestamps[0] == 0.0  # counted from the first decoded frame, whatever the container's start
    assert video.backend == "decord"


def test_known_clip_facts(sampled):
    ohofg = sampled["charades_OHOFG.mp4"]
    assert ohofg.source_fps == pytest.approx(10000 / 1049)
    assert ohofg.frames.shape == (70, 336, 588, 3)
    assert ohofg.duration == pytest.approx(335 * 1049 / 10000)
    # t = 0, 0.5, 1.0, 1.5 s at 9.533 fps -> frames 0, 4.77, 9.53, 14.30 -> 0, 5, 10, 14
    assert ohofg.frame_indices[:4] == [0, 5, 10, 14]
    assert ohofg.timestamps[1] == pytest.approx(5 * 1049 / 10000)
    assert sampled["decord_flipping_a_pancake.mkv"].duration == pytest.approx(310 / 30)
    makeup = sampled["mmaction2_eye_makeup.avi"]
    assert makeup.duration == pytest.approx(6.56) and makeup.frames.shape[0] == 12
    assert makeup.frame_indices[1] == 12 and makeup.timestamps[1] == pytest.approx(0.48)


@pytest.mark.parametrize("settings", [BENCH, TIMEZERO], ids=["bench", "timezero"])
def test_shapes_equal_qwen_vl_utils_fetch_video(videos_dir, sampled, qwen_fetch, settings):
    """(T, H, W) equals fetch_video's output shape (decord backend) with the same settings, for every clip."""
    ele_settings = {k: v for k, v in settings.to_dict().items() if v is not None}
    for name in CLIPS:
        ours = sampled[name] if settings == BENCH else sample_frames(videos_dir / name, settings)
        theirs = qwen_fetch({"video": str(videos_dir / name), **ele_settings})
        assert (theirs.shape[0], theirs.shape[2], theirs.shape[3]) == ours.frames.shape[:3], name


def test_pyav_fallback_gives_the_same_clip(videos_dir, sampled, monkeypatch):
    """When decord fails, PyAV decodes the same frames (sequential decoding, so also a check of decord's seeking)."""

    def broken(*args):
        raise RuntimeError("decord cannot seek")

    monkeypatch.setattr(V, "_decode_decord", broken)
    for name in ["charades_OHOFG.mp4", "decord_flipping_a_pancake.mkv", "mmaction2_eye_makeup.avi"]:
        ours, ref = sample_frames(videos_dir / name, BENCH), sampled[name]
        assert ours.backend == "pyav"
        assert ours.frame_indices == ref.frame_indices and ours.timestamps == ref.timestamps, name
        assert ours.source_fps == pytest.approx(ref.source_fps) and ours.duration == pytest.approx(ref.duration)
        np.testing.assert_array_equal(ours.frames, ref.frames, err_msg=name)


@pytest.mark.parametrize("name", ["charades_OHOFG.mp4", "mmaction2_basketball_drill.mp4"])
def test_chunked_decoding_gives_the_frames_of_one_batch(videos_dir, sampled, monkeypatch, name):
    """Decoding and resizing CHUNK_FRAMES source frames at a time (bounded memory) changes no frame."""
    monkeypatch.setattr(V, "CHUNK_FRAMES", 3)
    ours, ref = sample_frames(videos_dir / name, BENCH), sampled[name]
    assert ref.num_frames > 3 and ours.frame_indices == ref.frame_indices
    np.testing.assert_array_equal(ours.frames, ref.frames)
    monkeypatch.setattr(V, "CHUNK_FRAMES", 10_000)
    np.testing.assert_array_equal(sample_frames(videos_dir / name, BENCH).frames, ref.frames)


def test_truncated_file_names_the_file(videos_dir, tmp_path):
    bad = tmp_path / "first_megabyte.mp4"
    bad.write_bytes((videos_dir / "charades_OHOFG.mp4").read_bytes()[: 2**20])
    with pytest.raises(VideoLoadError, match="first_megabyte.mp4"):
        sample_frames(bad, BENCH)


def test_missing_and_non_video_files(tmp_path):
    with pytest.raises(VideoLoadError, match="nope.mp4: no such video file"):
        sample_frames(tmp_path / "nope.mp4")
    text = tmp_path / "notes.mp4"
    text.write_text("not a video\n")
    with pytest.raises(VideoLoadError, match=r"notes\.mp4: cannot read video \(decord: .*; pyav: "):
        sample_frames(text)


def test_single_frame_video_is_an_error(tmp_path):
    import av

    path = tmp_path / "one_frame.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        frame = av.VideoFrame.from_ndarray(np.zeros((48, 64, 3), np.uint8), format="rgb24")
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with pytest.raises(VideoLoadError, match=r"one_frame\.mp4: .*1 frame\(s\)"):
        sample_frames(path)


def test_frame_times_exact_scale_and_caps():
    times, f = frame_times(20, 10.0, 2.0)
    assert f == 2.0 and times[1] == 0.5 and times[-1] == 9.5
    times, f = frame_times(768, 3600.0, 2.0)  # max_frames caps T: stretch over the clip
    assert f == pytest.approx(768 / 3600.0) and times[-1] == pytest.approx(767 * 3600.0 / 768)
    times, f = frame_times(4, 1.5, 2.0)  # min_frames raises T above what fits at 2 fps
    assert f == pytest.approx(4 / 1.5) and times[-1] < 1.5


def test_sample_indices():
    indices, f = sample_indices(335, 10000 / 1049, VideoSettings())
    assert len(indices) == 70 and f == 2.0 and indices[-1] == round(34.5 * 10000 / 1049)
    indices, f = sample_indices(108_000, 30.0, VideoSettings(max_frames=100))  # one hour at 30 fps
    assert len(indices) == 100 and f == pytest.approx(100 / 3600) and indices[1] == 1080 and indices[-1] < 108_000
    indices, f = sample_indices(30, 10.0, VideoSettings(fps=2.0, min_frames=8))  # 3 s clip, 6 < min_frames
    assert len(indices) == 8 and f == pytest.approx(8 / 3.0) and indices[-1] == round(7 * 30 / 8)
    with pytest.raises(ValueError, match="1 frame"):
        sample_indices(1, 25.0, VideoSettings())


def test_frame_size_total_pixels_rule():
    """qwen-vl-utils 0.0.14 fetch_video: per-frame max = max(min(602112, total / T * 2), int(min_pixels * 1.05))."""
    # 2,809,856 / 70 * 2 = 80,281.6 px per frame; beta = sqrt(230,400 / 80,281.6) = 1.694 -> 196 x 364
    assert frame_size(360, 640, 70, TIMEZERO) == (196, 364)
    assert frame_size(360, 640, 70, BENCH) == (336, 588)  # 448^2 cap
    assert frame_size(240, 426, 20, BENCH) == (252, 420)  # min_pixels 100,352 scales small frames up
    # a long clip: the budget would give < 12,544 * 1.05 px, the floor wins -> 13,171 px per frame at most
    h, w = frame_size(360, 640, 768, TIMEZERO)
    assert h * w <= int(12544 * 1.05) and (h, w) == (84, 140)


def test_resize_matches_torchvision_filter(sampled, videos_dir):
    """The uint8 kernel computes qwen-vl-utils' bicubic antialiased filter up to rounding."""
    from torchvision.transforms.functional import InterpolationMode, resize

    import decord

    video = sampled["charades_OHOFG.mp4"]
    raw = decord.VideoReader(str(videos_dir / "charades_OHOFG.mp4")).get_batch(video.frame_indices[:4]).asnumpy()
    ours = resize_frames(raw, 336, 588)
    ref = resize(torch.from_numpy(raw).permute(0, 3, 1, 2), [336, 588], InterpolationMode.BICUBIC, antialias=True)
    diff = np.abs(ours.astype(np.int16) - ref.permute(0, 2, 3, 1).numpy().astype(np.int16))
    assert ours.shape == (4, 336, 588, 3) and diff.mean() < 0.3 and (diff > 1).mean() < 1e-3
    np.testing.assert_array_equal(ours, video.frames[:4])


def test_frames_do_not_depend_on_decoder_threads(videos_dir, sampled):
    assert 1 <= V.decode_threads() <= 8
    for name in ["mmaction2_eye_makeup.avi", "decord_flipping_a_pancake.mkv"]:
        one = sample_frames(videos_dir / name, BENCH, num_threads=1)
        np.testing.assert_array_equal(one.frames, sampled[name].frames, err_msg=name)


def test_contradictory_settings_are_rejected():
    with pytest.raises(ValueError, match="min_pixels"):
        VideoSettings(min_pixels=100352, max_pixels=50176)
    with pytest.raises(ValueError, match="fps"):
        VideoSettings(fps=0.0)


# ------------------------------------------------------------------------------------ video_sampler: qwen_vl_utils
def _largest_time_gap(clip) -> float:
    """Largest |claimed time k / sampled_fps − true time index / source_fps| over the sampled frames, seconds."""
    claimed = np.arange(clip.num_frames) / clip.sampled_fps
    return float(np.abs(claimed - np.asarray(clip.timestamps)).max())


@pytest.fixture(scope="module")
def both_samplers(videos_dir, qwen_fetch):
    """Each clip under TimeZero's settings with each sampler (qwen_vl_utils on its decord backend)."""
    import dataclasses

    qwen = dataclasses.replace(TIMEZERO, sampler="qwen_vl_utils")
    return {name: (sample_frames(videos_dir / name, TIMEZERO), sample_frames(videos_dir / name, qwen))
            for name in CLIPS}


def test_qwen_vl_utils_sampler_is_fetch_video(videos_dir, both_samplers, qwen_fetch):
    name = "charades_OHOFG.mp4"
    ours = both_samplers[name][1]
    element = {"video": str(videos_dir / name), "fps": 2.0, "min_pixels": 16 * 28 * 28,
               "total_pixels": 3584 * 28 * 28}
    (frames, metadata), claimed_fps = qwen_fetch(element, return_video_sample_fps=True, return_video_metadata=True)
    assert torch.equal(torch.from_numpy(ours.frames).permute(0, 3, 1, 2), frames.to(torch.uint8))
    assert ours.sampled_fps == claimed_fps == pytest.approx(70 / 335 * 10000 / 1049)  # T / total · fps
    total = metadata["total_num_frames"]
    assert ours.frame_indices == np.round(np.linspace(0, total - 1, ours.num_frames)).astype(int).tolist()
    assert ours.backend == "qwen_vl_utils/decord"


def test_time_gap_of_each_sampler(both_samplers):
    """The numbers of docs/BENCHMARKS.md: ours within half a source frame of the claimed time on every clip;
    qwen-vl-utils reports n / total · fps for frames taken at linspace(0, total − 1, n)."""
    gaps = {name: (_largest_time_gap(exact), _largest_time_gap(qwen)) for name, (exact, qwen) in both_samplers.items()}
    assert all(exact <= 0.053 for exact, _ in gaps.values()), gaps
    assert gaps["charades_OHOFG.mp4"][1] == pytest.approx(0.412, abs=1e-3)
    assert gaps["mmaction2_eye_makeup.avi"][1] == pytest.approx(0.507, abs=1e-3)
    assert all(qwen > 0.4 for _, qwen in gaps.values())


def test_qwen_vl_utils_sampler_failure_is_one_line_naming_the_clip(tmp_path):
    text = tmp_path / "notes.mp4"
    text.write_text("not a video\n")
    with pytest.raises(VideoLoadError, match=r"notes\.mp4: qwen_vl_utils\.fetch_video cannot read it \(") as err:
        sample_frames(text, VideoSettings(sampler="qwen_vl_utils"))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="sampler"):
        VideoSettings(sampler="linspace")
