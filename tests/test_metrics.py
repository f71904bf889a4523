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
    {"qid": "g", "start": 10.0, "end": 20.0, "duration": 30.0, "answer": T("[16, 20]")},  # 4/10, read, not strict
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
    assert m["format_rate"] == pytest.approx(100 * 3 / 7)  # a, b, f: the template asks for "S to E"
    # usable predictions a, b, c, e (clamped to 30-40), g: (3 + 3.2 + 2 + 10 + 4) s against (3 + 3 + 3 + 5 + 10) s
    assert m["length_ratio"] == pytest.approx(22.2 / 24)
    assert set(m) == {"n", "R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "parse_failure_rate", "format_rate", "length_ratio"}


def test_length_ratio_of_interval_sets_merges_and_ignores_unusable_answers():
    """Σ|merged prediction| / Σ|merged truth| over the queries with a usable prediction: [[0, 3], [5, 8], [6, 7]]
    is 6 s against [[0, 2], [5, 7]]'s 4 s; an unparseable answer adds to neither; none usable → None."""
    sets = [{"start": 0.0, "end": 7.0, "duration": 10.0, "spans": [[0.0, 2.0], [5.0, 7.0]],
             "answer": T("[[0, 3], [5, 8], [6, 7]]")},
            {"start": 1.0, "end": 2.0, "duration": 10.0, "spans": [[1.0, 2.0]], "answer": T("never")}]
    for scoring in ("standard", "clamped"):
        assert compute_metrics(sets, scoring, prompt_template="default_multi")["length_ratio"] == pytest.approx(1.5)
    assert compute_metrics(sets[1:], prompt_template="default_multi")["length_ratio"] is None


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
    assert header == "| n | R1@0.3 | R1@0.5 | R1@0.7 | mIoU | parse_failure_rate | format_rate | length_ratio | unknown_qids |"
    assert row == "| 7 | 57.14 | 42.86 | 28.57 | 38.16 | 14.29 | 42.86 | 0.92 | 2 |"


@pytest.mark.parametrize("scoring", ["standard", "clamped"])
@pytest.mark.parametrize("pred, gt, threshold", [
    ((11.6, 14.6), (11.6, 17.6), 0.5),  # 0.49999999999999983 in float64
    ((0.1, 0.4), (0.1, 1.1), 0.3),  # 0.3 exactly in real numbers
    ((1.1, 1.4), (1.1, 2.1), 0.3),  # 0.2999999999999998
    ((1.1, 1.8), (1.1, 2.1), 0.7),
    ((2.2, 2.9), (2.2, 3.2), 0.7),  # 0.6999999999999997
])
def test_exact_ties_count(pred, gt, threshold, scoring):
    from grounding_rl.reward.iou import temporal_iou

    assert abs(temporal_iou(pred, gt) - threshold) < 1e-12  # a tie up to float error, on either side
    m = compute_metrics([{"start": gt[0], "end": gt[1], "duration": 60.0, "pred_start": pred[0],
                          "pred_end": pred[1]}], scoring)
    assert m[f"R1@{threshold}"] == 100.0
    below = compute_metrics([{"start": gt[0], "end": gt[1], "duration": 60.0, "pred_start": pred[0],
                              "pred_end": pred[1] - 1e-6}], scoring)
    assert below[f"R1@{threshold}"] == 0.0  # a real miss stays a miss


def test_standard_scoring_keeps_annotation_and_prediction_as_written():
    # annotation 20-40 s on a 30 s video, prediction 25-45 s: standard 15/25; clamped (25, 30) vs (20, 30) = 5/10
    r = {"start": 20.0, "end": 30.0, "raw_start": 20.0, "raw_end": 40.0, "duration": 30.0, "pred_start": 25.0,
         "pred_end": 45.0}
    assert compute_metrics([r], "standard")["mIoU"] == pytest.approx(60.0)
    assert compute_metrics([r], "clamped")["mIoU"] == pytest.approx(50.0)
    # reversed prediction → 0 under both; unknown scoring → error
    assert compute_metrics([{**r, "pred_start": 45.0, "pred_end": 25.0}], "standard")["mIoU"] == 0.0
    with pytest.raises(ValueError, match="scoring"):
        compute_metrics([r], "published")


@pytest.mark.parametrize("scoring", ["standard", "clamped"])
def test_near_ties_do_not_count(scoring):
    """Exact arithmetic, no tolerance: IoU 1/2 − 5e-10 (times with many decimals) misses R1@0.5; a 1e-9 tolerance
    counted it."""
    from fractions import Fraction

    from grounding_rl.reward.metrics import exact_iou

    gt, pred = (10.0, 20.0), (10.0, 14.999999995)  # IoU = 4.999999995 / 10
    assert exact_iou(tuple(map(Fraction, map(repr, pred))), tuple(map(Fraction, gt))) == Fraction(4999999995, 10**10)
    rec = {"start": gt[0], "end": gt[1], "duration": 60.0, "pred_start": pred[0], "pred_end": pred[1]}
    assert compute_metrics([rec], scoring)["R1@0.5"] == 0.0
    text = {"start": gt[0], "end": gt[1], "duration": 60.0, "answer": T("10.0 to 14.9999999999999999")}
    assert compute_metrics([text], scoring)["R1@0.5"] == 0.0  # float64 reads 15.0; the text's own decimals miss
    assert compute_metrics([{**text, "answer": T("10.0 to 15.0")}], scoring)["R1@0.5"] == 100.0


def test_standard_negative_start_rule():
    """``standard`` uses a negative time as written on either side; ``clamped`` clamps it to 0. The parser reads no
    negative prediction ("-2 to 5" is no answer)."""
    r = {"start": 0.0, "end": 4.0, "raw_start": -0.5, "raw_end": 4.0, "duration": 30.0, "pred_start": 0.0,
         "pred_end": 4.0}
    assert compute_metrics([r], "standard")["mIoU"] == 100 * 4 / 4.5  # exactly 800/9, rounded once
    assert compute_metrics([r], "clamped")["mIoU"] == 100.0
    negative_pred = {**r, "raw_start": 0.0, "pred_start": -1.0}  # (−1, 4) against (0, 4): 4/5
    assert compute_metrics([negative_pred], "standard")["mIoU"] == 80.0
    assert compute_metrics([negative_pred], "clamped")["mIoU"] == 100.0
    as_text = {**r, "pred_start": None, "pred_end": None, "answer": T("-2 to 5")}
    assert compute_metrics([as_text], "standard")["parse_failure_rate"] == 100.0


def test_histogram_ious_are_the_headline_standard_ones(tmp_path):
    """``iou_hist.png`` draws the IoUs the headline averages: a prediction past the clip's end is 0.75 under the
    standard scoring (6–10 against 6–9 as annotated) although the record's own clamped ``iou`` is 1.0; the title and
    R1 labels take ``metrics.json``'s figures."""
    from grounding_rl.data.samples import Sample
    from grounding_rl.eval.report import plot_iou_hist
    from grounding_rl.reward.records import metrics_from_records, prediction_record, standard_ious

    past_end = prediction_record(Sample("v.mp4", "q", 6.0, 9.0, 9.0, "a", "t"), "<answer>6.00 to 10.00</answer>")
    half = prediction_record(Sample("w.mp4", "q", 1.0, 3.0, 5.0, "b", "t"), "<answer>2.00 to 3.00</answer>")
    unparsed = prediction_record(Sample("w.mp4", "q", 1.0, 2.0, 5.0, "c", "t"), "soon")
    records = [past_end, half, unparsed]
    assert [r["iou"] for r in records] == [1.0, 0.5, 0.0]  # the reward's clamped rule
    ious = standard_ious(records)
    assert ious == [0.75, 0.5, 0.0]
    metrics = metrics_from_records(records)
    assert metrics["mIoU"] == pytest.approx(100 * sum(ious) / 3) == pytest.approx(125 / 3)
    assert metrics["by_scoring"]["clamped"]["mIoU"] == pytest.approx(50.0)  # what the picture showed before
    png = plot_iou_hist(ious, tmp_path / "h.png", failures=1, metrics=metrics)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
