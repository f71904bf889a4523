"""Interval sets through the data: the canonical sample's spans, the per-span validation policy, and the timelens2,
qvhighlights and TimeLens-Bench (spans_all) readers."""
import json

from grounding_rl.data.dataset import GroundingDataset
from grounding_rl.data.readers import read_annotations
from grounding_rl.data.samples import Sample, iter_samples, validate, validate_spans, write_samples


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_validation_per_span_counts_drops_clamps_and_merges():
    counts = {}
    spans = validate_spans(((5, 3), (2, 4), (3.5, 6), (7, 7), (25, 30), (18, 22), (-2, 1)), 20.0, counts)
    assert spans == ((0.0, 1.0), (2.0, 6.0), (18.0, 20.0))
    assert counts == {"spans_dropped": 3, "spans_clamped": 2, "spans_merged": 1}
    sample = Sample("v.mp4", " q ", 0, 0, 20.0, "a", "x", spans=((5, 3), (2, 4), (3.5, 6), (18, 22)))
    (kept,), found = validate([sample])
    assert (kept.start, kept.end, kept.spans, kept.query) == (2.0, 20.0, ((2.0, 6.0), (18.0, 20.0)), "q")
    assert found == {"kept": 1, "dropped": 0, "clamped": 1, "spans_dropped": 1, "spans_clamped": 1,
                     "spans_merged": 1}
    assert validate([kept])[0] == [kept]                                   # stable under itself
    nothing = Sample("v.mp4", "q", 0, 0, 20.0, "b", "x", spans=((25, 30),))
    assert validate([nothing], training=True)[1]["dropped"] == 1
    (edge,), _ = validate([nothing])                                       # evaluation keeps every query
    assert (edge.start, edge.end, edge.spans) == (20.0, 20.0, ((20.0, 20.0),))


def test_single_span_lines_are_written_as_before(tmp_path):
    sample = Sample("v.mp4", "q", 1.0, 2.0, 10.0, "0", "jsonl")
    assert sample.to_json() == ('{"video": "v.mp4", "query": "q", "start": 1.0, "end": 2.0, "duration": 10.0, '
                                '"qid": "0", "source": "jsonl"}')
    assert GroundingDataset([sample])[0]["spans"] is None


def test_timelens2_reader_reads_grouped_and_flat_rows(tmp_path):
    path = _write(tmp_path / "tl2.jsonl", [
        {"video_path": "a.mp4", "duration": 30, "events": [{"query": "q1", "span": [[0, 3.5], [10, 12]]},
                                                           {"query": "q2", "span": [[4, 5]]}]},
        {"video_path": "b.mp4", "duration": 20, "query": "q3", "span": [2, 6]},
    ])
    samples = list(read_annotations("timelens2", path))
    assert [(s.query, s.spans, s.start, s.end, s.qid) for s in samples] == [
        ("q1", ((0.0, 3.5), (10.0, 12.0)), 0.0, 12.0, "timelens2:a.mp4#0"),
        ("q2", ((4.0, 5.0),), 4.0, 5.0, "timelens2:a.mp4#1"),
        ("q3", ((2.0, 6.0),), 2.0, 6.0, "timelens2:b.mp4#0")]
    out = tmp_path / "canonical.jsonl"
    write_samples(out, validate(samples)[0])
    again = list(iter_samples(out))
    assert again[0].spans == ((0.0, 3.5), (10.0, 12.0)) and json.loads(out.read_text().splitlines()[0])["spans"] == [
        [0.0, 3.5], [10.0, 12.0]]
    assert GroundingDataset(again)[0]["spans"] == [[0.0, 3.5], [10.0, 12.0]]


def test_qvhighlights_reader_keeps_every_relevant_window(tmp_path):
    path = _write(tmp_path / "highlight_val_release.jsonl", [
        {"qid": 2579, "query": "A girl and her mother cooked.", "duration": 150, "vid": "NUsG9BgSes0_210.0_360.0",
         "relevant_windows": [[0, 12], [14, 30]], "saliency_scores": [[1, 2, 3]]}])
    (sample,) = read_annotations("qvhighlights", path)
    assert (sample.qid, sample.spans, sample.video.endswith("NUsG9BgSes0_210.0_360.0.mp4")) == (
        "2579", ((0.0, 12.0), (14.0, 30.0)), True)


def test_timelens_bench_keeps_first_span_and_the_full_list(tmp_path):
    path = tmp_path / "qvhighlights-timelens.json"
    path.write_text(json.dumps({"v1": {"duration": 100, "spans": [[[4, 8], [20, 30]], [1, 2]],
                                       "queries": ["two spans", "one span"]}}))
    several, single = read_annotations("timelens", path)
    assert (several.start, several.end, several.spans, several.spans_all) == (
        4.0, 8.0, ((4.0, 8.0),), ((4.0, 8.0), (20.0, 30.0)))
    assert (single.spans, single.spans_all) == (None, None)
    assert "spans" not in single.to_dict()


def test_training_warns_when_a_single_span_reward_meets_several_spans():
    from grounding_rl.cli.train import warn_single_span_rewards

    dataset = GroundingDataset([Sample("v.mp4", "q", 0.0, 9.0, 10.0, "a", "x", spans=((0.0, 1.0), (8.0, 9.0))),
                                Sample("v.mp4", "q", 1.0, 2.0, 10.0, "b", "x")])
    assert "1 of 2 training samples have several spans; reward(s) iou" in warn_single_span_rewards(
        dataset, ["iou", "format"])
    assert warn_single_span_rewards(dataset, ["set_iou", "format"]) is None


def test_prepare_keeps_qvhighlights_touching_windows_as_raw_spans(tmp_path):
    """Touching windows are merged into ``spans`` (training and ``set`` read those) and kept as annotated in
    ``raw_spans`` (``qvhighlights`` scores those, as moment_detr does); a line whose windows are unchanged has none."""
    from grounding_rl.data.prepare import prepare

    path = _write(tmp_path / "highlight_val_release.jsonl", [
        {"qid": 1, "query": "q", "duration": 150, "vid": "a", "relevant_windows": [[0, 10], [10, 20], [40, 42]]},
        {"qid": 2, "query": "q", "duration": 150, "vid": "b", "relevant_windows": [[0, 10], [30, 40]]}])
    prepare("qvhighlights", str(path), str(tmp_path / "out.jsonl"), progress=False)
    first, second = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert first["spans"] == [[0.0, 20.0], [40.0, 42.0]]
    assert first["raw_spans"] == [[0.0, 10.0], [10.0, 20.0], [40.0, 42.0]]
    assert second["spans"] == [[0.0, 10.0], [30.0, 40.0]] and "raw_spans" not in second
    (sample, _) = iter_samples(tmp_path / "out.jsonl")
    assert GroundingDataset([sample.to_dict()])[0]["raw_spans"] == first["raw_spans"]
