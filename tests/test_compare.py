"""``grounding-rl compare``: a run name given twice, runs evaluated on different data files, and a scoring a
metrics.json lacks are one line naming what is wrong."""
import json

from grounding_rl.cli import main as cli


def eval_folder(folder, data, sha, mIoU):  # noqa: N803 - the metric's name
    folder.mkdir()
    (folder / "metrics.json").write_text(json.dumps({"mIoU": mIoU, "n": 2, "data": str(data)}))
    (folder / "eval_config.json").write_text(json.dumps({"data": str(data), "data_sha256": sha}))
    return folder


def one_line(capsys):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_compare_refuses_a_name_twice_and_runs_on_other_data(tmp_path, capsys):
    a = eval_folder(tmp_path / "a", tmp_path / "test.jsonl", "1" * 64, 40.0)
    b = eval_folder(tmp_path / "b", tmp_path / "test.jsonl", "1" * 64, 50.0)
    other = eval_folder(tmp_path / "other", tmp_path / "val.jsonl", "2" * 64, 60.0)
    assert cli(["compare", f"x={a}", f"x={b}"]) == 2
    assert one_line(capsys) == ("grounding-rl compare: error: run name 'x' is given twice; give each NAME=PATH a name "
                                "of its own")
    assert cli(["compare", f"a={a}", f"b={b}", f"c={other}"]) == 2
    assert one_line(capsys) == (f"grounding-rl compare: error: runs evaluated on different data: a on "
                                f"{tmp_path / 'test.jsonl'}, c on {tmp_path / 'val.jsonl'}; compare runs of one test "
                                "set")
    score_only = tmp_path / "baseline.json"  # metrics naming no data file (an older `score`'s): not compared
    score_only.write_text(json.dumps({"mIoU": 10.0, "n": 2}))
    assert cli(["compare", f"a={a}", f"b={b}", f"base={score_only}"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [row.split(" | ")[0] for row in rows[2:]] == ["| a", "| b", "| base"]
    assert [row.split(" | ")[4] for row in rows[2:]] == ["40.00", "50.00", "10.00"]


def test_compare_scoring_names_the_file_given(tmp_path, capsys):
    given = tmp_path / "ev" / "metrics_old.json"
    given.parent.mkdir()
    given.write_text(json.dumps({"mIoU": 1.0, "n": 1}))
    assert cli(["compare", f"a={given}", "--scoring", "timezero"]) == 2
    assert one_line(capsys) == (f"grounding-rl compare: error: {given}: no scoring standard, clamped, timezero in "
                                f"it and no {tmp_path / 'ev' / 'predictions.jsonl'} to compute it from")


def test_compare_refuses_score_metrics_of_other_data(tmp_path, capsys):
    """``score`` (and so ``baseline --metrics``) records the annotations it scored: a baseline scored on another
    file is refused, as an eval run on another file is (it used to be listed silently)."""
    from grounding_rl.eval.score import score

    runs = {}
    for name, end in (("test", 2.0), ("val", 3.0)):
        data = tmp_path / f"{name}.jsonl"
        data.write_text(json.dumps({"video": "v.mp4", "query": "q", "start": 1.0, "end": end, "duration": 5.0,
                                    "qid": "a"}) + "\n")
        pred = tmp_path / f"pred_{name}.jsonl"
        pred.write_text(json.dumps({"qid": "a", "start": 1.0, "end": 2.0}) + "\n")
        runs[name] = tmp_path / name / "metrics.json"
        runs[name].parent.mkdir()
        runs[name].write_text(json.dumps(score(pred, data)))
    assert json.loads(runs["val"].read_text())["data"] == str(tmp_path / "val.jsonl")
    capsys.readouterr()
    assert cli(["compare", f"base={runs['val'].parent}", f"mine={runs['test']}"]) == 2
    assert one_line(capsys) == (f"grounding-rl compare: error: runs evaluated on different data: base on "
                                f"{tmp_path / 'val.jsonl'}, mine on {tmp_path / 'test.jsonl'}; compare runs of one "
                                "test set")
    assert cli(["compare", f"a={runs['test']}", f"b={runs['test'].parent}"]) == 0
