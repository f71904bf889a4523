"""Frame cache: hits are identical, keys follow the file and settings, size bound, atomic writes."""
import json
import multiprocessing as mp
import os

import numpy as np
import pytest

from grounding_rl.data import video as V
from grounding_rl.data.cache import FrameCache
from grounding_rl.data.video import SampledVideo, VideoSettings, sample_frames

SETTINGS = VideoSettings(fps=2.0, max_pixels=448 * 448)


def fake_clip(path, t=4, value=7) -> SampledVideo:
    """A small SampledVideo (T=t, 28x56) with distinctive metadata."""
    frames = np.full((t, 28, 56, 3), value, np.uint8)
    frames[0, 0, 0] = [1, 2, 3]
    return SampledVideo(
        path=str(path), frames=frames, source_fps=10000 / 1049, duration=35.1415, frame_indices=list(range(0, 5 * t, 5)),
        timestamps=[i * 1049 / 10000 for i in range(0, 5 * t, 5)], sampled_fps=2.0, backend="pyav",
    )


@pytest.fixture
def video_file(tmp_path):
    path = tmp_path / "clip.mp4"
    path.write_bytes(b"stand-in for a video file")
    return path


def test_real_clip_hit_is_identical_and_skips_decoding(videos_dir, tmp_path, monkeypatch):
    cache = FrameCache(tmp_path / "cache", max_bytes=2**30)
    path = videos_dir / "mmaction2_eye_makeup.avi"
    cold = sample_frames(path, SETTINGS, cache=cache)

    def no_decoding(*args):
        raise AssertionError("decoded on a cache hit")

    monkeypatch.setattr(V, "_decode_decord", no_decoding)
    monkeypatch.setattr(V, "_decode_pyav", no_decoding)
    hit = sample_frames(path, SETTINGS, cache=cache)
    assert hit is not cold
    np.testing.assert_array_equal(hit.frames, cold.frames)
    assert hit.frames.dtype == np.uint8 and hit.frames.shape == (12, 280, 392, 3)
    for name in ("path", "source_fps", "duration", "frame_indices", "timestamps", "sampled_fps", "backend"):
        assert getattr(hit, name) == getattr(cold, name), name
    # no pickle anywhere: plain .npy (loads with allow_pickle=False) and JSON
    files = sorted(p.suffix for p in (tmp_path / "cache").iterdir())
    assert files == [".json", ".npy"]
    npy = next((tmp_path / "cache").glob("*.npy"))
    assert np.load(npy, allow_pickle=False).shape == (12, 280, 392, 3)


def test_key_follows_settings_size_and_mtime(tmp_path, video_file):
    cache = FrameCache(tmp_path / "cache", max_bytes=2**20)
    assert cache.get(video_file, SETTINGS) is None
    assert cache.put(video_file, SETTINGS, fake_clip(video_file))
    assert cache.get(video_file, SETTINGS).frame_indices == [0, 5, 10, 15]
    assert cache.get(video_file, VideoSettings(fps=1.0, max_pixels=448 * 448)) is None
    stat = video_file.stat()
    os.utime(video_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert cache.get(video_file, SETTINGS) is None  # same bytes, newer mtime
    cache.put(video_file, SETTINGS, fake_clip(video_file))
    video_file.write_bytes(b"a different, longer stand-in file")
    assert cache.get(video_file, SETTINGS) is None  # size changed
    assert cache.get(tmp_path / "missing.mp4", SETTINGS) is None


def test_eviction_drops_least_recently_used(tmp_path):
    paths = [tmp_path / f"v{i}.mp4" for i in range(3)]
    for i, p in enumerate(paths):
        p.write_bytes(bytes([i]) * 10)
    one_entry = 4 * 28 * 56 * 3 + 128 + 1200  # frames + .npy header + JSON (under)
    cache = FrameCache(tmp_path / "cache", max_bytes=2 * one_entry + 500)
    cache.put(paths[0], SETTINGS, fake_clip(paths[0], value=0))
    cache.put(paths[1], SETTINGS, fake_clip(paths[1], value=1))
    meta0 = next(m for m in (tmp_path / "cache").glob("*.json") if json.loads(m.read_text())["key"]["path"].endswith("v0.mp4"))
    os.utime(meta0, (1, 1))  # v0 used long ago ...
    assert cache.get(paths[0], SETTINGS) is not None  # ... and now again: v1 is the least recently used
    cache.put(paths[2], SETTINGS, fake_clip(paths[2], value=2))
    assert cache.get(paths[1], SETTINGS) is None
    assert cache.get(paths[0], SETTINGS).frames[0, 1, 1, 0] == 0 and cache.get(paths[2], SETTINGS) is not None
    assert len(cache.entries()) == 2 and cache.size_bytes() <= cache.max_bytes
    assert len(list((tmp_path / "cache").iterdir())) == 4  # no temporary files left behind


def test_oversized_entry_is_not_stored(tmp_path, video_file):
    cache = FrameCache(tmp_path / "cache", max_bytes=1000)
    assert cache.put(video_file, SETTINGS, fake_clip(video_file)) is False
    assert list((tmp_path / "cache").iterdir()) == []
    with pytest.raises(ValueError, match="max_bytes"):
        FrameCache(tmp_path / "c2", max_bytes=0)


def test_damaged_entry_is_a_miss(tmp_path, video_file):
    cache = FrameCache(tmp_path / "cache", max_bytes=2**20)
    cache.put(video_file, SETTINGS, fake_clip(video_file))
    npy = next((tmp_path / "cache").glob("*.npy"))
    npy.write_bytes(npy.read_bytes()[:200])
    assert cache.get(video_file, SETTINGS) is None
    cache.put(video_file, SETTINGS, fake_clip(video_file))  # rewritten whole
    assert cache.get(video_file, SETTINGS).frames.shape == (4, 28, 56, 3)


def _writer(root, path, value, rounds):
    cache = FrameCache(root, max_bytes=2**20)
    for _ in range(rounds):
        cache.put(path, SETTINGS, fake_clip(path, t=8, value=value))
        got = cache.get(path, SETTINGS)
        assert got is not None and got.frames.shape == (8, 28, 56, 3)


def test_concurrent_writers_leave_one_complete_entry(tmp_path, video_file):
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(tmp_path / "cache", video_file, 9, 15)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    got = FrameCache(tmp_path / "cache", max_bytes=2**20).get(video_file, SETTINGS)
    assert got.frames.shape == (8, 28, 56, 3) and int(got.frames[1].max()) == 9
    assert sorted(p.suffix for p in (tmp_path / "cache").iterdir()) == [".json", ".npy"]
