"""Quiet by default: stdout carries only a command's output (``fits --json`` and ``infer --max-turns 1 --json`` parse
as JSON, DeepSpeed's log lines go to stderr), the per-step ``is_gradient_checkpointing`` deprecation is filtered, and
Ctrl-C before training starts is one line, exit 130, no traceback."""
import json
import logging
import os
import subprocess
import sys
import warnings

import pytest

from grounding_rl.cli import main
from grounding_rl.paths import REPO_ROOT
from grounding_rl.cli.quiet import DEEPSPEED_LOGGER, quiet_third_party

FAST = ["--fps", "1", "--max-pixels", str(28 * 28 * 16), "--min-pixels", str(28 * 28 * 4), "--max-new-tokens", "8"]


def test_deepspeed_logs_on_stderr_when_it_is_imported_after_the_command_started(monkeypatch, capsys):
    """DeepSpeed's logger is made on its first import with a handler on stdout (deepspeed.utils.logging's
    LoggerFactory): made again here as that import does, it writes to stderr."""
    monkeypatch.delitem(logging.Logger.manager.loggerDict, DEEPSPEED_LOGGER, raising=False)
    quiet_third_party()
    from deepspeed.utils.logging import LoggerFactory  # where DeepSpeed is first imported, it logs from here on

    logger = LoggerFactory.create_logger(name=DEEPSPEED_LOGGER, level=logging.INFO)
    try:
        logger.warning("Setting accelerator to CPU")
        captured = capsys.readouterr()
        assert captured.out == "" and "[WARNING]" in captured.err and "Setting accelerator to CPU" in captured.err
    finally:
        logger.handlers.clear()


def test_the_gradient_checkpointing_deprecation_is_filtered():
    quiet_third_party()
    with warnings.catch_warnings(record=True) as seen:
        warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6. Use "
                      "`is_activation_checkpointing` instead.", FutureWarning)
        warnings.warn("another deprecation", FutureWarning)
    assert [str(w.message) for w in seen] == ["another deprecation"]


def test_json_output_parses(tiny_model_dir, videos_dir, capsys):
    """fits in a fresh process (where DeepSpeed is first imported, its warning printed), infer in-process."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "grounding_rl.cli", "fits",
                           "configs/qwen2_5_vl_7b_charades_timezero.yaml", "--gpus", "8", "--gpu-memory", "80",
                           "--json"], capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gpus"] == 8
    assert main(["infer", "--model", str(tiny_model_dir), "--video", str(videos_dir / "charades_OHOFG.mp4"),
                 "--query", "person sitting down", "--max-turns", "1", "--json", *FAST]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert result["query"] == "person sitting down"


def test_ctrl_c_before_training_starts_is_one_line(tmp_path, monkeypatch, capsys):
    from grounding_rl.cli import common

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(common, "run_fingerprint", interrupted)  # the first step after the arguments are read
    argv = ["sft", "--config", str(REPO_ROOT / "configs" / "demo_sft.yaml"), "--output_dir", str(tmp_path / "o"),
            "--report_to", "none"]
    assert main(argv) == 130
    assert capsys.readouterr().err.strip() == ("grounding-rl sft: stopped by SIGINT before training started; run the "
                                               "same command again")
