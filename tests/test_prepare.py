"""``grounding-rl prepare``: canonical JSONL out, counts as the last stdout line, atomic write."""
import json

from grounding_rl.cli import main as cli_main
from grounding_rl.cli.prepare import main


def _last_json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_prepare_shared_clips_keeps_durations(tmp_path, videos_dir, capsys):
    out = tmp_path / "clips.jsonl"
    source = videos_dir / "annotations.jsonl"
    assert cli_main(["prepare", "--format", "jsonl", "--annotations", str(source), "--video-root", str(videos_dir),
                     "--out", str(out)]) == 0
    # 8 queries give a duration a fraction of a second off their clip's (35.2 and 35.04 s for 35.14 s, 10.38 for 10.33)
    assert _last_json(capsys) == {"kept": 15, "dropped": 0, "clamped": 0, "missing_videos": 0,
                                 "unreadable_videos": 0, "duration_mismatch": 8}
    given = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [w["duration"] for w in written] == [g["duration"] for g in given]  # kept, not re-probed
    assert [(w["start"], w["end"], w["query"]) for w in written] == [(g["start"], g["end"], g["query"]) for g in given]
    assert [w["video"] for w in written] == [str(videos_dir / g["video"]) for g in given]
    assert [w["qid"] for w in written] == [str(i) for i in range(15)]
    assert [w["source"] for w in written] == [g["source"] for g in given]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clips.jsonl"]


def test_prepare_charades_test_counts(tmp_path, benchmarks_dir, capsys):
    out = tmp_path / "charades_test.jsonl"
    txt = benchmarks_dir / "charades_sta/charades_sta_test.txt"
    assert main(["--format", "charades_sta", "--annotations", str(txt),
                 "--durations", str(benchmarks_dir / "charades_sta/charades.json"), "--out", str(out)]) == 0
    out_err = capsys.readouterr()
    assert json.loads(out_err.out.strip().splitlines()[-1]) == {"kept": 3720, "dropped": 0, "clamped": 562,
                                                               "missing_videos": None, "unreadable_videos": None,
                                                               "duration_mismatch": None}
    assert "videos not checked (give --video-root" in out_err.err
    lines = out.read_text().splitlines()
    assert len(lines) == 3720
    assert json.loads(lines[0])["qid"] == "charades_sta:3MSZA#0"


def test_prepare_counts_missing_videos_and_writes_relative_paths(tmp_path, capsys):
    root = tmp_path / "videos"
    root.mkdir()
    (root / "AAA.mp4").write_bytes(b"")
    ann = tmp_path / "ann.txt"
    ann.write_text("AAA 1.0 2.0##a\nAAA 3.0 4.0##b\nBBB 1.0 2.0##c\nCCC 1.0 2.0##d\nCCC 3.0 2.0##dropped\n")
    durations = tmp_path / "d.json"
    durations.write_text(json.dumps({"AAA": {"duration": 10.0}, "BBB": {"duration": 1.5}, "CCC": {"duration": 9.0}}))
    out = root / "prepared.jsonl"
    assert main(["--format", "charades_sta", "--annotations", str(ann), "--durations", str(durations),
                 "--video-root", str(root), "--out", str(out), "--max-missing-fraction", "1.0"]) == 0
    # BBB and CCC are missing (distinct videos of kept samples), AAA (0 bytes) unreadable; BBB's end 2.0 is clamped
    # to 1.5
    assert _last_json(capsys) == {"kept": 4, "dropped": 1, "clamped": 1, "missing_videos": 2, "unreadable_videos": 1,
                                 "duration_mismatch": 0}
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [w["video"] for w in written] == ["AAA.mp4", "AAA.mp4", "BBB.mp4", "CCC.mp4"]  # inside the out folder
    assert written[2]["end"] == 1.5


def test_prepare_error_names_the_line(tmp_path, capsys):
    ann = tmp_path / "ann.txt"
    ann.write_text("AAA 1.0 2.0##a\n")
    out = tmp_path / "out.jsonl"
    assert cli_main(["prepare", "--format", "charades_sta", "--annotations", str(ann), "--out", str(out)]) == 2
    assert "ann.txt:1: no duration for video 'AAA'" in capsys.readouterr().err
    assert not out.exists()


def test_prepare_on_its_own_output_keeps_every_line(tmp_path, capsys):
    """Charades-STA text with an event past the end, one before 0 and one clamped: prepared once, then the output
    prepared again as canonical JSONL, gives the same lines."""
    ann = tmp_path / "ann.txt"
    ann.write_text("AAA 1.0 2.0##a\nAAA 12.0 14.0##after the end\nAAA -3.0 -1.0##before 0\nAAA 8.0 11.0##c\n")
    durations = tmp_path / "d.json"
    durations.write_text(json.dumps({"AAA": {"duration": 10.0}}))
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    assert main(["--format", "charades_sta", "--annotations", str(ann), "--durations", str(durations), "--out",
                 str(first)]) == 0
    assert _last_json(capsys) == {"kept": 4, "dropped": 0, "clamped": 3, "missing_videos": None,
                                  "unreadable_videos": None, "duration_mismatch": None}
    assert main(["--format", "jsonl", "--annotations", str(first), "--out", str(second)]) == 0
    assert _last_json(capsys) == {"kept": 4, "dropped": 0, "clamped": 0, "missing_videos": None,
                                  "unreadable_videos": None, "duration_mismatch": None}
    assert second.read_text() == first.read_text()
    rows = [json.loads(line) for line in first.read_text().splitlines()]
    assert [(r["start"], r["end"]) for r in rows] == [(1.0, 2.0), (10.0, 10.0), (0.0, 0.0), (8.0, 10.0)]


def test_prepare_opens_each_video_once_and_counts_unreadable_apart(tmp_path, videos_dir, capsys, caplog,
                                                                   monkeypatch):
    """--video-root: a real clip reads, a file of garbage is unreadable (counted apart from the missing one, listed
    on stderr), each distinct video is opened once; above --max-missing-fraction the two together stop prepare."""
    import shutil

    import grounding_rl.data.probe as probe

    root = tmp_path / "videos"
    root.mkdir()
    shutil.copy(videos_dir / "mmaction2_eye_makeup.avi", root / "good.avi")
    (root / "broken.mp4").write_bytes(b"not a video" * 100)
    rows = [{"video": name, "query": "q", "start": 1.0, "end": 2.0, "duration": 5.0, "qid": f"{name}{i}"}
            for name in ("good.avi", "broken.mp4", "absent.mp4") for i in range(2)]
    ann = tmp_path / "ann.jsonl"
    ann.write_text("".join(json.dumps(r) + "\n" for r in rows))
    opened = []
    real = probe._probe_decord
    monkeypatch.setattr(probe, "_probe_decord", lambda path: opened.append(path) or real(path))
    probe._probe.cache_clear()
    base = ["prepare", "--format", "jsonl", "--annotations", str(ann), "--video-root", str(root), "--out",
            str(tmp_path / "o.jsonl")]
    assert cli_main([*base, "--max-missing-fraction", "1.0"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1]) == {"kept": 6, "dropped": 0, "clamped": 0,
                                                                 "missing_videos": 1, "unreadable_videos": 1,
                                                                 "duration_mismatch": 2}
    assert sorted(opened) == [str(root / "broken.mp4"), str(root / "good.avi")]  # once each, the absent one never
    assert "1 of 3 videos are unreadable under" in caplog.text and "broken.mp4" in caplog.text
    # missing alone (1 of 3) passes 0.4; missing or unreadable (2 of 3) does not
    assert cli_main([*base, "--max-missing-fraction", "0.4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing or unreadable under" in err and "2 of 3 videos" in err


def test_prepare_refuses_a_repeated_qid(tmp_path, capsys):
    rows = [{"video": "v.mp4", "query": q, "start": 1.0, "end": 2.0, "duration": 5.0, "qid": qid}
            for q, qid in (("a", "x"), ("b", "y"), ("c", "x"))]
    ann = tmp_path / "ann.jsonl"
    ann.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "o.jsonl"
    assert cli_main(["prepare", "--format", "jsonl", "--annotations", str(ann), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "qid 'x' of query 3 repeats query 1's" in err and "ann.jsonl" in err
    assert not out.exists()


def test_prepare_refuses_durations_in_another_unit(tmp_path, videos_dir, capsys, caplog):
    """Annotations in milliseconds: a duration off the clip's by a factor outside [0.5, 2] is refused with
    --video-root, naming the first queries (nothing written); without a duration every query is clamped, which is a
    warning naming the unit mistake."""
    clip = str(videos_dir / "mmaction2_basketball_drill.mp4")  # 10.01 s
    out = tmp_path / "o.jsonl"

    def run(rows):
        ann = tmp_path / "ann.jsonl"
        ann.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return cli_main(["prepare", "--format", "jsonl", "--annotations", str(ann), "--video-root", str(videos_dir),
                         "--out", str(out)])

    for duration in (10010.0, 1e20, 1e300, 4.9):
        rows = [{"video": clip, "query": "q", "start": 1000.0 * i, "end": 1000.0 * i + 500, "duration": duration,
                 "qid": f"a{i}"} for i in range(1, 5)]
        assert run(rows) == 2, duration
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "more characters" not in err, err
        assert "4 of 4 durations differ from their video's by a factor outside [0.5, 2] (query 1, qid 'a1'" in err
        assert "mmaction2_basketball_drill.mp4 lasts 10.01 s; also query 2, 3, …)" in err
        assert "milliseconds or frames" in err and not out.exists()
    rows = [{"video": clip, "query": "q", "start": 1.0, "end": 2.0, "duration": d, "qid": str(d)} for d in (5.1, 19.9)]
    assert run(rows) == 0  # within [0.5, 2]: kept as given, counted
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["duration_mismatch"] == 2
    rows = [{"video": clip, "query": "q", "start": 1000.0 * i, "end": 1000.0 * i + 500, "qid": str(i)}
            for i in range(1, 9)]
    with caplog.at_level("WARNING"):
        assert run(rows) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["clamped"] == 8
    assert "all 8 queries were clamped into their videos" in caplog.text and "milliseconds or frames" in caplog.text
