"""sample_window (and sample_frames) against a sequential PyAV decode: the same source frames, the same pixels, on
every clip in ../shared/data/videos and on a generated h264 High 4:4:4 Predictive clip whose key frames (every 2 s)
are x264 intra-refresh recovery points, where decord's ``get_batch`` seeks and returns grey frames with blocky debris
(mean absolute difference 78-106 per pixel). A 4:4:4 clip with plain IDR key frames decodes exactly with decord here
(decord 0.6, PyAV 18), so the generated clip uses intra-refresh to make decord's seeking land on an unclean start."""
import av
import numpy as np
import pytest
import torch

from grounding_rl.data.video import (
    VideoSettings,
    presentation_times,
    resize_frames,
    sample_frames,
    sample_window,
    seeks_cleanly,
)

torch.set_num_threads(1)

SHARED_CLIPS = ["charades_OHOFG.mp4", "mmaction2_basketball_drill.mp4", "mmaction2_kinetics_arm_wrestling.mp4",
                "decord_flipping_a_pancake.mkv", "mmaction2_pool_cleaning.mp4", "mmaction2_eye_makeup.avi"]
STARTS = (0.3, 2.6, 5.1, 8.2)  # seconds; all but the first after the generated clip's second key frame (2 s)
LENGTH = 1.5  # seconds per window
SMALL = VideoSettings(fps=2.0, min_pixels=4 * 28 * 28, max_pixels=16 * 28 * 28)
TOLERANCE = 2.0  # mean absolute difference per pixel value (0-255) allowed against the reference; measured: 0


def _write_444_clip(path, seconds=10, fps=25, width=96, height=64, gop=50):
    """An h264 yuv444p clip (x264 writes it as High 4:4:4 Predictive) with moving gradients and a "key frame" every
    ``gop`` frames: intra-refresh recovery points, flagged as key frames by the mp4 muxer."""
    yy, xx = np.mgrid[0:height, 0:width]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv444p"
        stream.options = {"g": str(gop), "x264-params": "intra-refresh=1"}
        for i in range(seconds * fps):
            img = np.stack([(xx * 2 + i * 3) % 256, (yy * 3 + i * 5) % 256, ((xx + yy) * 2 + i * 7) % 256], -1)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(img.astype(np.uint8), format="rgb24")))
        container.mux(stream.encode())
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.profile == "High 4:4:4 Predictive"
        keys = [p.pts * stream.time_base for p in container.demux(stream) if p.size and p.is_keyframe]
    assert len(keys) >= 4  # the sweep's windows start after the second one
    return path


@pytest.fixture(scope="module")
def clips(videos_dir, tmp_path_factory):
    generated = _write_444_clip(tmp_path_factory.mktemp("clip444") / "high444_intra_refresh.mp4")
    return [videos_dir / name for name in SHARED_CLIPS] + [generated]


def _sequential(path, indices):
    """The frames ``indices`` (display order) of one sequential PyAV decode, RGB at source size, and the count."""
    wanted, kept, count = set(indices), {}, 0
    with av.open(str(path)) as container:
        for count, frame in enumerate(container.decode(container.streams.video[0]), start=1):
            if count - 1 in wanted:
                kept[count - 1] = frame.to_ndarray(format="rgb24")
    return kept, count


@pytest.mark.parametrize("index", range(len(SHARED_CLIPS) + 1))
def test_windows_and_whole_clips_are_the_frames_of_a_sequential_decode(clips, index):
    path = clips[index]
    windows = []
    for start in STARTS:
        try:
            windows.append((sample_window(path, start, start + LENGTH, SMALL), start))
        except ValueError:  # past the end of a short clip (the 6.56 s AVI)
            assert start + 1.0 > 6.0
    assert len(windows) >= 3
    whole = sample_frames(path, SMALL)
    assert seeks_cleanly(str(path)) == (path.name in SHARED_CLIPS)
    reference, total = _sequential(path, sorted({i for w, _ in windows + [(whole, 0.0)] for i in w.frame_indices}))
    times = presentation_times(str(path), total, whole.source_fps)
    for window, start in windows + [(whole, 0.0)]:
        assert window.num_frames >= 2
        end = start + LENGTH if window.window else whole.duration
        for k, (i, frame) in enumerate(zip(window.frame_indices, window.frames)):
            assert window.timestamps[k] == pytest.approx(times[i])  # the same source frame, by presentation time
            assert start - 1 / window.source_fps <= times[i] <= end + 1 / window.source_fps
            expected = resize_frames(reference[i][None], frame.shape[0], frame.shape[1])[0]
            diff = float(np.abs(expected.astype(np.int16) - frame.astype(np.int16)).mean())
            assert diff < TOLERANCE, (path.name, start, i, diff)
