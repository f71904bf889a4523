"""Procedural demo clips: canonical splits, determinism, an event visible exactly from s to e, and
the background time code."""
import json

import numpy as np
import pytest

from grounding_rl.cli.demo_data import main
from grounding_rl.data.samples import load_samples
from grounding_rl.data.video import VideoSettings, sample_frames
from grounding_rl.dev.demo import (COLOURS, FPS, MAX_DURATION, MIN_DURATION, SHAPES, background_colour, clip_spec,
                                   generate_demo, render_frames)

DEMO_VIDEO = VideoSettings(fps=2.0, min_pixels=3136, max_pixels=3136)  # what configs/demo_sft.yaml uses


def test_splits_are_canonical(demo_dir):
    rows = [json.loads(line) for line in (demo_dir / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and len((demo_dir / "test.jsonl").read_text().splitlines()) == 4
    assert set(rows[0]) == {"video", "query", "start", "end", "duration", "qid", "source"}
    assert rows[0]["video"] == "videos/train_00000.mp4" and rows[0]["qid"] == "demo:train_00000"
    samples = load_samples(demo_dir / "train.jsonl")
    assert len(samples) == 8
    for s in samples:
        assert s.source == "demo"
        assert MIN_DURATION <= s.duration <= MAX_DURATION and s.duration.is_integer()
        assert 0 <= s.start < s.end <= s.duration
        assert s.start.is_integer() and s.end.is_integer()  # whole seconds: one video-token row each at 2 fps
        assert 2.0 <= s.end - s.start <= 0.5 * s.duration + 0.5
        assert abs(sample_frames(s.video, DEMO_VIDEO).duration - s.duration) < 1e-9


def test_same_seed_same_output_other_seed_differs(demo_dir, tmp_path):
    generate_demo(tmp_path / "again", num_train=8, num_test=4, seed=0, progress=False)
    for split in ("train", "test"):
        assert (tmp_path / "again" / f"{split}.jsonl").read_bytes() == (demo_dir / f"{split}.jsonl").read_bytes()
    for name in ("train_00003", "test_00001"):
        a = sample_frames(demo_dir / "videos" / f"{name}.mp4", DEMO_VIDEO).frames
        b = sample_frames(tmp_path / "again" / "videos" / f"{name}.mp4", DEMO_VIDEO).frames
        assert np.array_equal(a, b)
    # clip i does not depend on how many clips are generated; another seed changes the content
    assert clip_spec(0, "train", 3) == clip_spec(0, "train", 3)
    generate_demo(tmp_path / "other", num_train=8, num_test=0, seed=1, progress=False)
    assert (tmp_path / "other" / "train.jsonl").read_text() != (demo_dir / "train.jsonl").read_text()


def test_query_names_the_target_and_distractors_differ_in_colour():
    for index in range(50):
        spec = clip_spec(7, "train", index)
        assert f"{spec.target.colour} {spec.target.shape}" in spec.query
        assert spec.target.shape in SHAPES and 1 <= len(spec.distractors) <= 3
        assert all(d.colour != spec.target.colour for d in spec.distractors)
        assert len({d.colour for d in spec.distractors}) == len(spec.distractors)
    durations = {clip_spec(7, "train", i).duration for i in range(50)}
    assert durations == {float(d) for d in range(6, 13)}  # varied: every whole second in [6, 12]
    starts = {clip_spec(7, "train", i).start for i in range(50)}
    assert len(starts) >= 6


def _visible(frames: np.ndarray, rgb) -> np.ndarray:
    """Per frame: how many pixels are within 60 (L1 per channel max) of the colour."""
    diff = np.abs(frames.astype(np.int16) - np.array(rgb, np.int16)).max(-1)
    return (diff < 60).sum(axis=(1, 2))


def test_target_visible_exactly_from_start_to_end_at_2_fps(demo_dir):
    """After MPEG-4 coding and the 56x56 downscale, the target colour is present in a sampled frame iff
    start <= t < end; the distractors are present in every frame."""
    for s in load_samples(demo_dir / "train.jsonl")[:4]:
        spec = clip_spec(0, "train", int(s.qid.split("_")[-1]))
        video = sample_frames(s.video, DEMO_VIDEO)
        assert video.frames.shape[1:] == (56, 56, 3)
        times = np.asarray(video.timestamps)
        assert np.allclose(times, np.arange(len(times)) * 0.5)
        expected = (times >= s.start) & (times < s.end)
        counts = _visible(video.frames, COLOURS[spec.target.colour])
        assert np.array_equal(counts > 40, expected), (s.qid, counts, expected)
        assert counts[expected].min() > 100  # ≥ 3 % of a 56x56 frame
        for d in spec.distractors:
            assert _visible(video.frames, COLOURS[d.colour]).min() > 100


def test_render_frames_matches_the_interval():
    spec = clip_spec(0, "test", 2)
    frames = render_frames(spec)
    assert frames.shape == (int(spec.duration * FPS), 112, 112, 3) and frames.dtype == np.uint8
    shown = _visible(frames, COLOURS[spec.target.colour]) > 0
    t = np.arange(len(frames)) / FPS
    assert np.array_equal(shown, (t >= spec.start) & (t < spec.end))


def test_cli_writes_the_clips_in_linear_time(tmp_path, capsys):
    """``grounding-rl demo-data`` reports and writes every clip; twice the clips take about twice the time
    (t(2n) / t(n) < 3; 250 clips take ≈ 3 s on 2 cores)."""
    from conftest import assert_linear_time

    runs = iter(range(100))

    def run(n):
        out = tmp_path / f"run{next(runs)}"
        assert main(["--out", str(out), "--num-train", str(n), "--num-test", "0", "--seed", "3"]) == 0

    assert_linear_time(run, 10)  # the least of 3 calls each: a loaded machine once gave 4.0 with one
    capsys.readouterr()
    assert main(["--out", str(tmp_path / "split"), "--num-train", "20", "--num-test", "5", "--seed", "3"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["clips"] == 25
    assert len(list((tmp_path / "split" / "videos").glob("*.mp4"))) == 25


def test_background_time_code_steps_every_second():
    colours = background_colour(np.arange(0, 14, 0.5)).astype(int)
    assert colours.shape == (28, 3)
    assert np.array_equal(colours[0::2], colours[1::2])  # constant within a second
    assert len({tuple(c) for c in colours[:24]}) == 12 and np.array_equal(colours[24], colours[0])  # 12 s period
    assert colours[0].tolist() == [152, 92, 92]  # hue 0: grey 112 + 40·cos(0, -120°, 120°)
    shapes = np.array(list(COLOURS.values()))
    assert np.abs(shapes[:, None] - colours[None]).max(-1).min() >= 60  # no shape colour looks like the background
    spec = clip_spec(0, "train", 1)
    frames = render_frames(spec)
    seconds = np.arange(len(frames)) / FPS
    assert np.array_equal(frames[:, 0, 0], background_colour(seconds))  # (0, 0) is never inside a shape
    plain = render_frames(clip_spec(0, "train", 1, time_code=False))
    assert (plain[:, 0, 0] == plain[0, 0, 0]).all()
    # only the rendering changes: same interval, shapes and query
    assert clip_spec(0, "train", 1, time_code=False).query == spec.query
    assert np.array_equal(frames[:, 56, 56] == frames[:, 0, 0], plain[:, 56, 56] == plain[:, 0, 0])


def test_time_code_survives_coding_and_downscale(demo_dir):
    """The decoded 56x56 frames at 2 fps show each second's background colour (± a few levels)."""
    s = load_samples(demo_dir / "test.jsonl")[0]
    video = sample_frames(s.video, DEMO_VIDEO)
    corner = video.frames[:, :2, :2].reshape(len(video.frames), 4, 3).astype(int).mean(1)
    expected = background_colour(np.asarray(video.timestamps)).astype(int)
    assert np.abs(corner - expected).max() < 8, (corner, expected)


def test_multi_span_clips_show_the_target_in_one_to_three_windows(tmp_path, capsys):
    """``demo-data --multi-span``: every clip's target windows are 1-3 whole-second spans ≥ 1 s apart inside the
    clip, together 20-50 % of it; the canonical line carries ``spans`` exactly when there are several (``start`` /
    ``end`` their hull); the decoded 2-fps frames show the target exactly inside the windows; the single-span
    draws are unchanged."""
    from grounding_rl.dev.demo import multi_span_windows

    counts = {1: 0, 2: 0, 3: 0}
    for index in range(300):
        spec = clip_spec(0, "train", index, multi_span=True)
        windows = spec.windows
        counts[len(windows)] += 1
        assert all(float(t).is_integer() for span in windows for t in span)
        assert windows[0][0] >= 0 and windows[-1][1] <= spec.duration
        assert all(s < e for s, e in windows)
        assert all(windows[k][1] + 1 <= windows[k + 1][0] for k in range(len(windows) - 1))
        total = sum(e - s for s, e in windows)
        assert max(len(windows), round(0.2 * spec.duration)) <= total <= round(0.5 * spec.duration)
        assert (spec.start, spec.end) == (windows[0][0], windows[-1][1])
        assert (spec.spans is None) == (len(windows) == 1)
    assert min(counts.values()) >= 80, counts  # k uniform on {1, 2, 3}
    assert clip_spec(0, "train", 5) == clip_spec(0, "train", 5, multi_span=False)
    # clip 3 of seed 0: three windows (hand-checked against the rendering below)
    assert clip_spec(0, "train", 3, multi_span=True).spans == ((0.0, 1.0), (4.0, 5.0), (9.0, 11.0))

    with pytest.raises(ValueError, match="at least 5 s"):
        multi_span_windows(np.random.default_rng(0), 4)

    out = tmp_path / "multi"
    assert main(["--out", str(out), "--num-train", "6", "--num-test", "2", "--multi-span"]) == 0
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    samples = load_samples(out / "train.jsonl")
    for row, s in zip(rows, samples, strict=True):
        spec = clip_spec(0, "train", int(s.qid.split("_")[-1]), multi_span=True)
        assert ("spans" in row) == (spec.spans is not None)
        assert s.gt_spans() == spec.windows and (s.start, s.end) == (spec.start, spec.end)
        video = sample_frames(out / s.video, DEMO_VIDEO)
        times = np.asarray(video.timestamps)
        expected = np.zeros(len(times), bool)
        for start, end in spec.windows:
            expected |= (times >= start) & (times < end)
        shown = _visible(video.frames, COLOURS[spec.target.colour]) > 40
        assert np.array_equal(shown, expected), (s.qid, shown, expected)
    assert any("spans" in row for row in rows)
    capsys.readouterr()
    with pytest.raises(SystemExit) as err:
        main(["--out", str(tmp_path / "bad"), "--long", "--multi-span"])
    assert err.value.code == 2
    assert "do not combine" in capsys.readouterr().err


def test_demo_data_replaces_its_own_folder_and_refuses_a_users_files(tmp_path, capsys):
    """A rerun into its own folder (demo_data.json) replaces it without a flag, another seed's clips included (only
    the files the record lists are removed); a user's train.jsonl / test.jsonl beside nothing of demo-data's is refused
    in one line naming the folder and the file, untouched; --overwrite writes over them."""
    from grounding_rl.cli import main as cli

    own = tmp_path / "own"
    assert cli(["demo-data", "--out", str(own), "--num-train", "3", "--num-test", "1", "--seed", "0"]) == 0
    (own / "videos" / "train_00009.mp4").write_bytes(b"old")  # a clip of an earlier, larger run (listed)
    record = json.loads((own / "demo_data.json").read_text())
    assert record["files"] == ["test.jsonl", "train.jsonl", "videos/test_00000.mp4", "videos/train_00000.mp4",
                               "videos/train_00001.mp4", "videos/train_00002.mp4"]
    (own / "demo_data.json").write_text(json.dumps({**record, "files": record["files"] + ["videos/train_00009.mp4"]}))
    first = (own / "train.jsonl").read_text()
    assert cli(["demo-data", "--out", str(own), "--num-train", "2", "--num-test", "1", "--seed", "1"]) == 0
    assert (own / "train.jsonl").read_text() != first and len((own / "train.jsonl").read_text().splitlines()) == 2
    assert sorted(p.name for p in (own / "videos").iterdir()) == ["test_00000.mp4", "train_00000.mp4",
                                                                  "train_00001.mp4"]
    capsys.readouterr()

    user = tmp_path / "mine"
    user.mkdir()
    for name in ("train.jsonl", "test.jsonl"):
        (user / name).write_text('{"video": "a.mp4", "query": "mine"}\n')
    assert cli(["demo-data", "--out", str(user), "--num-train", "1", "--num-test", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"grounding-rl demo-data: error: --out {user} holds files demo-data did not write (test.jsonl and "
                   "1 more); give a new or empty --out, or --overwrite to write over it")
    assert sorted(p.name for p in user.iterdir()) == ["test.jsonl", "train.jsonl"]
    assert (user / "train.jsonl").read_text() == '{"video": "a.mp4", "query": "mine"}\n'
    assert cli(["demo-data", "--out", str(user), "--num-train", "1", "--num-test", "1", "--overwrite"]) == 0
    assert "demo" in (user / "train.jsonl").read_text() and (user / "demo_data.json").is_file()

    (own / "demo_data.json").unlink()  # a folder demo-data wrote before it left a record: still its own
    assert cli(["demo-data", "--out", str(own), "--num-train", "1", "--num-test", "1", "--seed", "2"]) == 0
    assert sorted(p.name for p in (own / "videos").iterdir()) == ["test_00000.mp4", "train_00000.mp4"]
