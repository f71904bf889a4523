"""The shell entry points: scripts/train.sh on the real-clips tiny config; scripts/gpu_check.sh --dry-run."""
import json
import math
import os
import platform
import subprocess
import sys

import pytest

from grounding_rl.paths import REPO_ROOT


CONFIGS = {"qwen2_5_vl": ("configs/tiny_real_clips.yaml", "Qwen2_5_VLForConditionalGeneration", 28),
           "qwen3_vl": ("configs/tiny_real_clips_qwen3_vl.yaml", "Qwen3VLForConditionalGeneration", 32)}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_train_sh_builds_tiny_model_and_runs_two_grpo_steps(tmp_path, shared, family):
    """scripts/train.sh configs/tiny_real_clips*.yaml: builds the named tiny model (real Qwen tokenizer and processor
    of its family) when missing, runs 2 GRPO steps with beta > 0 on ../shared's real clips, and saves
    grounding_config.json."""
    config_file, architecture, pixel_factor = CONFIGS[family]
    model_dir, out = tmp_path / "tiny", tmp_path / "run"
    env = {**os.environ, "PYTHON": sys.executable, "NUM_GPUS": "1", "HF_HUB_OFFLINE": "1",
           "GROUNDING_RL_SHARED": str(shared)}
    # the config and the output folder relative to the caller's folder: the script does not change folder
    (tmp_path / "recipe.yaml").write_text((REPO_ROOT / config_file).read_text())
    proc = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "train.sh"), "recipe.yaml", "--max_steps", "2",
         "--model_name_or_path", str(model_dir), "--output_dir", "run", "--logging_steps", "1",
         "--frame_cache_dir", str(tmp_path / "cache")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tiny-model: building" in proc.stdout
    model_config = json.loads((model_dir / "config.json").read_text())
    assert model_config["text_config"]["vocab_size"] >= 151665 and model_config["architectures"] == [architecture]
    config = json.loads((out / "grounding_config.json").read_text())
    assert config["video"]["fps"] == 1.0 and config["reward_funcs"] == ["iou", "format"]
    assert config["video"]["pixel_factor"] == pixel_factor
    state = json.loads((out / "trainer_state.json").read_text())  # written also with save_strategy "no"
    assert state["global_step"] == 2 and [h["step"] for h in state["log_history"] if "loss" in h] == [1, 2]
    assert json.loads((out / "train_results.json").read_text())["train_samples"] > 0
    logs = [line for line in (proc.stdout + proc.stderr).splitlines() if "'loss'" in line or '"loss"' in line]
    assert len(logs) >= 2, (proc.stdout + proc.stderr)[-3000:]
    losses = [float(line.split("'loss': ")[1].split(",")[0].strip("'")) for line in logs if "'loss': " in line]
    assert losses and all(math.isfinite(x) for x in losses)
    assert list((tmp_path / "cache").rglob("*.npy")), "the frame cache was not filled"
    # an existing model directory is reused, not rebuilt
    again = subprocess.run([sys.executable, "-m", "grounding_rl.cli", "tiny-model", "--from-config",
                            str(REPO_ROOT / config_file), "--model_name_or_path",
                            str(model_dir)], capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0 and "building" not in again.stdout


def test_scripts_keep_the_callers_folder(tmp_path):
    """A relative config means the caller's folder (a name that exists only under the repository root is refused,
    exit 2); only the scripts that work on the checkout itself (setup, tests, wheels, locks) change folder."""
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "train.sh"), "configs/demo_grpo.yaml"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "train.sh: no such config: configs/demo_grpo.yaml" in proc.stderr, proc.stderr
    assert f"relative paths start in {tmp_path}" in proc.stderr
    for script in sorted((REPO_ROOT / "scripts").glob("*.sh")):
        lines = [line for line in script.read_text().splitlines() if line.lstrip().startswith("cd ")]
        if script.name in ("setup.sh", "test.sh", "setup_vllm_cpu.sh", "fetch_gpu_wheels.sh", "lock.sh"):  # checkout
            assert lines and "repository root" in lines[0], script.name
        else:
            assert not lines, f"{script.name} changes folder: {lines}"


def test_train_sh_refuses_grounding_rl_trains_config_flag(tmp_path):
    """``scripts/train.sh --config X.yaml`` (the form ``grounding-rl train`` takes) is one line, exit 2, before
    anything runs (it went on with the demo's config, building its data and SFT warm start first)."""
    env = {**os.environ, "PYTHON": sys.executable}
    for flag in (["--config", "configs/tiny_real_clips.yaml"], ["--config=configs/tiny_real_clips.yaml"]):
        proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "train.sh"), *flag, "--max_steps", "2"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            f"train.sh: the config is the first argument, not {flag[0]}: scripts/train.sh CONFIG [--key value ...]"]
        assert not any(tmp_path.iterdir())  # no demo data, no warm start


@pytest.mark.slow
def test_gpu_check_dry_run_writes_every_stage(tmp_path, shared):
    """scripts/gpu_check.sh --dry-run: every stage of the GPU check runs on the CPU with tiny shapes and lands in the
    results JSON with the figures the GPU run reports; the folder of carried wheels is git-ignored."""
    out = tmp_path / "gpu_check.json"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "PYTHON": sys.executable, "GROUNDING_RL_SHARED": str(shared), "TMPDIR": str(scratch)}
    proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert [p.name for p in scratch.iterdir() if p.name.startswith("gpu_check_")] == []  # its work folder is removed
    results = json.loads(out.read_text())
    stages = results["stages"]
    assert results["dry_run"] is True
    assert {name: stage["status"] for name, stage in stages.items()} == {
        "environment": "ok", "fits": "ok", "tests": "ok", "grpo_step": "ok", "check": "ok", "eval": "ok"}
    assert stages["environment"]["python"] == platform.python_version() and stages["environment"]["versions"]["trl"]
    (fits,) = [v for k, v in stages["fits"].items() if isinstance(v, dict)]
    assert fits["total_params"] == 3_754_622_976 and set(fits["per_gpu_gib"]) == {"ddp", "zero1", "zero2",
                                                                                   "zero3", "zero3_offload"}
    assert stages["tests"]["counts"]["tests collected"] == 6  # tests/test_device.py, collected only on CPU
    for group in (4, 8):
        for share in ("on", "off"):
            step = stages["grpo_step"][f"g{group}_share_{share}"]
            assert step["generated_tokens"] == group * 8  # exactly 8 new tokens per completion
            assert step["step_s"] >= step["rollout_s"] >= step["generate_s"] > 0 and step["generate_tokens_per_s"] > 0
        assert stages["grpo_step"][f"g{group}_step_ratio_on_off"] > 0
    assert stages["eval"]["queries"] == 4 and stages["eval"]["queries_per_s"] > 0
    assert json.loads(proc.stdout.strip().splitlines()[-1])["eval"] == "ok"
    ignored = subprocess.run(["git", "-C", str(REPO_ROOT), "check-ignore", "-q", ".gpu/wheels/x.whl"])
    assert ignored.returncode == 0, ".gpu/ must be git-ignored (wheels are never committed)"


def test_demo_closing_json_line_has_r1_at_0_7_of_every_run(tmp_path, capsys):
    """scripts/demo.sh's last stage, as written in the script (its `compare` command, $OUT pointing at three fake
    runs): the closing JSON line carries baseline/sft/grpo mIoU, grpo format rate and baseline/sft/grpo R1@0.7 — the
    figure that tells a hedging policy (wide intervals: mIoU up, R1@0.7 down) from a localising one."""
    import shlex

    from grounding_rl.cli.compare import main as compare_main

    script = (REPO_ROOT / "scripts" / "demo.sh").read_text().replace("\\\n", " ")
    line = next(row for row in script.splitlines() if '"${GRL[@]}" compare' in row)
    argv = shlex.split(line.replace('"${GRL[@]}" compare', "").replace("$OUT", str(tmp_path)))
    argv = argv[:argv.index(">")] if ">" in argv else argv  # the table also goes to a file
    figures = {"baseline": (35.5, 15.5, None), "sft": (34.25, 12.0, 100.0), "grpo": (43.75, 16.5, 99.5)}
    for run, (miou, r07, fmt) in figures.items():
        (tmp_path / "eval" / run).mkdir(parents=True)
        metrics = {"n": 200, "R1@0.3": 50.0, "R1@0.5": 30.0, "R1@0.7": r07, "mIoU": miou,
                   "length_ratio": 1 + r07 / 100}
        if fmt is not None:
            metrics["format_rate"] = fmt
        (tmp_path / "eval" / run / "metrics.json").write_text(json.dumps(metrics))
    assert compare_main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary == {"baseline_mIoU": 35.5, "sft_mIoU": 34.25, "grpo_mIoU": 43.75, "grpo_format_rate": 99.5,
                       "baseline_R1@0.7": 15.5, "sft_R1@0.7": 12.0, "grpo_R1@0.7": 16.5, "grpo_length_ratio": 1.165}
