"""Evaluation metrics, checked against a hand computation."""
import pytest

from grounding_rl.reward.metrics import compute_metrics, format_metrics_table


def T(answer: str) -> str:
    return f"<think>reasoning</think><answer>{answer}</answer>"


# gt, duration, prediction -> IoU by hand
RECORDS = [
    {"qid": "a", "start": 15.0, "end": 18.0, "duration": 40.0, "answer": T("15.00 to 18.00")},  # 1.0, formatted
    {"qid": "b", "start": 15.0, "end": 18.0, "duration": 40.0, "answer": T("15.30 to 18.50")},  # 2.7/3.5, formatted
    {"qid": "c", "start": 15.0, "end": 18.0, "duration": 40.0, "answer": "<answer>10 to 12</answer>"},  # 0, no think
    {"qid": "d", "start": 15.0, "end": 18.0, "duration": 40.0, "answer": T("around five")},  # unparseable: 0
    {"qid": "e", "start": 35.0, "end": 40.0, "duration": 40.0, "pred_start": 30.0, "pred_end": 50.0},  # (30,40): 0.5
    {"qid": "f", "start": 15.0, "end": 18.0, "duration": 40.0, "answer": T("18 to 15")},  # reversed: 0, formatted
    {"qid": "g", "start": 10.0, "end": 20.0, "duration": 30.0, "answer": T("[16, 20]")},  # 4/10, formatted
]


def test_hand_computed_example():
    m = compute_metrics(RECORDS)
    # IoUs: 1, 0.771429, 0, 0, 0.5, 0, 0.4
    assert m["n"] == 7
    assert m["R1@0.3"] == pytest.approx(100 * 4 / 7)  # 57.14
    assert m["R1@0.5"] == pytest.approx(100 * 3 / 7)  # 42.86: IoU exactly 0.5 counts
    assert m["R1@0.7"] == pytest.approx(100 * 2 / 7)  # 28.57
    assert m["mIoU"] == pytest.approx(100 * (1 + 2.7 / 3.5 + 0.5 + 0.4) / 7)  # 38.16
    assert m["parse_failure_rate"] == pytest.approx(100 * 1 / 7)  # only "around five"
    assert m["format_rate"] == pytest.approx(100 * 4 / 7)  # a, b, f, g
    assert set(m) == {"n", "R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "parse_failure_rate", "format_rate"}


def test_missing_prediction_is_failure_not_dropped():
    gt_only = {"start": 1.0, "end": 2.0, "duration": 10.0}
    m = compute_metrics([{**gt_only, "pred_start": 1.0, "pred_end": 2.0}, gt_only])
    assert (m["n"], m["R1@0.7"], m["mIoU"], m["parse_failure_rate"]) == (2, 50.0, 50.0, 50.0)
    assert m["format_rate"] is None  # no answer text anywhere


def test_start_end_win_over_answer_text():
    r = {"start": 1.0, "end": 2.0, "duration": 10.0, "pred_start": 1.0, "pred_end": 2.0, "answer": T("5 to 6")}
    m = compute_metrics([r])
    assert (m["mIoU"], m["parse_failure_rate"], m["format_rate"]) == (100.0, 0.0, 100.0)
    r_null = {**r, "pred_start": None, "pred_end": None}  # eval writes null when parsing failed: fall back to text
    assert compute_metrics([r_null])["mIoU"] == 0.0


def test_errors_name_the_record():
    with pytest.raises(ValueError, match="no records"):
        compute_metrics([])
    with pytest.raises(ValueError, match=r"record 1 \(qid 'x'\): 'duration'"):
        compute_metrics([{"start": 1, "end": 2, "duration": 5}, {"qid": "x", "start": 1, "end": 2}])
    with pytest.raises(ValueError, match="record 0.*reversed"):
        compute_metrics([{"start": 3.0, "end": 2.0, "duration": 5.0, "answer": T("1 to 2")}])


def test_table():
    table = format_metrics_table({**compute_metrics(RECORDS), "unknown_qids": 2})
    header, rule, row = table.splitlines()
    assert header == "| n | R1@0.3 | R1@0.5 | R1@0.7 | mIoU | parse_failure_rate | format_rate | unknown_qids |"
    assert row == "| 7 | 57.14 | 42.86 | 28.57 | 38.16 | 14.29 | 57.14 | 2 |"
