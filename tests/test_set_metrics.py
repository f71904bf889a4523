"""Metrics for interval sets: the set scoring, and QVHighlights' own metric against numbers computed by
jayleicn/moment_detr's standalone_eval (tests/fixtures/qvhighlights_moment_detr.json, run outside the project)."""
import json
from pathlib import Path

import pytest

from grounding_rl.data.samples import validate_spans
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


def test_compare_puts_single_and_multi_span_runs_side_by_side():
    from grounding_rl.eval.compare import comparison_table

    single = {"R1@0.3": 50.0, "R1@0.5": 40.0, "R1@0.7": 20.0, "mIoU": 35.0, "format_rate": 99.0, "n": 10}
    table = comparison_table({"one": single, "sets": {**single, "precision": 60.0, "recall": 55.5}})
    assert table.splitlines()[0].endswith("| n | precision | recall |")
    assert table.splitlines()[2] == "| one | 50.00 | 40.00 | 20.00 | 35.00 | 99.00 | - | 10 | - | - |"
    assert comparison_table({"one": single}).splitlines()[0].endswith("| n |")   # as before


def test_timeline_plot_draws_one_bar_per_span(tmp_path):
    import numpy as np

    from grounding_rl.eval.infer import answer_result
    from grounding_rl.eval.gallery import plot_timeline
    from types import SimpleNamespace

    result = answer_result("q", "[[0, 3.5], [10, 12], [19, 40]]", 20.0, set_answers=True)
    assert (result["spans"], result["start"], result["end"]) == ([[0.0, 3.5], [10.0, 12.0], [19.0, 20.0]], 0.0, 20.0)
    video = SimpleNamespace(duration=20.0, frames=np.zeros((4, 8, 8, 3), np.uint8), timestamps=[1, 6, 11, 16],
                            path="v.mp4", num_frames=4, sampled_fps=0.2)
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import Rectangle

    created = []
    original = plt.figure
    plt.figure = lambda *a, **k: created.append(original(*a, **k)) or created[-1]
    try:
        plot_timeline(video, [result], tmp_path / "t.png", gts=[[[0, 4], [10, 12]]])
    finally:
        plt.figure = original
    lanes = created[0].axes[1]
    bars = [p for p in lanes.patches if isinstance(p, Rectangle) and p.get_fill()]
    outlines = [p for p in lanes.patches if isinstance(p, Rectangle) and not p.get_fill()]
    assert (len(bars), len(outlines)) == (3, 2) and (tmp_path / "t.png").stat().st_size > 0


def test_prediction_records_of_sets_and_single_spans():
    from grounding_rl.data.samples import Sample
    from grounding_rl.reward.records import metrics_from_records, prediction_record

    multi = Sample("v.mp4", "q", 0.0, 30.0, 100.0, "m", "timelens2", spans=((0.0, 10.0), (20.0, 30.0)))
    single = Sample("v.mp4", "q", 40.0, 50.0, 100.0, "s", "jsonl")
    r_multi = prediction_record(multi, "<answer>[[0, 10], [20, 25]]</answer>")
    r_single = prediction_record(single, "<answer>40 to 50</answer>")
    assert (r_multi["pred_spans"], r_multi["start"], r_multi["end"], r_multi["iou"]) == (
        [[0.0, 10.0], [20.0, 25.0]], 0.0, 25.0, 0.75)
    assert "pred_spans" not in r_single and r_single["iou"] == 1.0      # single-span records as before
    # a set template reads a single-span query's answer as a set
    r_set = prediction_record(single, "[[40, 45], [45, 50]]", set_answers=True)
    assert r_set["pred_spans"] == [[40.0, 45.0], [45.0, 50.0]] and r_set["iou"] == 1.0
    metrics = metrics_from_records([r_multi, r_single], "default_multi", scorings=("set",))
    assert metrics["mIoU"] == pytest.approx(87.5) and metrics["precision"] == pytest.approx(100.0)
    assert metrics["recall"] == pytest.approx(87.5) and metrics["by_scoring"]["set"]["mIoU"] == pytest.approx(87.5)


def test_eval_on_interval_sets_writes_sets_and_set_scores(tiny_model_dir, videos_dir, tmp_path):
    from grounding_rl.cli import main as cli

    rows = [json.loads(line) for line in (videos_dir / "annotations.jsonl").read_text().splitlines()[:3]]
    for row in rows:
        row["video"] = str((videos_dir / row["video"]).resolve()) if not Path(row["video"]).is_absolute() else \
            row["video"]
    rows[0]["spans"] = [[rows[0]["start"], rows[0]["start"] + 1.0], [rows[0]["end"] - 1.0, rows[0]["end"]]]
    rows[1]["spans_all"] = [[rows[1]["start"], rows[1]["end"]], [0.0, 0.5]]
    data = _jsonl(tmp_path / "sets.jsonl", rows)
    out = tmp_path / "out"
    fast = ["--fps", "1", "--max-pixels", str(28 * 28 * 16), "--min-pixels", str(28 * 28 * 4), "--max-new-tokens",
            "12", "--num-workers", "0", "--batch-size", "4"]
    assert cli(["eval", "--model", str(tiny_model_dir), "--data", str(data), "--out", str(out), *fast,
                "--prompt-template", "timelens2", "--scoring", "set"]) == 0
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert all({"gt_spans", "pred_spans"} <= set(r) for r in records)     # a set template: every query as a set
    assert len(records[0]["gt_spans"]) == 2 and records[1]["gt_spans_all"] == [[rows[1]["start"], rows[1]["end"]],
                                                                              [0.0, 0.5]]
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"precision", "recall"} <= set(metrics) and set(metrics["by_scoring"]) == {"standard", "clamped", "set"}
    report = (out / "report.md").read_text()
    assert "Interval sets" in report and f"| {records[0]['qid']} | " in report and "## Interval sets (first" in report


EDGES = json.loads((Path(__file__).parent / "fixtures" / "qvhighlights_moment_detr_edges.json").read_text())


@pytest.mark.parametrize("name", sorted(EDGES["cases"]))
def test_qvhighlights_equals_moment_detr_at_the_edges(name):
    """Out-of-video windows (not clamped), repeated windows of a text answer (each a false positive), touching GT
    windows (separate instances: the record's raw_spans), an empty window against an empty GT window, and scored
    windows ranked by score: moment_detr's own numbers (fixture: its code, 2-decimal rounding)."""
    case = EDGES["cases"][name]
    gt, pred = case["ground_truth"], case["pred_relevant_windows"]
    raw = gt["relevant_windows"]
    merged = [list(span) for span in validate_spans(tuple(map(tuple, raw)), gt["duration"])] or raw
    record = {"qid": 0, "duration": gt["duration"], "start": raw[0][0], "end": raw[-1][1], "spans": merged,
              "raw_spans": raw}
    if name == "scored_out_of_order":
        record["pred_spans"] = pred  # [start, end, score]: ranked by the score
    else:  # a text answer, ranked in written order
        record["answer"] = "<answer>" + json.dumps([w[:2] for w in pred]) + "</answer>"
    got = qvhighlights_metrics([record])
    for key, expected in case["expected"].items():
        assert got[key] == pytest.approx(expected, abs=0.005 + 1e-9), key


def test_the_two_cases_of_the_issue_and_the_raw_spans_of_prepare(tmp_path):
    """gt [[140, 150]] of 150 s, pred [[141, 160]]: (R1@0.5, mAP) = (0, 0), not clamped to [141, 150]; gt [[0, 10],
    [20, 30]], answer [[40, 50], [40, 50], [20, 30]]: mAP 16.67. Touching windows: validation merges ``spans`` and
    keeps ``raw_spans`` in the canonical line, and they reach the scoring through predictions.jsonl's records."""
    from grounding_rl.data.samples import Sample, iter_samples, validate_sample, write_samples
    from grounding_rl.reward.records import _metric_row, prediction_record

    out = qvhighlights_metrics([{"duration": 150.0, "start": 140.0, "end": 150.0, "spans": [[140.0, 150.0]],
                                 "pred_spans": [[141.0, 160.0]]}])
    assert (out["R1@0.5"], out["mAP"]) == (0.0, 0.0)
    out = qvhighlights_metrics([{"duration": 60.0, "start": 0.0, "end": 30.0, "spans": [[0.0, 10.0], [20.0, 30.0]],
                                 "answer": "<answer>[[40, 50], [40, 50], [20, 30]]</answer>"}])
    assert out["mAP"] == pytest.approx(16.67, abs=0.005)

    sample, status = validate_sample(Sample("v.mp4", "q", 0.0, 20.0, 60.0, "t", "qvhighlights",
                                            spans=((0.0, 10.0), (10.0, 20.0))))
    assert sample.spans == ((0.0, 20.0),) and sample.raw_spans == ((0.0, 10.0), (10.0, 20.0))
    assert validate_sample(sample)[0] == sample  # stable under itself
    write_samples(tmp_path / "c.jsonl", [sample])
    line = json.loads((tmp_path / "c.jsonl").read_text())
    assert line["spans"] == [[0.0, 20.0]] and line["raw_spans"] == [[0.0, 10.0], [10.0, 20.0]]
    (read,) = iter_samples(tmp_path / "c.jsonl")
    assert read.raw_spans == sample.raw_spans
    row = _metric_row(prediction_record(read, "<answer>[[0, 10], [10, 20]]</answer>", set_answers=True))
    assert row["raw_spans"] == [[0.0, 10.0], [10.0, 20.0]]
    assert qvhighlights_metrics([row])["mAP"] == 100.0  # against the merged [0, 20] alone: 10.0
