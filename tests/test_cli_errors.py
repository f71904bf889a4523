"""A user's mistake is one line on stderr naming the file (and line), exit status 2, no traceback — for every CLI.

Each row of ``CASES`` is (subcommand arguments, text the line must contain), run through the ``grounding-rl``
dispatcher in-process; ``--debug`` / ``GROUNDING_RL_DEBUG=1`` shows the traceback instead.
"""
import json
from pathlib import Path

import pytest

from grounding_rl.cli import main as cli
from grounding_rl.errors import UserError
from grounding_rl.paths import REPO_ROOT, shared_dir


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "typo.yaml").write_text("train_file: t.jsonl\nmodel_name_or_path: m\nlearnig_rate: 1.0e-5\n")
    (d / "list.yaml").write_text("- a\n- b\n")
    (d / "broken.yaml").write_text("train_file: [unclosed\n")
    (d / "latin1.yaml").write_bytes("train_file: caf\xe9.jsonl\n".encode("latin-1"))
    (d / "latin1.txt").write_bytes("AAA 1.0 2.0##a caf\xe9 person\n".encode("latin-1"))
    (d / "ann.txt").write_text("AAA 1.0 2.0##a person opens the door.\n")
    (d / "empty.txt").write_text("")
    (d / "gt.jsonl").write_text(json.dumps({"video": "v.mp4", "query": "q", "start": 1, "end": 2, "duration": 5,
                                            "qid": "a"}) + "\n")
    (d / "pred_empty.jsonl").write_text("")
    (d / "a_file").write_text("x")
    (d / "folder").mkdir()
    return d


def shared(*parts):
    root = shared_dir()
    if root is None:
        pytest.skip("../shared is not available")
    return str(root.joinpath(*parts))


CASES = {
    "train: typo'd config key": (lambda d: ["train", "--config", str(d / "typo.yaml")],
                                 ["typo.yaml:3: unknown key 'learnig_rate'", "did you mean 'learning_rate'"]),
    "train: unknown flag": (lambda d: ["train", "--config", str(REPO_ROOT / "configs" / "demo_grpo.yaml"),
                                       "--num_generation", "4"], ["unknown option --num_generation",
                                                                  "'--num_generations'"]),
    "train: missing config file": (lambda d: ["train", "--config", str(d / "nope.yaml")], ["nope.yaml: no such"]),
    "train: config not a mapping": (lambda d: ["train", "--config", str(d / "list.yaml")], ["list.yaml: a config"]),
    "train: config not YAML": (lambda d: ["train", "--config", str(d / "broken.yaml")], ["broken.yaml:2: not valid"]),
    "train: config not UTF-8": (lambda d: ["train", "--config", str(d / "latin1.yaml")],
                                ["latin1.yaml: not UTF-8 text (byte 15"]),
    "train: invalid value": (lambda d: ["train", "--config", str(REPO_ROOT / "configs" / "demo_grpo.yaml"),
                                        "--loss_type", "ppo"], ["demo_grpo.yaml: invalid GroundingGRPOConfig",
                                                                "loss_type 'ppo'"]),
    "sft: typo'd config key": (lambda d: ["sft", "--config", str(d / "typo.yaml")], ["unknown key 'learnig_rate'"]),
    "sft: invalid value": (lambda d: ["sft", "--config", str(REPO_ROOT / "configs" / "demo_sft.yaml"),
                                      "--prompt_template", "nope"], ["demo_sft.yaml: invalid", "'nope'"]),
    "prepare: missing --durations file": (
        lambda d: ["prepare", "--format", "charades_sta", "--annotations", str(d / "ann.txt"), "--durations",
                   str(d / "nope.json"), "--out", str(d / "o.jsonl")], ["nope.json: No such file"]),
    "prepare: missing annotation file": (
        lambda d: ["prepare", "--format", "jsonl", "--annotations", str(d / "nope.jsonl"), "--out",
                   str(d / "o.jsonl")], ["nope.jsonl: annotation file not found"]),
    "prepare: non-UTF-8 annotations": (
        lambda d: ["prepare", "--format", "charades_sta", "--annotations", str(d / "latin1.txt"), "--out",
                   str(d / "o.jsonl")], ["latin1.txt: not UTF-8 text (byte 18"]),
    "prepare: wrong format (a 1.7 MB json read as Charades-STA text)": (
        lambda d: ["prepare", "--format", "charades_sta", "--annotations",
                   shared("data", "benchmarks", "activitynet_captions", "val_2.json"), "--out", str(d / "o.jsonl")],
        ["val_2.json:1: expected 'VIDEOID start end##sentence'", "more characters"]),
    "prepare: empty annotation file": (
        lambda d: ["prepare", "--format", "charades_sta", "--annotations", str(d / "empty.txt"), "--out",
                   str(d / "o.jsonl")], ["empty.txt: no usable line"]),
    "prepare: --out is a folder": (
        lambda d: ["prepare", "--format", "jsonl", "--annotations", str(d / "gt.jsonl"), "--out", str(d / "folder")],
        ["folder: --out is a folder"]),
    "prepare: --out under a file (unwritable)": (
        lambda d: ["prepare", "--format", "jsonl", "--annotations", str(d / "gt.jsonl"), "--out",
                   str(d / "a_file" / "o.jsonl")], ["a_file"]),
    "score: missing predictions file": (
        lambda d: ["score", "--predictions", str(d / "nope.jsonl"), "--annotations", str(d / "gt.jsonl")],
        ["nope.jsonl: No such file"]),
    "score: empty predictions file": (
        lambda d: ["score", "--predictions", str(d / "pred_empty.jsonl"), "--annotations", str(d / "gt.jsonl")],
        ["pred_empty.jsonl: no predictions"]),
    "eval: missing data file": (
        lambda d: ["eval", "--model", str(d), "--data", str(d / "nope.jsonl"), "--out", str(d / "ev")],
        ["nope.jsonl: No such file"]),
    "eval: --out under a file (before the model loads)": (
        lambda d: ["eval", "--model", str(d), "--data", shared("data", "videos", "annotations.jsonl"), "--out",
                   str(d / "a_file" / "ev")], ["a_file"]),
    "merge-lora: not an adapter": (
        lambda d: ["merge-lora", "--adapter", str(d / "folder"), "--out", str(d / "merged")],
        ["folder: no adapter_config.json"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_user_mistake_is_one_line_and_exit_2(name, files, capsys):
    make_argv, expected = CASES[name]
    argv = make_argv(files)
    assert cli(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"grounding-rl {argv[0]}: error: ") and "Traceback" not in err
    for text in expected:
        assert text in lines[0], lines[0]
    assert len(lines[0]) < 400


def test_debug_shows_the_traceback(files, monkeypatch):
    argv = CASES["train: typo'd config key"][0](files)
    with pytest.raises(UserError, match="unknown key 'learnig_rate'"):
        cli([*argv, "--debug"])
    monkeypatch.setenv("GROUNDING_RL_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        cli(CASES["score: missing predictions file"][0](files))


def test_programming_errors_still_raise(monkeypatch):
    import grounding_rl.eval.compare as compare

    monkeypatch.setattr(compare, "main", lambda argv: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli(["compare"])


def test_train_help_starts_with_the_config_usage(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli(["train", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: grounding-rl train --config CONFIG.yaml [--key value ...]")
    assert "configs/README.md" in out.split("options:")[0]
    assert Path(REPO_ROOT / "configs" / "README.md").is_file()


def test_missing_videos_fail_above_max_missing_fraction(tmp_path, capsys):
    """11 of 12 videos missing (a wrong --video-root): prepare, eval and train stop with the count and first paths;
    with max_missing_fraction 1.0 prepare goes on and reports the count."""
    from grounding_rl.data.missing import check_fraction

    rows = [{"video": f"v{i:02d}.mp4", "query": "q", "start": 1.0, "end": 2.0, "duration": 5.0, "qid": str(i)}
            for i in range(12)]
    (tmp_path / "v00.mp4").write_bytes(b"")  # one exists
    ann = tmp_path / "ann.jsonl"
    ann.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["prepare", "--format", "jsonl", "--annotations", str(ann), "--video-root", str(tmp_path), "--out",
            str(tmp_path / "o.jsonl")]
    assert cli(base) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "11 of 12 videos (92 %, more than max_missing_fraction 0.05), e.g. " in err and "v01.mp4" in err
    assert not (tmp_path / "o.jsonl").exists()
    assert cli([*base, "--max-missing-fraction", "1.0"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["missing_videos"] == 11

    assert cli(["eval", "--model", str(tmp_path), "--data", str(ann), "--out", str(tmp_path / "ev")]) == 2
    assert "missing 11 of 12 videos" in capsys.readouterr().err
    assert not (tmp_path / "ev").exists()  # found before the model loads or anything is written
    assert cli(["train", "--config", str(REPO_ROOT / "configs" / "demo_grpo.yaml"), "--train_file", str(ann),
                "--output_dir", str(tmp_path / "tr")]) == 2
    assert "missing 11 of 12 videos" in capsys.readouterr().err

    check_fraction(["a"], 20, 0.05, "x")  # 5 % is allowed
    with pytest.raises(UserError, match="2 of 20 videos"):
        check_fraction(["a", "b"], 20, 0.05, "x")
    check_fraction(["a"] * 20, 20, 1.0, "x")  # 1.0 never fails


def test_benchmark_files_come_from_the_data_root(tmp_path, monkeypatch, capsys):
    """evaluation/*.yaml name annotation files under --data-root, else $GROUNDING_RL_DATA, else the test data; with
    none of them the error says how to set it."""
    import grounding_rl.paths as paths
    from grounding_rl.eval import benchmarks

    yaml_path = str(REPO_ROOT / "evaluation" / "charades_sta_test.yaml")
    assert benchmarks.main(["prepare-args", yaml_path, "--out", "o.jsonl", "--data-root", str(tmp_path),
                            "--video-root", str(tmp_path)]) == 0
    args = capsys.readouterr().out.splitlines()
    assert args[args.index("--annotations") + 1] == str(tmp_path / "charades_sta" / "charades_sta_test.txt")
    assert args[args.index("--durations") + 1] == str(tmp_path / "charades_sta" / "charades.json")
    monkeypatch.setenv("GROUNDING_RL_DATA", str(tmp_path / "env"))
    assert benchmarks.load_benchmark(yaml_path).annotations == str(tmp_path / "env" / "charades_sta" /
                                                                   "charades_sta_test.txt")
    monkeypatch.delenv("GROUNDING_RL_DATA")
    monkeypatch.setattr(paths, "shared_dir", lambda: None)
    assert benchmarks.main(["prepare-args", yaml_path, "--out", "o.jsonl", "--video-root", "v"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "GROUNDING_RL_DATA" in err and "--data-root" in err


def test_script_usage_texts_are_clean():
    import subprocess

    for script in ("eval.sh", "infer.sh"):
        proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / script)], capture_output=True, text=True)
        assert proc.returncode == 2, script
        assert proc.stderr.lstrip().startswith("Evaluate a checkpoint" if script == "eval.sh" else "Ask when")
        assert "set -euo" not in proc.stderr and "#" not in proc.stderr.splitlines()[0], proc.stderr
