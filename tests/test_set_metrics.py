"""Metrics for interval sets: the set scoring, and QVHighlights' own metric against numbers computed by
jayleicn/moment_detr's standalone_eval (tests/fixtures/qvhighlights_moment_detr.json, run outside the project)."""
import json
from pathlib import Path

import pytest

from grounding_rl.reward.set_metrics import detection_ap, qvhighlights_metrics, set_metrics

QVH = json.loads((Path(__file__).parent / "fixtures" / "qvhighlights_moment_detr.json").read_text())


def test_qvhighlights_metric_agrees_with_moment_detr():
    records = [{"qid": g["qid"], "start": g["relevant_windows"][0][0], "end": g["relevant_windows"][-1][1],
                "duration": g["duration"], "spans": g["relevant_windows"],
                "pred_spans": [w[:2] for w in s["pred_relevant_windows"]]}
               for g, s in zip(QVH["ground_truth"], QVH["submission"])]
    got = qvhighlights_metrics(records)
    assert got["n"] == 200
    for key, expected in QVH["expected"].items():
        assert got[key] == pytest.approx(expected, abs=1e-9), key


def test_detection_ap_hand_computed():
    # two GT windows; predictions: a hit, a miss, a hit → precisions 1, 1/2, 2/3 at recalls 1/2, 1/2, 1
    # interpolated AP = 0.5 · 1 + 0.5 · 2/3
    ap = detection_ap([(0, 10), (50, 60), (20, 30)], [(0, 10), (20, 30)], thresholds=(0.5,))
    assert ap == [pytest.approx(0.5 + 0.5 * 2 / 3)]
    assert detection_ap([], [(0, 1)], thresholds=(0.5, 0.7)) == [0.0, 0.0]


def test_set_scoring_uses_every_span_and_reports_precision_recall():
    records = [
        {"start": 0, "end": 10, "duration": 100, "spans": [[0, 10]], "spans_all": [[0, 10], [20, 30]],
         "answer": "<answer>[[0, 10], [20, 30]]</answer>"},
        {"start": 0, "end": 10, "duration": 100, "answer": "<answer>0 to 20</answer>"},
        {"start": 0, "end": 10, "duration": 100, "answer": "no idea"},
    ]
    m = set_metrics(records)
    assert m["n"] == 3 and m["R1@0.5"] == pytest.approx(200 / 3) and m["mIoU"] == pytest.approx(100 * 1.5 / 3)
    assert m["precision"] == pytest.approx(100 * 1.5 / 3) and m["recall"] == pytest.approx(100 * 2 / 3)
    assert m["parse_failure_rate"] == pytest.approx(100 / 3)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_score_sets_and_single_spans_side_by_side(tmp_path, capsys):
    from grounding_rl.cli.score import main

    gt = _jsonl(tmp_path / "gt.jsonl", [
        {"video": "a.mp4", "query": "q", "start": 0, "end": 30, "duration": 100, "qid": "m",
         "spans": [[0, 10], [20, 30]]},
        {"video": "a.mp4", "query": "q", "start": 40, "end": 50, "duration": 100, "qid": "s"},
        {"video": "a.mp4", "query": "q", "start": 60, "end": 70, "duration": 100, "qid": "t",
         "spans_all": [[60, 70], [80, 90]], "spans": [[60, 70]]}])
    preds = _jsonl(tmp_path / "pred.jsonl", [
        {"qid": "m", "answer": "<think>x</think><answer>[[0, 10], [20, 25]]</answer>"},
        {"qid": "s", "answer": "<think>x</think><answer>40 to 50</answer>"},
        {"qid": "t", "pred_spans": [[60, 70], [80, 90]]}])
    out = tmp_path / "m.json"
    assert main(["--predictions", str(preds), "--annotations", str(gt), "--out", str(out), "--scoring", "set",
                 "--scoring", "qvhighlights"]) == 0
    metrics = json.loads(out.read_text())
    # m: set IoU 15/20 = 0.75; s: 1.0; t (single-span template: no pred start/end, its answer absent) → 0
    assert metrics["mIoU"] == pytest.approx(100 * 1.75 / 3)
    assert metrics["precision"] == pytest.approx(100 * 2 / 3) and metrics["recall"] == pytest.approx(100 * 1.75 / 3)
    assert metrics["by_scoring"]["set"]["mIoU"] == pytest.approx(100 * 2.75 / 3)   # t against both spans_all
    assert metrics["by_scoring"]["qvhighlights"]["R1@0.5"] == 100.0   # each first window matches a GT window
    assert "| set |" in capsys.readouterr().out
