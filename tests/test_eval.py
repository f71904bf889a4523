"""grounding-rl eval: files and keys, resume, sharding, failures, benchmarks, eval.sh."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import grounding_rl
from grounding_rl.data.samples import Sample
from grounding_rl.data.video import VideoSettings
from grounding_rl.eval import evaluate as ev
from grounding_rl.eval.benchmarks import anchors_table, load_benchmark
from grounding_rl.eval.settings import PreprocessingOverrides, resolve_config
from grounding_rl.paths import REPO_ROOT
from grounding_rl.prompts.preprocessing import GroundingConfig
from grounding_rl.reward.records import prediction_record

torch.set_num_threads(1)

# A small pixel budget and short generations so that a 15-query eval takes a few seconds on CPU.
FAST = ["--fps", "1", "--max-pixels", str(28 * 28 * 16), "--min-pixels", str(28 * 28 * 4), "--max-new-tokens", "12",
        "--num-workers", "0", "--batch-size", "4"]
METRIC_KEYS = ("n", "R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "parse_failure_rate", "format_rate")
RECORD_KEYS = {"qid", "video", "query", "duration", "gt_start", "gt_end", "gt_raw_start", "gt_raw_end", "answer",
               "reasoning", "start", "end", "iou"}


def _env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT))
    return env


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def noisy_model_dir(request, tmp_path_factory) -> Path:
    """The tiny model of each family, made noisy (``conftest.make_noisy_model``)."""
    from conftest import FAMILY_MODEL_FIXTURES, make_noisy_model

    tiny_model_dir = request.getfixturevalue(FAMILY_MODEL_FIXTURES[request.param])
    return make_noisy_model(tiny_model_dir, tmp_path_factory.mktemp("noisy_model"))


def _eval(model, data, out, *extra) -> int:
    from grounding_rl.cli import main as cli

    return cli(["eval", "--model", str(model), "--data", str(data), "--out", str(out), *FAST, *extra])


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _metrics(out: Path) -> dict:
    data = json.loads((out / "metrics.json").read_text())
    return {k: data[k] for k in METRIC_KEYS + ("video_load_failures",)}


# ------------------------------------------------------------------------------------------------ pure functions
def _sample(start=2.0, end=4.5, duration=35.2, qid="q") -> Sample:
    return Sample(video="v.mp4", query="q", start=start, end=end, duration=duration, qid=qid, source="t")


def test_prediction_record_parses_and_scores_like_the_reward():
    rec = prediction_record(_sample(), "<think>she sits</think><answer>2.0 to 4.5</answer>")
    assert set(rec) == RECORD_KEYS
    assert (rec["start"], rec["end"], rec["iou"], rec["reasoning"]) == (2.0, 4.5, 1.0, "she sits")
    # clamped to the clip before IoU: 30-50 on a 35.2 s clip vs GT 30-35.2 → IoU 1
    assert prediction_record(_sample(30.0, 35.2), "<answer>30 to 50</answer>")["iou"] == pytest.approx(1.0)
    reversed_ = prediction_record(_sample(), "<answer>4.5 to 2.0</answer>")
    assert (reversed_["start"], reversed_["end"], reversed_["iou"]) == (4.5, 2.0, 0.0)
    failed = prediction_record(_sample(), None, error="x.mp4: no such video file")
    assert failed["error"] == "x.mp4: no such video file" and failed["iou"] == 0.0 and failed["answer"] is None


def test_metrics_from_records_counts_failures_as_zero():
    recs = [prediction_record(_sample(0.0, 10.0, 20.0, "a"), "<think>t</think><answer>0 to 10</answer>"),  # 1.0
            prediction_record(_sample(0.0, 10.0, 20.0, "b"), "<think>t</think><answer>0 to 5</answer>"),  # 0.5
            prediction_record(_sample(0.0, 10.0, 20.0, "c"), "no tags"),  # unparseable
            prediction_record(_sample(0.0, 10.0, 20.0, "d"), None, error="broken")]  # load failure
    m = ev.metrics_from_records(recs)
    assert m["n"] == 4
    assert (m["R1@0.3"], m["R1@0.5"], m["R1@0.7"]) == (50.0, 50.0, 25.0)
    assert m["mIoU"] == pytest.approx(37.5)
    assert m["parse_failure_rate"] == 50.0 and m["format_rate"] == 50.0 and m["video_load_failures"] == 1


def test_metrics_json_has_both_scorings_side_by_side():
    """An annotation ending past the video (Charades-STA: 562 of 3,720 test queries): ``standard`` scores the
    annotation as written against the prediction as parsed, ``clamped`` clamps both into the clip."""
    from grounding_rl.data.samples import validate_sample

    past_end, _ = validate_sample(Sample(video="v.mp4", query="q", start=20.0, end=40.0, duration=30.0, qid="a",
                                         source="t"))
    assert (past_end.start, past_end.end, past_end.raw_start, past_end.raw_end) == (20.0, 30.0, 20.0, 40.0)
    recs = [prediction_record(past_end, "<think>t</think><answer>20 to 30</answer>"),  # std 0.5, clamped 1
            prediction_record(past_end, "<think>t</think><answer>25 to 45</answer>"),  # std 15/25, clamped 5/10
            prediction_record(_sample(0.0, 10.0, 20.0, "c"), "<think>t</think><answer>0 to 10</answer>")]
    assert recs[0]["gt_raw_end"] == 40.0 and recs[0]["gt_end"] == 30.0
    m = ev.metrics_from_records(recs)
    assert m["scoring"] == "standard" and set(m["by_scoring"]) == {"standard", "clamped"}
    std, clamped = m["by_scoring"]["standard"], m["by_scoring"]["clamped"]
    assert m["mIoU"] == std["mIoU"] == pytest.approx(100 * (0.5 + 0.6 + 1.0) / 3)
    assert clamped["mIoU"] == pytest.approx(100 * (1.0 + 0.5 + 1.0) / 3)
    assert (std["R1@0.5"], std["R1@0.7"]) == pytest.approx((100.0, 100 / 3))  # 0.5 is an exact tie: counted
    assert (clamped["R1@0.5"], clamped["R1@0.7"]) == pytest.approx((100.0, 200 / 3))
    assert std["n"] == clamped["n"] == 3


def test_read_predictions_skips_a_half_written_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"qid": "0", "iou": 0.5}\n{"qid": "1", "io')
    records, skipped = ev.read_predictions(path)
    assert [r["qid"] for r in records] == ["0"] and skipped == 1


def test_resolve_config_precedence(tmp_path):
    bench = GroundingConfig(prompt_template="timezero", video=VideoSettings(fps=2.0, total_pixels=3584 * 28 * 28))
    cfg, source = resolve_config(tmp_path)  # no grounding_config.json
    assert cfg == GroundingConfig() and "built-in defaults" in source
    cfg, source = resolve_config(tmp_path, fallback=bench, fallback_name="benchmark X")
    assert cfg.prompt_template == "timezero" and cfg.video.total_pixels == 3584 * 28 * 28 and "benchmark X" in source
    GroundingConfig(prompt_template="default", video=VideoSettings(fps=1.0, min_pixels=3136, max_pixels=50176)).save(
        tmp_path)
    cfg, source = resolve_config(tmp_path, fallback=bench)  # the checkpoint's own config beats the benchmark
    assert (cfg.prompt_template, cfg.video.fps, cfg.video.max_pixels) == ("default", 1.0, 50176)
    assert "grounding_config.json" in source
    cfg, source = resolve_config(tmp_path, PreprocessingOverrides(prompt_template="timezero", fps=0.5))
    assert (cfg.prompt_template, cfg.video.fps, cfg.video.max_pixels) == ("timezero", 0.5, 50176)
    assert "overridden on the command line: fps, prompt_template" in source
    with pytest.raises(ValueError, match="unknown prompt_template"):
        resolve_config(tmp_path, PreprocessingOverrides(prompt_template="nope"))


# ------------------------------------------------------------------------------------------------ end to end
def test_eval_writes_all_files_with_the_right_keys(family_model_dir, videos_dir, tmp_path, capsys):
    tiny_model_dir = family_model_dir
    out = tmp_path / "out"
    assert _eval(tiny_model_dir, videos_dir / "annotations.jsonl", out) == 0
    stdout = capsys.readouterr().out
    assert "built-in defaults" in stdout  # the tiny model has no grounding_config.json: it says so
    for name in ("predictions.jsonl", "metrics.json", "report.md", "report.html", "iou_hist.png", "eval_config.json"):
        assert (out / name).is_file(), name
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n"] == 15
    assert set(METRIC_KEYS) <= set(metrics)
    for key in ("model", "data", "sampling", "seed", "versions"):
        assert key in metrics
    assert metrics["model"] == str(Path(tiny_model_dir).resolve())
    assert metrics["data"] == str((videos_dir / "annotations.jsonl").resolve())
    assert metrics["sampling"]["video"]["fps"] == 1.0 and metrics["sampling"]["max_new_tokens"] == 12
    assert metrics["sampling"]["do_sample"] is False and metrics["seed"] == 0
    for package in ("torch", "transformers", "trl", "qwen-vl-utils", "decord"):
        assert metrics["versions"][package], package
    preds = _lines(out / "predictions.jsonl")
    annotations = _lines(videos_dir / "annotations.jsonl")
    assert [p["qid"] for p in preds] == [str(i) for i in range(15)]  # annotation order, one per query
    assert [p["query"] for p in preds] == [a["query"] for a in annotations]
    assert all(RECORD_KEYS <= set(p) for p in preds)
    # the metrics are those of the predictions: mIoU is the mean of the recorded IoUs
    assert metrics["mIoU"] == pytest.approx(100 * sum(p["iou"] for p in preds) / 15)
    report = (out / "report.md").read_text()
    assert "| n | R1@0.3 | R1@0.5 | R1@0.7 | mIoU |" in report and "iou_hist.png" in report
    assert (out / "iou_hist.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob("predictions.rank*.jsonl"))


def test_interrupted_eval_resumes_to_the_same_metrics(noisy_model_dir, videos_dir, tmp_path, capsys):
    data = videos_dir / "annotations.jsonl"
    once, limited, killed = tmp_path / "once", tmp_path / "limited", tmp_path / "killed"
    assert _eval(noisy_model_dir, data, once) == 0
    reference = _lines(once / "predictions.jsonl")
    assert len({p["answer"] for p in reference}) > 1  # the answers differ between queries

    # stopped after 6 queries (--limit), then run to the end
    assert _eval(noisy_model_dir, data, limited, "--limit", "6") == 0
    assert _metrics(limited)["n"] == 6
    capsys.readouterr()
    assert _eval(noisy_model_dir, data, limited) == 0
    assert "6 already in" in capsys.readouterr().out
    assert _metrics(limited) == _metrics(once)
    assert _lines(limited / "predictions.jsonl") == reference

    # killed while writing line 8: 7 full lines and half a line remain
    shutil.copytree(once, killed)
    text = (killed / "predictions.jsonl").read_text().splitlines(keepends=True)
    (killed / "predictions.jsonl").write_text("".join(text[:7]) + text[7][:25])
    (killed / "metrics.json").unlink()
    assert _eval(noisy_model_dir, data, killed) == 0
    assert "7 already in" in capsys.readouterr().out
    assert _metrics(killed) == _metrics(once)
    assert _lines(killed / "predictions.jsonl") == reference


def test_rerun_with_other_settings_is_refused(tiny_model_dir, videos_dir, tmp_path, capsys):
    data, out = videos_dir / "annotations.jsonl", tmp_path / "out"
    assert _eval(tiny_model_dir, data, out, "--limit", "2") == 0
    capsys.readouterr()
    assert _eval(tiny_model_dir, data, out, "--limit", "2", "--prompt-template", "timezero") == 2
    err = capsys.readouterr().err
    assert "made by something else" in err and "prompt_template: 'default' → 'timezero'" in err
    assert "--overwrite" in err and "new --out" in err and len(err.strip().splitlines()) == 1
    assert _eval(tiny_model_dir, data, out, "--limit", "2", "--prompt-template", "timezero", "--overwrite") == 0
    assert json.loads((out / "metrics.json").read_text())["sampling"]["prompt_template"] == "timezero"


def test_a_failed_model_load_leaves_no_eval_config(tiny_model_dir, videos_dir, tmp_path, monkeypatch):
    """``eval_config.json`` is written once the model has loaded, so a load that fails leaves no record; and a record
    without predictions (left by an older version) does not refuse a rerun whose model fingerprint differs."""
    data, out = videos_dir / "annotations.jsonl", tmp_path / "out"

    def broken(*args, **kwargs):
        raise RuntimeError("the checkpoint is missing a shard")

    from grounding_rl.eval import engines

    monkeypatch.setattr(engines, "load_inference_engine", broken)
    with pytest.raises(RuntimeError, match="missing a shard"):
        _eval(tiny_model_dir, data, out, "--limit", "2")
    assert out.is_dir() and not (out / "eval_config.json").exists()
    monkeypatch.undo()
    (out / "eval_config.json").write_text(json.dumps({"model": str(tiny_model_dir.resolve()),
                                                      "model_fingerprint": "0" * 16}))
    assert _eval(tiny_model_dir, data, out, "--limit", "2") == 0
    assert json.loads((out / "eval_config.json").read_text())["model_fingerprint"] != "0" * 16
    assert len(_lines(out / "predictions.jsonl")) == 2


def test_written_files_follow_the_umask(tmp_path):
    """Files written through a temporary file (mkstemp creates 0600) get the mode ``open()`` would: 0640 under umask
    027 (metrics.json and report files, a scored data file, canonical JSONL)."""
    from grounding_rl.data.samples import write_samples
    from grounding_rl.eval import report
    from grounding_rl.eval.difficulty_scores import write_scored

    umask = os.umask(0o027)
    try:
        report.write_metrics_json(tmp_path / "metrics.json", {"n": 1}, {})
        write_samples(tmp_path / "data.jsonl", [_sample()])
        write_scored(tmp_path / "data.jsonl", tmp_path / "scored.jsonl", {})
        with open(tmp_path / "plain.txt", "w") as handle:
            handle.write("x")
    finally:
        os.umask(umask)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in tmp_path.iterdir()}
    assert modes == dict.fromkeys(["metrics.json", "data.jsonl", "scored.jsonl", "plain.txt"], "0o640")


def test_unreadable_clips_are_recorded_failures(tiny_model_dir, videos_dir, tmp_path, capsys):
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"this is not a video")
    rows = [{"video": str(videos_dir / "mmaction2_pool_cleaning.mp4"), "query": "cleaning the pool", "start": 0.0,
             "end": 10.0, "duration": 10.0, "qid": "ok"},
            {"video": str(tmp_path / "missing.mp4"), "query": "x", "start": 1.0, "end": 2.0, "duration": 5.0,
             "qid": "missing"},
            {"video": str(broken), "query": "y", "start": 1.0, "end": 2.0, "duration": 5.0, "qid": "broken"}]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert _eval(tiny_model_dir, data, out) == 2  # 2 of 3 videos bad: more than max_missing_fraction 0.05
    assert _eval(tiny_model_dir, data, out, "--max-missing-fraction", "1.0", "--overwrite") == 0
    assert "eval: 3 queries; 2 failed clips (IoU 0; 1 of 3 videos missing)" in capsys.readouterr().out
    assert json.loads((out / "metrics.json").read_text())["missing_videos"] == 1
    assert "(IoU 0; of them 1 missing videos)" in (out / "report.md").read_text()
    preds = {p["qid"]: p for p in _lines(out / "predictions.jsonl")}
    assert list(preds) == ["ok", "missing", "broken"]  # never dropped, annotation order
    assert "missing.mp4" in preds["missing"]["error"] and "broken.mp4" in preds["broken"]["error"]
    assert preds["missing"]["iou"] == 0.0 and preds["broken"]["answer"] is None
    assert "error" not in preds["ok"] and isinstance(preds["ok"]["answer"], str)
    metrics = _metrics(out)
    assert metrics["n"] == 3 and metrics["video_load_failures"] == 2


def test_group_and_shard_by_video():
    from grounding_rl.rollout.greedy import group_by_video, shard_by_video

    groups = group_by_video(["a", "b", "a", "c", "b", "d", "d", "d"])
    assert groups == [("a", [0, 2]), ("b", [1, 4]), ("c", [3]), ("d", [5, 6, 7])]
    shards = [shard_by_video(groups, rank, 2) for rank in range(2)]
    assert shards[0] + shards[1] == groups  # whole videos, contiguous, each on one rank
    assert [sum(len(p) for _, p in shard) for shard in shards] == [4, 4]  # balanced by queries
    assert shard_by_video(groups, 0, 1) == groups
    three = [shard_by_video(groups, rank, 3) for rank in range(3)]
    assert sum(three, []) == groups and all(three)


def test_grouped_eval_decodes_and_encodes_each_video_once_with_per_query_answers(noisy_model_dir, videos_dir,
                                                                                  tmp_path, monkeypatch, capsys):
    """15 queries on 6 clips: grouped by video, each clip is decoded once and encoded once per batch; the answers
    equal those of the per-query path (one query per batch, each decoded and encoded alone); with 2 background
    decoding workers too. metrics.json records the wall time and queries per second."""
    import grounding_rl.data.video as video_module
    from grounding_rl.eval import engines
    from grounding_rl.models.loading import load_for_inference, vision_tower
    from grounding_rl.rollout import greedy

    data = videos_dir / "annotations.jsonl"
    decodes, encodings = [], []

    def counting_sample_frames(path, *args, **kwargs):
        decodes.append(path)
        return video_module.sample_frames(path, *args, **kwargs)

    def counting_load(*args, **kwargs):
        model, processor = load_for_inference(*args, **kwargs)
        vision_tower(model).register_forward_hook(lambda module, args, out: encodings.append(args[0].shape[0]))
        return model, processor

    monkeypatch.setattr(greedy, "sample_frames", counting_sample_frames)
    monkeypatch.setattr(engines, "load_for_inference", counting_load)
    assert _eval(noisy_model_dir, data, tmp_path / "grouped", "--batch-size", "8") == 0
    assert len(decodes) == 6 == len(set(decodes))
    grouped_patches = sum(encodings)
    decodes.clear()
    encodings.clear()
    assert _eval(noisy_model_dir, data, tmp_path / "per_query", "--batch-size", "1") == 0
    assert len(encodings) == 15 and len(decodes) == 6
    videos = [row["video"] for row in _lines(data)]
    patches = dict(zip(videos, encodings))  # one query per call: that query's clip
    order = [v for v, positions in greedy.group_by_video(videos) for _ in positions]
    expected = sum(patches[v] for v in set(order[:8])) + sum(patches[v] for v in set(order[8:]))
    assert grouped_patches == expected < sum(encodings)  # each clip once per batch of 8
    grouped, per_query = _lines(tmp_path / "grouped" / "predictions.jsonl"), _lines(tmp_path / "per_query" /
                                                                                    "predictions.jsonl")
    assert [p["answer"] for p in grouped] == [p["answer"] for p in per_query]
    assert len({p["answer"] for p in grouped}) > 1
    assert _eval(noisy_model_dir, data, tmp_path / "workers", "--batch-size", "8", "--num-workers", "2") == 0
    assert _lines(tmp_path / "workers" / "predictions.jsonl") == grouped
    run = json.loads((tmp_path / "grouped" / "metrics.json").read_text())["run"]
    assert run["queries_run"] == 15 and run["videos_run"] == 6 and run["wall_time_s"] > 0
    assert run["queries_per_second"] == pytest.approx(15 / run["wall_time_s"], rel=1e-3)


@pytest.mark.slow
def test_two_process_sharded_eval_matches_one_process(noisy_model_dir, videos_dir, tmp_path):
    data = videos_dir / "annotations.jsonl"
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    assert _eval(noisy_model_dir, data, single, "--batch-size", "2") == 0
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "grounding_rl.cli", "eval",
           "--model", str(noisy_model_dir), "--data", str(data), "--out", str(sharded), *FAST, "--batch-size", "2"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "15 to run on 2 process(es)" in proc.stdout
    assert not list(sharded.glob("predictions.rank*.jsonl"))  # merged by rank 0
    assert _lines(sharded / "predictions.jsonl") == _lines(single / "predictions.jsonl")
    assert _metrics(sharded) == _metrics(single)
    assert json.loads((sharded / "metrics.json").read_text())["num_processes"] == 2


# ------------------------------------------------------------------------------------------------ benchmarks
BENCHMARKS = ("charades_sta_test", "activitynet_val2", "charades_cd_ood", "tvgbench")


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_definitions_match_their_annotation_files(name, benchmarks_dir):
    from grounding_rl.data.readers import read_annotations
    from grounding_rl.data.samples import validate

    bench = load_benchmark(REPO_ROOT / "evaluation" / f"{name}.yaml")
    assert bench.name == name
    assert Path(bench.annotations).is_file() and str(benchmarks_dir) in bench.annotations
    kept, counts = validate(read_annotations(bench.format, bench.annotations, durations=bench.durations),
                            log_limit=0)
    assert counts["kept"] == bench.expected_queries
    # paper protocol (TimeZero / Time-R1): 2 fps, 3584·28·28 pixels per clip, 16·28·28 minimum per frame
    assert (bench.protocol.video.fps, bench.protocol.video.total_pixels) == (2.0, 3584 * 28 * 28)
    assert bench.protocol.video.min_pixels == 16 * 28 * 28 and bench.protocol.prompt_template == "timezero"
    assert bench.protocol.video.sampler == "qwen_vl_utils"  # how the cited TimeZero/Time-R1/VideoChat-R1 ran
    for anchor in bench.anchors:
        assert anchor["source"] and any(anchor.get(k) is not None for k in ("R1@0.3", "R1@0.5", "R1@0.7", "mIoU"))


def test_tvgbench_count_and_anchor_numbers(benchmarks_dir):
    from grounding_rl.eval.benchmarks import dropped_annotations

    tvgbench = load_benchmark(REPO_ROOT / "evaluation" / "tvgbench.yaml")
    assert tvgbench.expected_queries == 789
    assert dropped_annotations(tvgbench) == 11  # zero-length answers: the standard scoring's n is 800, as Time-R1's
    charades = load_benchmark(REPO_ROOT / "evaluation" / "charades_sta_test.yaml")
    timezero = next(a for a in charades.anchors if a["method"].startswith("TimeZero"))
    assert (timezero["R1@0.3"], timezero["R1@0.5"], timezero["R1@0.7"]) == (83.3, 72.5, 47.9)


TIMELENS_BENCH = ("charades_timelens", "activitynet_timelens", "qvhighlights_timelens")


def test_timelens_bench_definitions(tmp_path):
    # the files are not shipped: the definitions load without them (annotations under the data root)
    benches = [load_benchmark(REPO_ROOT / "evaluation" / f"{name}.yaml", data_root_dir=str(tmp_path))
               for name in TIMELENS_BENCH]
    assert [b.format for b in benches] == ["timelens"] * 3 and all(b.video_root is None for b in benches)
    assert [Path(b.annotations).name for b in benches] == ["charades-timelens.json", "activitynet-timelens.json",
                                                           "qvhighlights-timelens.json"]
    assert [b.expected_queries for b in benches] == [3363, None, None]  # the dataset card's count; others unknown
    for b in benches:  # TimeLens's evaluation of its 8B: its prompt, 512 tokens, 2 fps, 64..14,336 tokens of 32x32
        assert (b.protocol.prompt_template, b.max_new_tokens, b.protocol.video.fps) == ("timelens", 512, 2.0)
        assert (b.protocol.video.min_pixels, b.protocol.video.total_pixels) == (64 * 32 * 32, 14336 * 32 * 32)
    cells = {b.name: {a["method"]: tuple(a[k] for k in ("R1@0.3", "R1@0.5", "R1@0.7", "mIoU")) for a in b.anchors}
             for b in benches}
    # TencentARC/TimeLens README, Model Zoo & Performance
    assert cells["charades_timelens"]["TimeLens-8B (Qwen3-VL-8B)"] == (76.6, 63.0, 35.2, 55.2)
    assert cells["activitynet_timelens"]["TimeLens-8B (Qwen3-VL-8B)"] == (68.9, 58.4, 40.6, 53.2)
    assert cells["qvhighlights_timelens"]["TimeLens-8B (Qwen3-VL-8B)"] == (80.2, 71.6, 55.5, 65.5)
    assert cells["charades_timelens"]["Qwen3-VL-8B-Instruct"] == (69.2, 53.4, 27.5, 48.3)
    assert cells["activitynet_timelens"]["Qwen3-VL-8B-Instruct"] == (62.1, 51.2, 34.4, 46.8)
    assert cells["qvhighlights_timelens"]["Qwen3-VL-8B-Instruct"] == (74.2, 64.6, 49.3, 59.4)
    assert cells["charades_timelens"]["TimeLens-7B (Qwen2.5-VL-7B)"] == (70.5, 55.6, 28.4, 48.8)
    # arXiv:2512.14698v2 Table 1 (not in the README)
    assert cells["charades_timelens"]["Time-R1-7B (Qwen2.5-VL-7B)"] == (57.9, 32.0, 16.9, 36.6)
    assert cells["qvhighlights_timelens"]["Time-R1-7B (Qwen2.5-VL-7B)"] == (65.8, 51.5, 36.1, 49.2)
    # TempSamp-R1's ablation on Charades-STA, next to the plain benchmark's anchors
    charades = load_benchmark(REPO_ROOT / "evaluation" / "charades_sta_test.yaml")
    ablation = {a["method"]: (a["R1@0.3"], a["R1@0.5"], a["R1@0.7"]) for a in charades.anchors}
    tempsamp = next(a for a in charades.anchors if a["method"] == "TempSamp-R1 (Qwen2.5-VL-7B)")
    assert tuple(tempsamp[k] for k in ("R1@0.3", "R1@0.5", "R1@0.7", "mIoU")) == (83.6, 74.1, 52.9, 62.1)  # Table 1
    assert ablation["GRPO (TempSamp-R1's ablation)"] == (81.2, 68.9, 46.0)
    assert ablation["GRPO + GT injection (TempSamp-R1's ablation)"] == (77.8, 63.0, 41.3)
    assert ablation["GRPO + GT injection + shaping (TempSamp-R1's ablation)"] == (82.9, 72.1, 49.6)


def test_expected_queries_may_be_null_but_not_absent(tmp_path):
    from grounding_rl.eval.benchmarks import BenchmarkError

    spec = {"name": "x", "format": "timelens", "annotations": str(tmp_path / "x.json"), "expected_queries": None}
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(spec))
    assert load_benchmark(tmp_path / "x.yaml", build_protocol=False).expected_queries is None
    del spec["expected_queries"]
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(BenchmarkError, match="missing field.*expected_queries"):
        load_benchmark(tmp_path / "x.yaml", build_protocol=False)


def test_anchors_page_agrees_with_the_yaml_files():
    page = (REPO_ROOT / "evaluation" / "anchors.md").read_text()
    four_fps = tuple(f"timelens2_vlmevalkit_{part}" for part in ("charades", "activitynet", "qvhighlights"))
    for name in BENCHMARKS + TIMELENS_BENCH + four_fps:
        bench = load_benchmark(REPO_ROOT / "evaluation" / f"{name}.yaml")
        if bench.anchors:
            assert anchors_table(bench.anchors) in page, name
    # TimeLens2's project page (docs/index.html @a5ce450): mIoU of its 4B and 8B on the three parts
    got = {name: [a["mIoU"] for a in load_benchmark(REPO_ROOT / "evaluation" / f"{name}.yaml").anchors][:2]
           for name in four_fps}
    assert got == {four_fps[0]: [57.7, 58.6], four_fps[1]: [59.0, 58.6], four_fps[2]: [69.3, 70.2]}


def _bench_yaml(tmp_path, videos_dir, video_root=True) -> Path:
    spec = {"name": "clips", "format": "jsonl", "annotations": str(videos_dir / "annotations.jsonl"),
            "expected_queries": 15, "video_root": str(videos_dir) if video_root else None,
            "protocol": {"prompt_template": "default", "max_new_tokens": 10,
                         "video": {"fps": 1.0, "max_pixels": 28 * 28 * 16, "min_pixels": 28 * 28 * 4}},
            "anchors": [{"method": "Paper X", "setting": "zero-shot", "R1@0.3": 50.0, "R1@0.5": 30.0,
                         "R1@0.7": None, "mIoU": None, "source": "a README"}]}
    path = tmp_path / "clips.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow
def test_eval_sh_prepares_a_benchmark_and_evaluates(tiny_model_dir, videos_dir, tmp_path):
    out = tmp_path / "out"
    cmd = ["bash", str(REPO_ROOT / "scripts" / "eval.sh"), str(_bench_yaml(tmp_path, videos_dir)),
           str(tiny_model_dir), "--out", str(out), "--num-workers", "0", "--limit", "3"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len((out / "data.jsonl").read_text().splitlines()) == 15  # prepared by grounding-rl prepare
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n"] == 3 and metrics["benchmark"] == "clips"
    # no grounding_config.json in the tiny model: the benchmark's protocol applies
    assert "benchmark clips paper protocol" in metrics["sampling"]["source"]
    assert metrics["sampling"]["video"]["fps"] == 1.0 and metrics["sampling"]["max_new_tokens"] == 10
    report = (out / "report.md").read_text()
    assert "| Paper X | zero-shot | 50.0 | 30.0 | – | – | a README |" in report
    # both scorings side by side, the standard one the headline
    assert metrics["scoring"] == "standard" and set(metrics["by_scoring"]) == {"standard", "clamped"}
    assert metrics["mIoU"] == metrics["by_scoring"]["standard"]["mIoU"]
    assert "| standard (headline) |" in report and "| clamped |" in report
    # rerun on the finished folder with --scoring all: no query runs, every scoring is added from the predictions
    proc = subprocess.run(cmd + ["--scoring", "all"], cwd=REPO_ROOT, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["run"]["queries_run"] == 0 and len(metrics["by_scoring"]) == 11
    assert metrics["scoring"] == "standard" and metrics["mIoU"] == metrics["by_scoring"]["standard"]["mIoU"]
    assert metrics["by_scoring"]["time_r1"]["source"].startswith("xiaomi-research/time-r1 @7f2b594")
    assert "| time_r1 |" in (out / "report.md").read_text()


@pytest.mark.slow
def test_eval_sh_on_a_timelens_bench_file_without_a_known_count(tiny_model_dir, videos_dir, tmp_path):
    # a TimeLens-Bench-format file over two shipped clips: a zero-length span (dropped by the policy, counted back by
    # the standard scoring) and a query listing two spans (scored against the first); expected_queries unknown
    data = {"charades_OHOFG": {"duration": 35.2, "spans": [[2.0, 4.5], [[25.5, 32.0], [33.0, 34.0]], [5.0, 5.0]],
                               "queries": ["person walks in.", "person writes.", "a point"]},
            "mmaction2_basketball_drill": {"duration": 10.0, "spans": [[1.0, 6.0]], "queries": ["a man dribbles"]}}
    (tmp_path / "charades-timelens.json").write_text(json.dumps(data))
    spec = {"name": "tl", "format": "timelens", "annotations": str(tmp_path / "charades-timelens.json"),
            "expected_queries": None, "video_root": str(videos_dir),
            "protocol": {"prompt_template": "timelens", "max_new_tokens": 10,
                         "video": {"fps": 1.0, "max_pixels": 28 * 28 * 16, "min_pixels": 28 * 28 * 4}}}
    (tmp_path / "tl.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    cmd = ["bash", str(REPO_ROOT / "scripts" / "eval.sh"), str(tmp_path / "tl.yaml"), str(tiny_model_dir),
           "--out", str(out), "--num-workers", "0"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "expects" not in proc.stderr  # no count to check against
    rows = [json.loads(line) for line in (out / "data.jsonl").read_text().splitlines()]
    assert [(r["qid"], r["start"], r["end"]) for r in rows] == [
        ("timelens:charades_OHOFG#0", 2.0, 4.5), ("timelens:charades_OHOFG#1", 25.5, 32.0),
        ("timelens:mmaction2_basketball_drill#0", 1.0, 6.0)]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["sampling"]["prompt_template"] == "timelens"
    assert metrics["by_scoring"]["standard"]["n"] == 4 and metrics["by_scoring"]["clamped"]["n"] == 3


def test_eval_sh_without_video_root_fails_clearly(tiny_model_dir, videos_dir, tmp_path):
    cmd = ["bash", str(REPO_ROOT / "scripts" / "eval.sh"), str(_bench_yaml(tmp_path, videos_dir, video_root=False)),
           str(tiny_model_dir), "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--video-root" in proc.stderr


def load_model(path):
    from grounding_rl.models.loading import load_for_inference

    return load_for_inference(path)


def generate_answers(model, processor, queries, clips, template, max_new_tokens):
    from grounding_rl.rollout.generation import SamplingParams
    from grounding_rl.rollout.generation import generate_answers as answers

    return answers(model, processor, queries, clips, template, SamplingParams.greedy(max_new_tokens))


def _clips(videos_dir, model):
    from grounding_rl.data.video import sample_frames
    from grounding_rl.family import family_of

    settings = family_of(model).video_settings(VideoSettings(fps=1.0, max_pixels=28 * 28 * 16,
                                                             min_pixels=28 * 28 * 4))
    return [sample_frames(videos_dir / name, settings) for name in ("charades_OHOFG.mp4", "mmaction2_eye_makeup.avi")]


def test_generation_ignores_sampling_defaults_of_the_checkpoint(noisy_model_dir, videos_dir):
    model, processor = load_model(noisy_model_dir)
    clips, queries = _clips(videos_dir, model), ["person sits down", "eye makeup"]
    greedy = generate_answers(model, processor, queries, clips, "default", 12)
    model.generation_config.do_sample = True  # Qwen2.5-VL's generation_config.json says so
    model.generation_config.temperature = 1.0
    torch.manual_seed(1)
    assert generate_answers(model, processor, queries, clips, "default", 12) == greedy
    # batching does not change the answers (left padding, per-row 3D positions)
    assert [generate_answers(model, processor, [q], [c], "default", 12)[0] for q, c in zip(queries, clips)] == greedy


def test_generation_ignores_the_checkpoint_repetition_penalty(tiny_model_dir, videos_dir):
    model, processor = load_model(tiny_model_dir)
    clips = _clips(videos_dir, model)[:1]
    greedy = generate_answers(model, processor, ["person sits down"], clips, "default", 12)
    assert len(set(greedy[0])) == 1  # the plain tiny model repeats one token: a penalty would change that
    model.generation_config.repetition_penalty = 5.0  # Qwen2.5-VL ships 1.05
    assert generate_answers(model, processor, ["person sits down"], clips, "default", 12) == greedy


def test_a_failed_clip_is_retried_on_rerun(tmp_path):
    """A record with an error (e.g. a clip that failed to load) does not count as done; a later success replaces it."""
    (tmp_path / "predictions.jsonl").write_text(
        json.dumps({"qid": "a", "iou": 0.0, "error": "boom"}) + "\n" + json.dumps({"qid": "b", "iou": 0.4}) + "\n")
    (tmp_path / "predictions.rank0.jsonl").write_text(json.dumps({"qid": "a", "iou": 0.7}) + "\n"
                                                      + json.dumps({"qid": "b", "iou": 0.9}) + "\n")
    done = ev.existing_predictions(tmp_path)
    assert done["a"]["iou"] == 0.7 and "error" not in done["a"]
    assert done["b"]["iou"] == 0.4  # otherwise the first record wins


def test_rerun_on_edited_data_is_refused(tiny_model_dir, videos_dir, tmp_path, capsys):
    """The data path is the same but its content changed (an edited end): old answers must not be reused."""
    data, out = tmp_path / "data.jsonl", tmp_path / "out"
    lines = (videos_dir / "annotations.jsonl").read_text().splitlines()
    data.write_text("\n".join(lines[:2]) + "\n")
    assert _eval(tiny_model_dir, data, out, "--video-root", str(videos_dir)) == 0
    capsys.readouterr()
    row = json.loads(lines[0])
    row["end"] = row["end"] - 0.5
    data.write_text("\n".join([json.dumps(row), lines[1]]) + "\n")
    assert _eval(tiny_model_dir, data, out, "--video-root", str(videos_dir)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "data_sha256" in err and "--overwrite" in err
    assert json.loads((out / "eval_config.json").read_text())["version"] == grounding_rl.__version__


def test_rescoring_reads_a_fresh_answer_over_a_stale_null_start_as_score_does(tmp_path, monkeypatch, capsys):
    """Rows whose ``answer`` was rewritten but whose ``start``/``end`` are still null: eval's report reads the answer,
    as ``grounding-rl score`` does (0 missing predictions, the same metrics), and the histogram gets no failures and
    no more bins than queries."""
    from grounding_rl.eval import report as files
    from grounding_rl.eval.score import score
    from grounding_rl.reward.records import prediction_record

    samples = [_sample(start=2.0 + i, end=4.0 + i, qid=str(i)) for i in range(8)]
    rows = []
    for i, sample in enumerate(samples):
        row = prediction_record(sample, f"<answer>{1.5 + i} to {4.0 + i}</answer>")
        rows.append({**row, "start": None, "end": None})  # stale fields of an earlier, unparsed answer
    out = tmp_path / "ev"
    out.mkdir()
    (out / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    annotations = tmp_path / "gt.jsonl"
    annotations.write_text("".join(json.dumps({"video": s.video, "query": s.query, "start": s.start, "end": s.end,
                                               "duration": s.duration, "qid": s.qid}) + "\n" for s in samples))
    drawn = {}
    monkeypatch.setattr(files, "plot_iou_hist", lambda ious, path, failures, metrics: drawn.update(
        n=len(ious), failures=failures))
    plan_ = ev.EvalPlan(request=ev.EvalRequest(model="m", data=str(annotations), out=str(out)), samples=samples,
                        dropped=0, absent=[], num_videos=1, benchmark=None, config=GroundingConfig(), source="test",
                        max_new_tokens=12, model_id="m", run={"data": str(annotations)})
    metrics = ev.report(plan_, ev.RunResult(queries_run=0, videos_run=0, wall_time_s=0.0))
    assert metrics["missing_predictions"] == 0 and drawn == {"n": 8, "failures": 0}
    scored = score(out / "predictions.jsonl", annotations)
    assert scored["missing_predictions"] == 0
    assert (metrics["mIoU"], metrics["R1@0.5"]) == (scored["mIoU"], scored["R1@0.5"]) and metrics["mIoU"] > 0
    assert "0 without a parsed prediction" in capsys.readouterr().out
    assert not ev.has_prediction({"start": None, "end": None, "answer": "no idea"})
    assert ev.has_prediction({"start": 1.0, "end": 2.0, "answer": None})
    assert len(files.hist_bins(8)) - 1 == 8 and len(files.hist_bins(1000)) - 1 == 20 and len(files.hist_bins(0)) == 2


def test_eval_print_prompt_and_device(tiny_model_dir, videos_dir, tmp_path, capsys):
    """``eval --print-prompt`` prints the first query's exact prompt (as ``infer --print-prompt``), and ``--device
    cpu`` runs; both flags are declared once for eval and infer."""
    out = tmp_path / "out"
    assert _eval(tiny_model_dir, videos_dir / "annotations.jsonl", out, "--limit", "1", "--print-prompt",
                 "--device", "cpu") == 0
    stdout = capsys.readouterr().out
    first = _lines(videos_dir / "annotations.jsonl")[0]
    prompt = stdout.split(f"eval: prompt for qid 0 ({first['query']!r}):\n", 1)[1]
    assert prompt.startswith("<|im_start|>") and "<|vision_start|><|video_pad|>×" in prompt
    assert len(_lines(out / "predictions.jsonl")) == 1


@pytest.mark.parametrize("sub", ["eval", "difficulty", "infer"])
def test_help_texts_are_plain_text_and_share_the_run_flags(sub, capsys):
    from grounding_rl.cli import main as cli

    with pytest.raises(SystemExit) as exit_info:
        cli([sub, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for markup in ("``", ":func:", ":class:", ":mod:"):
        assert markup not in text, markup
    for flag in ("--device", "--print-prompt", "--dtype {auto,bfloat16,float16,float32}", "--video-min-frames"):
        assert flag in text, flag


def test_transformers5_layout_is_refused_outside_the_tested_range(tmp_path, monkeypatch):
    """``--video-layout transformers5`` on a transformers outside the range pyproject.toml pins and the README states
    (they and :data:`TESTED_TRANSFORMERS` agree) is one line naming the installed version."""
    import importlib.metadata
    import re

    from grounding_rl.errors import UserError
    from grounding_rl.eval.settings import TESTED_TRANSFORMERS, check_layout_supported

    low, high = TESTED_TRANSFORMERS
    assert f'"transformers>={low},<{high}"' in (REPO_ROOT / "pyproject.toml").read_text()
    last = f"{high.split('.')[0]}.{int(high.split('.')[1]) - 1}"
    readme = (REPO_ROOT / "README.md").read_text()
    assert f"runs on transformers {low} to {last} (`transformers>={low},<{high}`" in readme
    original = importlib.metadata.version
    for installed, refused in (("5.25.0", True), ("5.18.2", True), ("5.24.0", False), ("5.19.0", False)):
        monkeypatch.setattr(importlib.metadata, "version",
                            lambda name, v=installed: v if name == "transformers" else original(name))
        check_layout_supported("released")  # the default layout has no such bound
        if refused:
            with pytest.raises(UserError, match=re.escape(f"--video-layout transformers5 needs transformers >= {low}, "
                                                          f"< {high} (the tested range); transformers {installed}")):
                resolve_config(tmp_path, PreprocessingOverrides(video_layout="transformers5"))
        else:
            assert resolve_config(tmp_path, PreprocessingOverrides(video_layout="transformers5"))[0].video_layout == \
                "transformers5"


def test_an_out_of_another_tool_is_refused_before_anything_is_written(qwen3_processor_dir, videos_dir, tmp_path,
                                                                      capsys):
    """``--out`` holding ``grounding-rl score``'s input and output (no eval_config.json, rows without gt_start) was
    a ``KeyError: 'gt_start'`` after the run, again on every rerun: one line suggesting --overwrite, nothing added."""
    out = tmp_path / "scored"
    out.mkdir()
    (out / "predictions.jsonl").write_text(json.dumps({"qid": "0", "answer": "1 to 2"}) + "\n")
    (out / "metrics.json").write_text("{}\n")
    assert _eval(qwen3_processor_dir, videos_dir / "annotations.jsonl", out) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"grounding-rl eval: error: {out} holds predictions.jsonl and metrics.json not written by eval (no "
                   "eval_config.json, or rows without gt_start); rerun with --overwrite to replace them, or give a new "
                   "--out")
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "predictions.jsonl"]
