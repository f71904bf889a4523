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
    score_only = tmp_path / "baseline.json"  # `score` / `baseline` metrics record no data file: not compared
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
