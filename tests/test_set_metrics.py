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
