"""`grounding-rl score`."""
import json

import pytest

from grounding_rl.cli import main as cli_main
from grounding_rl.cli.score import main
from grounding_rl.eval.score import score


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def gt(qid, start, end, duration=40.0):
    row = {"video": "v.mp4", "query": "q", "start": start, "end": end, "duration": duration, "source": "test"}
    return row if qid is None else {**row, "qid": qid}


def test_join_missing_unknown_and_default_qid(tmp_path, capsys):
    ann = write_jsonl(tmp_path / "gt.jsonl", [gt("q0", 15.0, 18.0), gt(7, 10.0, 20.0), gt("q2", 1.0, 2.0),
                                              gt(None, 0.0, 4.0)])  # last line has no qid -> "3"
    pred = write_jsonl(tmp_path / "pred.jsonl", [
        {"qid": "q0", "answer": "<think>t</think><answer>15.3 to 18.5</answer>"},  # 0.7714, formatted
        {"qid": "7", "start": 16.0, "end": 20.0, "answer": "<answer>bad</answer>"},  # start/end win: 0.4
        {"qid": 3, "start": 0.0, "end": 4.0},  # int qid joins "3": 1.0
        {"qid": "zz", "answer": "<answer>1 to 2</answer>"},  # unknown
    ])  # q2 missing -> failure
    out = tmp_path / "m" / "metrics.json"
    assert main(["--predictions", str(pred), "--annotations", str(ann), "--out", str(out)]) == 0
    m = json.loads(out.read_text())
    assert m["n"] == 4 and m["unknown_qids"] == 1
    assert m["mIoU"] == pytest.approx(100 * (2.7 / 3.5 + 0.4 + 1.0) / 4)
    assert (m["R1@0.3"], m["R1@0.5"], m["R1@0.7"]) == (75.0, 50.0, 50.0)
    assert m["parse_failure_rate"] == 25.0 and m["format_rate"] == 25.0
    captured = capsys.readouterr()
    assert "'zz'" in captured.err and "| n | R1@0.3" in captured.out


def test_bad_json_names_file_and_line(tmp_path, capsys):
    ann = write_jsonl(tmp_path / "gt.jsonl", [gt("a", 1.0, 2.0), "{not json"])
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"qid": "a", "start": 1.0, "end": 2.0}])
    assert cli_main(["score", "--predictions", str(pred), "--annotations", str(ann)]) == 2
    assert f"{ann}:2: not valid JSON" in capsys.readouterr().err


def test_duplicate_and_missing_qid_in_predictions(tmp_path, capsys):
    ann = write_jsonl(tmp_path / "gt.jsonl", [gt("a", 1.0, 2.0)])
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"qid": "a", "start": 1.0, "end": 2.0}, {"qid": "a"}])
    assert cli_main(["score", "--predictions", str(pred), "--annotations", str(ann)]) == 2
    assert "pred.jsonl:2: duplicate qid 'a'" in capsys.readouterr().err
    write_jsonl(pred, [{"answer": "<answer>1 to 2</answer>"}])
    assert cli_main(["score", "--predictions", str(pred), "--annotations", str(ann)]) == 2
    assert "pred.jsonl:1: prediction has no 'qid'" in capsys.readouterr().err


def test_real_annotations_via_cli(videos_dir, tmp_path):
    """The shared canonical file has no qids: they become line numbers. Perfect answers for even lines only."""
    lines = (videos_dir / "annotations.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    pred = write_jsonl(tmp_path / "pred.jsonl", [
        {"qid": str(i), "answer": f"<think>x</think><answer>{r['start']:.2f} to {r['end']:.2f}</answer>"}
        for i, r in enumerate(rows) if i % 2 == 0
    ])
    out = tmp_path / "metrics.json"
    args = ["score", "--predictions", str(pred), "--annotations", str(videos_dir / "annotations.jsonl"),
            "--out", str(out)]
    assert cli_main(args) == 0
    m = json.loads(out.read_text())
    n_even = (len(rows) + 1) // 2
    assert m["n"] == len(rows) == 15
    assert m["mIoU"] == pytest.approx(100 * n_even / 15)
    assert m["parse_failure_rate"] == pytest.approx(100 * (15 - n_even) / 15)
    assert m["format_rate"] == pytest.approx(100 * n_even / 15) and m["unknown_qids"] == 0


def test_annotations_follow_the_validation_policy(tmp_path):
    """As in eval: a start ≥ end annotation is dropped (not in the clamped n; IoU 0 in the standard n); an end past the
    video is clamped for the clamped scoring and kept as annotated for the standard one (the headline)."""
    ann = write_jsonl(tmp_path / "gt.jsonl", [gt("ok", 10.0, 50.0), gt("bad", 5.0, 5.0)])
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"qid": "ok", "start": 10.0, "end": 40.0}])
    metrics = score(pred, ann)
    assert metrics["scoring"] == "standard" and metrics["by_scoring"]["standard"] == {
        **{k: v for k, v in metrics.items() if k not in ("scoring", "by_scoring", "unknown_qids", "missing_predictions",
                                                         "data", "data_sha256")},
        "source": metrics["by_scoring"]["standard"]["source"]}
    assert metrics["n"] == 2 and metrics["mIoU"] == 37.5  # 10-40 s against the annotated 10-50 s: 0.75; "bad": 0
    clamped = metrics["by_scoring"]["clamped"]
    assert clamped["n"] == 1 and clamped["mIoU"] == 100.0  # the ground truth 10-50 s is clamped to 10-40 s


def test_standard_counts_dropped_annotations_as_zero(tmp_path):
    """The published evaluators score every query; a zero-length annotation has IoU 0 with any real interval."""
    ann = write_jsonl(tmp_path / "gt.jsonl", [gt("ok", 10.0, 20.0), gt("point", 5.0, 5.0)])
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"qid": "ok", "start": 10.0, "end": 20.0}])
    metrics = score(pred, ann)
    assert (metrics["n"], metrics["mIoU"], metrics["dropped_annotations"]) == (2, 50.0, 1)
    assert (metrics["by_scoring"]["clamped"]["n"], metrics["by_scoring"]["clamped"]["mIoU"]) == (1, 100.0)
    assert metrics["parse_failure_rate"] == 0.0  # over the evaluated queries


def test_missing_predictions_are_counted_and_an_empty_file_is_an_error(tmp_path, capsys):
    ann = write_jsonl(tmp_path / "gt.jsonl", [gt("a", 1.0, 2.0), gt("b", 1.0, 2.0), gt("c", 1.0, 2.0)])
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"qid": "a", "start": 1.0, "end": 2.0}])
    metrics = score(pred, ann)
    assert (metrics["n"], metrics["missing_predictions"], metrics["mIoU"]) == (3, 2, pytest.approx(100 / 3))
    assert "2 of 3 queries have no prediction" in capsys.readouterr().err
    pred.write_text("")
    assert cli_main(["score", "--predictions", str(pred), "--annotations", str(ann)]) == 2
    assert capsys.readouterr().err.strip() == f"grounding-rl score: error: {pred}: no predictions in the file"


def test_every_scoring_side_by_side(tmp_path, capsys):
    """``--scoring all``: one table, each scoring with its own n and source; the headline stays ``standard``. The tie
    GT (11.6, 14.6) against (11.6, 17.6) counts at R1@0.5 under ``standard`` and misses under every evaluator's float
    arithmetic; the query without a prediction is in n or not by each evaluator's rule."""
    ann = write_jsonl(tmp_path / "gt.jsonl", [gt("tie", 11.6, 14.6), gt("none", 1.0, 2.0)])
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"qid": "tie", "answer": "<answer>11.6 to 17.6</answer>"}])
    out = tmp_path / "metrics.json"
    assert main(["--predictions", str(pred), "--annotations", str(ann), "--out", str(out), "--scoring", "all"]) == 0
    m = json.loads(out.read_text())
    by = m["by_scoring"]
    assert list(by) == ["standard", "clamped", "timelens", "lmms_timelens", "lmms_charades_sta",
                        "lmms_extremewhenbench", "timelens2_vlmevalkit", "timezero", "time_r1", "set", "qvhighlights"]
    assert m["scoring"] == "standard" and m["R1@0.5"] == by["standard"]["R1@0.5"] == 50.0
    assert [by[k]["R1@0.5"] for k in list(by)[2:9]] == [0.0] * 7
    assert [by[k]["n"] for k in by] == [2, 2, 2, 1, 2, 2, 1, 1, 1, 2, 2]
    assert by["timezero"]["source"].startswith("www-Ye/TimeZero @a7c3523")
    table = capsys.readouterr().out
    assert "| standard (headline) | 2 | 50.00 | 50.00 |" in table and "| time_r1 | 1 | 100.00 | 0.00 |" in table
    from grounding_rl.errors import UserError

    with pytest.raises(UserError, match="--scoring: unknown scoring 'nope'"):
        main(["--predictions", str(pred), "--annotations", str(ann), "--scoring", "nope"])


def test_compare_rescores_existing_predictions(tmp_path, capsys):
    """``compare --scoring all`` over an evaluation folder whose metrics.json has only standard and clamped: the other
    scorings come from its predictions.jsonl, without a model."""
    from grounding_rl.cli.compare import main as compare
    from grounding_rl.data.samples import Sample
    from grounding_rl.reward.records import metrics_from_records, prediction_record

    samples = [Sample(video="v.mp4", query=f"q{i}", start=float(i), end=i + 4.0, duration=30.0, qid=str(i), source="t")
               for i in range(3)]
    records = [prediction_record(s, a) for s, a in zip(samples, ("0 to 4", "1.0 - 5.0", None))]
    run = tmp_path / "run"
    run.mkdir()
    write_jsonl(run / "predictions.jsonl", records)
    (run / "metrics.json").write_text(json.dumps(metrics_from_records(records)))
    assert compare([f"base={run}", "--scoring", "timezero", "--scoring", "lmms_charades_sta"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| base | standard (headline) | 66.67 | 66.67 | 66.67 | 66.67 | 0.00 | 1.00 | 3 |"
    # TimeZero reads "0 to 4" only, and leaves the missing one out of n; lmms-eval's Charades reads both, counts all
    assert lines[4] == "| base | timezero | 50.00 | 50.00 | 50.00 | 50.00 | - | - | 2 |"
    assert lines[5] == "| base | lmms_charades_sta | 66.67 | 66.67 | 66.67 | 66.67 | - | - | 3 |"
