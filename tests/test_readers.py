"""Annotation readers and the validation policy: the real benchmark files with the counts of
the issue, plus small synthetic cases for the path, qid, duration and whitespace rules."""
import json

import pytest

from grounding_rl.data.probe import VideoProbeError, probe_duration
from grounding_rl.data.readers import READERS, load_durations, read_annotations
from grounding_rl.data.samples import (AnnotationError, Sample, iter_samples, load_samples, validate, validate_sample,
                                       write_samples)

CHARADES_JSON = "charades_sta/charades.json"

# (format, annotation file, durations file, kept, dropped, clamped), as ../shared/README.md gives them.
CASES = {
    "charades_test": ("charades_sta", "charades_sta/charades_sta_test.txt", CHARADES_JSON, 3720, 0, 562),
    "charades_train": ("charades_sta", "charades_sta/charades_sta_train.txt", CHARADES_JSON, 12408, 0, 1802),
    "timezero_charades_train": ("activitynet", "timezero/charades/train.json", None, 12404, 4, 1786),
    "activitynet_train": ("activitynet", "activitynet_captions/train.json", None, 37417, 4, 261),
    "activitynet_val_1": ("activitynet", "activitynet_captions/val_1.json", None, 17505, 0, 134),
    "activitynet_val_2": ("activitynet", "activitynet_captions/val_2.json", None, 17031, 0, 111),
    "tacos_train": ("tacos", "tacos/train.json", None, 9790, 0, 43),
    "tacos_test": ("tacos", "tacos/test.json", None, 4001, 0, 5),
    "time_r1_train": ("time_r1", "time_r1/train_2k5.json", None, 2500, 0, 48),
    "tvgbench": ("tvgbench", "time_r1/tvgbench.json", None, 789, 11, 27),
    "charades_cd_ood": ("activitynet", "timezero/charades_sta_splits/charades_test_ood.json", None, 3375, 0, 348),
}


@pytest.fixture(scope="module")
def parsed(benchmarks_dir):
    """Each benchmark file read once per module: name -> (raw samples, kept samples, counts)."""
    cache = {}

    def get(name):
        if name not in cache:
            fmt, rel, durations, *_ = CASES[name]
            raw = list(read_annotations(fmt, benchmarks_dir / rel,
                                        durations=benchmarks_dir / durations if durations else None))
            kept, counts = validate(raw)
            cache[name] = raw, kept, counts
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(CASES))
def test_counts_on_the_real_files(parsed, name):
    fmt, _, _, kept, dropped, clamped = CASES[name]
    raw, samples, counts = parsed(name)
    assert counts == {"kept": kept, "dropped": dropped, "clamped": clamped}
    assert len(raw) == kept + dropped
    assert len({s.qid for s in samples}) == len(samples)  # qids are unique
    assert all(s.source == fmt for s in samples)
    assert all(0 <= s.start <= s.end <= s.duration for s in samples)
    assert sum(s.start == s.end for s in samples) == (3 if name == "charades_cd_ood" else 0)
    assert all(s.query == s.query.strip() and s.query for s in samples)


def test_charades_sta_values(parsed, benchmarks_dir):
    raw, samples, _ = parsed("charades_test")
    first = samples[0]
    assert first == Sample(video=str(benchmarks_dir / "charades_sta" / "3MSZA.mp4"), query="person turn a light on.",
                           start=24.3, end=30.4, duration=30.96, qid="charades_sta:3MSZA#0", source="charades_sta",
                           raw_start=24.3, raw_end=30.4)
    assert samples[1].qid == "charades_sta:3MSZA#1"  # index counts per video
    clamped = [(r, s) for r, s in zip(raw, samples) if r.end > r.duration]
    assert len(clamped) == 562
    assert all(s.end == r.duration and s.start == r.start for r, s in clamped)
    # the annotation as written stays beside the clamped times (the standard scoring reads it), also in JSONL
    assert all((s.raw_start, s.raw_end) == (r.start, r.end) for r, s in clamped)
    line = json.loads(clamped[0][1].to_json())
    assert (line["end"], line["raw_end"]) == (clamped[0][0].duration, clamped[0][0].end)


def test_activitynet_values_and_speed(parsed, benchmarks_dir, tmp_path):
    raw, samples, _ = parsed("activitynet_train")
    by_qid = {s.qid: s for s in samples}
    second = by_qid["activitynet:v_QOlSCBRmfWY#1"]
    assert raw[1].query.startswith(" The girl")  # the file has a leading space ...
    assert second.query == "The girl dances around the room while the camera captures her movements."  # ... stripped
    assert (second.start, second.end, second.duration) == (17.37, 60.81, 82.73)
    assert second.video == str(benchmarks_dir / "activitynet_captions" / "v_QOlSCBRmfWY.mp4")
    assert "activitynet:v_N7ppHQNikv8#2" not in by_qid  # 34.77-34.77 is dropped
    # reading and validating is linear in the file: its first n and 2n videos, t(2n) / t(n) < 3
    from conftest import assert_linear_time

    videos = list(json.loads((benchmarks_dir / "activitynet_captions" / "train.json").read_text()).items())
    for n in (2000, 4000):
        (tmp_path / f"first_{n}.json").write_text(json.dumps(dict(videos[:n])))
    assert_linear_time(lambda n: validate(list(read_annotations("activitynet", tmp_path / f"first_{n}.json"))), 2000)


def test_tacos_frames_to_seconds(parsed, benchmarks_dir):
    _, samples, _ = parsed("tacos_test")
    first = samples[0]
    assert first.qid == "tacos:s30-d52.avi#0" and first.query == "She took out kiwi"
    assert first.start == pytest.approx(141 / 29.4) and first.end == pytest.approx(354 / 29.4)
    assert first.duration == pytest.approx(7346 / 29.4)
    assert first.video == str(benchmarks_dir / "tacos" / "s30-d52.avi")  # has an extension: kept as is


def test_time_r1_keeps_source_qids(parsed, benchmarks_dir):
    _, samples, _ = parsed("time_r1_train")
    first = samples[0]
    assert first.qid == ("my|cosmo|QtWT8rxUuNk|A purple hanger on a purple background demonstrates how to hang a "
                         "sweater.")
    assert (first.start, first.end, first.duration) == (1.0, 4.0, 93.2932)
    # "./dataset/..." is relative: resolved (and normalised) against the annotation file's folder
    assert first.video == str(benchmarks_dir / "time_r1" / "dataset/timer1/videos/timerft_data/QtWT8rxUuNk.mp4")


def test_tvgbench_answers(parsed):
    raw, samples, _ = parsed("tvgbench")
    assert len(raw) == 800
    assert (samples[0].start, samples[0].end, samples[0].duration) == (13.4, 28.1, 30.12)
    assert samples[0].qid == "tvgbench:KWZSA#0"
    assert sum(r.start == r.end for r in raw) == 11  # the 11 drops are the zero-length answers


def test_charades_cd_uses_video_duration(parsed):
    _, samples, _ = parsed("charades_cd_ood")
    first = samples[0]
    assert (first.qid, first.start, first.end, first.duration) == ("activitynet:N14BK#0", 39.3, 45.0, 47.625)


def test_segment_after_the_video_end_becomes_the_end_point(parsed):
    """Charades-CD ood has 3 queries starting after the video's end (LEOL6 7-8 s of 6.375 s; AKKWU 13-38 s of
    12.31 s). They are kept, clamped to the zero-length interval (duration, duration), never start > end."""
    raw, samples, _ = parsed("charades_cd_ood")
    outside = sorted(r.qid for r in raw if r.start >= r.duration)
    assert outside == ["activitynet:AKKWU#0", "activitynet:AKKWU#1", "activitynet:LEOL6#0"]
    by_qid = {s.qid: s for s in samples}
    assert (by_qid["activitynet:LEOL6#0"].start, by_qid["activitynet:LEOL6#0"].end) == (6.375, 6.375)
    assert all(s.start <= s.end for s in samples)


# ----------------------------------------------------------------------------------------------- validation policy
def _sample(start, end, duration=10.0, query="q", qid="x"):
    return Sample(video="v.mp4", query=query, start=start, end=end, duration=duration, qid=qid, source="t")


@pytest.mark.parametrize("start,end,duration,expected,status", [
    (1.0, 2.0, 10.0, (1.0, 2.0), "kept"),
    (1.0, 12.0, 10.0, (1.0, 10.0), "clamped"),  # end > duration
    (-0.5, 2.0, 10.0, (0.0, 2.0), "clamped"),  # start < 0
    (-1.0, 11.0, 10.0, (0.0, 10.0), "clamped"),  # both: counted once
    (2.0, 2.0, 10.0, None, "dropped"),  # start == end
    (3.0, 2.0, 10.0, None, "dropped"),  # start > end
    (11.0, 12.0, 10.0, (10.0, 10.0), "clamped"),  # wholly after the end → the end point
    (-3.0, -1.0, 10.0, (0.0, 0.0), "clamped"),  # wholly before 0 → the start point, never (0, -1)
    (-1.0, 0.0, 10.0, (0.0, 0.0), "clamped"),  # ends at 0
    (10.0, 10.0, 10.0, (10.0, 10.0), "kept"),  # what the policy itself wrote for an event after the end
    (0.0, 0.0, 10.0, (0.0, 0.0), "kept"),
    (1.0, float("nan"), 10.0, None, "dropped"),
    (1.0, 2.0, 0.0, None, "dropped"),
])
def test_validate_sample_policy(start, end, duration, expected, status):
    new, got = validate_sample(_sample(start, end, duration))
    assert got.split(":")[0] == status
    assert (None if new is None else (new.start, new.end)) == expected


@pytest.mark.parametrize("start,end", [(-3.0, -1.0), (-1.0, 0.0), (11.0, 12.0), (10.0, 10.0), (0.0, 0.0),
                                       (10.0, 11.0)])
def test_training_drops_intervals_outside_the_video(start, end):
    new, status = validate_sample(_sample(start, end, 10.0), training=True)
    assert new is None and "outside the video" in status
    assert validate_sample(_sample(-1.0, 3.0, 10.0), training=True)[0].start == 0.0  # overlapping: clamped, kept


def test_the_policy_is_stable_under_itself():
    """Every interval of a grid around the video's edges: what the policy returns comes back unchanged, in both
    modes, and is never inverted."""
    points = [-3.0, -1.0, 0.0, 0.5, 5.0, 9.5, 10.0, 11.0, 13.0]
    for training in (False, True):
        for start in points:
            for end in points:
                once, _ = validate_sample(_sample(start, end, 10.0), training=training)
                if once is None:
                    continue
                assert 0.0 <= once.start <= once.end <= 10.0, (start, end, once)
                again, status = validate_sample(once, training=training)
                assert (again, status) == (once, "kept"), (start, end)


def test_validate_strips_queries_and_counts():
    samples = [_sample(1, 2, query="  hello world \n", qid="a"), _sample(1, 20, qid="b"), _sample(5, 4, qid="c"),
               _sample(1, 2, query=" \t", qid="d")]
    kept, counts = validate(samples)
    assert counts == {"kept": 2, "dropped": 2, "clamped": 1}
    assert [s.qid for s in kept] == ["a", "b"]
    assert kept[0].query == "hello world" and kept[1].end == 10.0


# -------------------------------------------------------------------------------------------- synthetic annotations
def _touch(path):
    path.write_bytes(b"")
    return path


def test_bare_id_prefers_mp4_then_other_extensions(tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    _touch(videos / "AAA.mkv")
    _touch(videos / "BBB.mp4")
    _touch(videos / "BBB.webm")
    _touch(videos / "CCC.AVI")
    ann = tmp_path / "ann.txt"
    ann.write_text("AAA 1.0 2.0##a\nBBB 1.0 2.0##b\nCCC 1.0 2.0##c\nDDD 1.0 2.0##d\n")
    durations = {k: 30.0 for k in ("AAA", "BBB", "CCC", "DDD")}
    got = [s.video for s in READERS["charades_sta"](ann, video_root=videos, durations=durations)]
    assert got == [str(videos / "AAA.mkv"), str(videos / "BBB.mp4"), str(videos / "CCC.AVI"), str(videos / "DDD.mp4")]


def test_charades_durations_from_csv_and_probe(tmp_path, videos_dir):
    csv_path = tmp_path / "Charades_v1_test.csv"
    csv_path.write_text("id,subject,scene,length\nAAA,s1,Kitchen,31.5\nBBB,s2,Bedroom,12.25\n")
    assert load_durations(csv_path) == {"AAA": 31.5, "BBB": 12.25}
    ann = tmp_path / "ann.txt"
    ann.write_text("AAA 1.0 40.0##a\nBBB 0 3##b\n\ncharades_OHOFG 1.0 7.5##person sitting down in a chair.\n")
    samples = list(read_annotations("charades_sta", ann, video_root=videos_dir, durations=csv_path))
    assert [s.duration for s in samples[:2]] == [31.5, 12.25]
    # not in the csv: probed from the real clip, 335 frames at 10000/1049 fps
    assert samples[2].duration == pytest.approx(335 * 1049 / 10000)
    assert samples[2].video == str(videos_dir / "charades_OHOFG.mp4")
    bad = tmp_path / "bad.csv"
    bad.write_text("id,duration\nAAA,3\n")
    with pytest.raises(AnnotationError, match="bad.csv.*'length'"):
        load_durations(bad)


def test_charades_without_duration_or_bad_line_names_the_line(tmp_path):
    ann = tmp_path / "ann.txt"
    ann.write_text("AAA 1.0 2.0##a\nZZZ 1.0 2.0##z\n")
    with pytest.raises(AnnotationError, match=r"ann\.txt:2: no duration for video 'ZZZ'"):
        list(READERS["charades_sta"](ann, durations={"AAA": 5.0}))
    ann.write_text("AAA 1.0 2.0##a\nAAA 1.0 ## no end\n")
    with pytest.raises(AnnotationError, match=r"ann\.txt:2: expected 'VIDEOID start end##sentence'"):
        list(READERS["charades_sta"](ann, durations={"AAA": 5.0}))


def test_relative_path_falls_back_to_video_root_basename(tmp_path):
    root = tmp_path / "videos"
    root.mkdir()
    _touch(root / "x.mp4")
    ann = tmp_path / "tr1.json"
    ann.write_text(json.dumps([{"video": "./dataset/v/x.mp4", "duration": 9.0, "timestamp": [1, 2], "sentence": "s"},
                               {"video": "./dataset/v/y.mp4", "duration": 9.0, "timestamp": [1, 2], "sentence": "t"}]))
    samples = list(READERS["time_r1"](ann, video_root=root))
    assert samples[0].video == str(root / "x.mp4")  # found by its file name under the root
    assert samples[1].video == str(root / "dataset/v/y.mp4")  # missing anywhere: the literal rule
    assert [s.qid for s in samples] == ["time_r1:x#0", "time_r1:y#0"]  # no qid in the file


def test_jsonl_qid_defaults_to_line_number_and_whitespace(tmp_path):
    path = tmp_path / "a.jsonl"
    lines = [{"video": "v.mp4", "query": "q0", "start": 1, "end": 2, "duration": 5, "qid": "mine"},
             {"video": "v.mp4", "query": "  padded query\t", "start": 1, "end": 2, "duration": 5}]
    path.write_text(json.dumps(lines[0]) + "\n\n" + json.dumps(lines[1]) + "\n")
    raw = list(iter_samples(path))
    assert [s.qid for s in raw] == ["mine", "2"]  # 0-based line number (the blank line counts)
    assert raw[1].source == "jsonl" and raw[1].video == str(tmp_path / "v.mp4")
    kept = load_samples(path)
    assert kept[1].query == "padded query"


def test_jsonl_missing_duration_and_video_names_the_line(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"video": "v.mp4", "query": "q", "start": 1, "end": 2, "duration": 5}\n'
                    '{"video": "gone.mp4", "query": "q", "start": 1, "end": 2}\n')
    with pytest.raises(AnnotationError, match=r"a\.jsonl:2: no duration.*gone\.mp4"):
        list(iter_samples(path))
    path.write_text('{"video": "v.mp4", "query": "q", "start": "soon", "end": 2, "duration": 5}\n')
    with pytest.raises(AnnotationError, match=r"a\.jsonl:1: start must be a number"):
        list(iter_samples(path))


def test_jsonl_probes_duration_from_video(tmp_path, videos_dir):
    path = tmp_path / "a.jsonl"
    path.write_text('{"video": "decord_flipping_a_pancake.mkv", "query": "flip", "start": 1, "end": 3}\n')
    (sample,) = load_samples(path, video_root=videos_dir)
    assert sample.duration == pytest.approx(310 / 30)  # decord: 310 frames at 30 fps (mkv without stream duration)
    assert sample.video == str(videos_dir / "decord_flipping_a_pancake.mkv")


def test_write_and_read_jsonl_round_trip(tmp_path):
    samples = [Sample(str(tmp_path / "v.mp4"), "é query", 0.5, 2.25, 10.0, "q1", "s"),
               Sample(str(tmp_path / "w.mp4"), "other", 1.0, 3.0, 7.5, "q2", "s")]
    out = tmp_path / "sub" / "out.jsonl"
    assert write_samples(out, samples) == 2
    assert list(iter_samples(out)) == samples
    assert json.loads(out.read_text(encoding="utf-8").splitlines()[0])["query"] == "é query"
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.jsonl"]  # no temporary file left


def test_probe_duration_errors_name_the_file(tmp_path, videos_dir):
    assert probe_duration(videos_dir / "mmaction2_eye_makeup.avi") == pytest.approx(6.56)
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"not a video at all" * 100)
    with pytest.raises(VideoProbeError, match="garbage.mp4"):
        probe_duration(garbage)
    with pytest.raises(VideoProbeError, match="absent.mp4: video file not found"):
        probe_duration(tmp_path / "absent.mp4")


def test_unknown_format_lists_the_known_ones(tmp_path):
    (tmp_path / "a.txt").write_text("")
    with pytest.raises(KeyError, match="charades_sta"):
        read_annotations("nope", tmp_path / "a.txt")
    assert set(READERS) == {"charades_sta", "activitynet", "tacos", "time_r1", "tvgbench", "timelens", "jsonl",
                            "ego4d_nlq", "ego4d_nlq_video", "extremewhenbench", "timelens2", "qvhighlights"}


# TimeLens-Bench (TencentARC/TimeLens-Bench on the hub, not shipped): {vid: {duration, spans, queries}}, seconds
TIMELENS_FILE = {
    "vidA": {"duration": 30.0, "spans": [[0.0, 4.0], [10.5, 35.0]],
             "queries": ["A man  opens\tthe door.", " a woman sits down.. "]},
    "vidB": {"duration": 12.0, "spans": [[[2.0, 5.0], [7.0, 9.0]], [6.0, 6.0]],
             "queries": ["person eats", "a point in time"]},
    "vidC": {"duration": 20, "spans": [[3, 8]], "queries": [" .. "]},
}


def test_timelens_bench_reader_pairs_spans_with_queries(tmp_path, caplog):
    from grounding_rl.data.readers import count_several_spans

    path = tmp_path / "charades-timelens.json"
    path.write_text(json.dumps(TIMELENS_FILE))
    with caplog.at_level("WARNING", logger="grounding_rl.data.readers"):
        raw = list(read_annotations("timelens", path, video_root=tmp_path / "videos"))
    assert "1 of 5 queries list several spans" in caplog.text
    # span i with query i; queries cleaned as TimeLens's loader does (whitespace collapsed, full stops stripped)
    assert [(s.qid, s.query, s.start, s.end, s.duration) for s in raw] == [
        ("timelens:vidA#0", "A man opens the door", 0.0, 4.0, 30.0),
        ("timelens:vidA#1", "a woman sits down", 10.5, 35.0, 30.0),
        ("timelens:vidB#0", "person eats", 2.0, 5.0, 12.0),  # several spans: scored against the first
        ("timelens:vidB#1", "a point in time", 6.0, 6.0, 12.0),
        ("timelens:vidC#0", "", 3.0, 8.0, 20.0),
    ]
    assert raw[0].video == str(tmp_path / "videos" / "vidA.mp4") and {s.source for s in raw} == {"timelens"}
    kept, counts = validate(raw, log_limit=0)
    # the project's policy: 35 s past the 30 s video clamped; zero-length inside the video and the empty query dropped
    assert counts == {"kept": 3, "dropped": 2, "clamped": 1}
    assert [(s.qid, s.end, s.raw_end) for s in kept] == [("timelens:vidA#0", 4.0, 4.0),
                                                          ("timelens:vidA#1", 30.0, 35.0),
                                                          ("timelens:vidB#0", 5.0, 5.0)]
    assert count_several_spans(path) == {"videos": 3, "queries": 5, "several_spans": 1}


def test_timelens_bench_prepare_counts_and_errors(tmp_path):
    from grounding_rl.data.prepare import prepare

    path = tmp_path / "qvhighlights-timelens.json"
    path.write_text(json.dumps(TIMELENS_FILE))
    counts = prepare("timelens", str(path), str(tmp_path / "out.jsonl"), progress=False)
    assert counts == {"kept": 3, "dropped": 2, "clamped": 1, "missing_videos": None, "unreadable_videos": None,
                      "duration_mismatch": None, "several_spans": 1}
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"v1": {"duration": 10, "spans": [[1, 2], [3, 4]], "queries": ["only one"]}}))
    with pytest.raises(AnnotationError, match="bad.json: video v1: needs lists 'spans' and 'queries' of equal"):
        list(read_annotations("timelens", bad))
    bad.write_text(json.dumps({"v1": {"duration": 10, "spans": [[1, 2, 3]], "queries": ["q"]}}))
    with pytest.raises(AnnotationError, match="video v1, query 0: a timestamp must be"):
        list(read_annotations("timelens", bad))
