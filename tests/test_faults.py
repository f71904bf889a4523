"""Faults on one machine lose nothing: a process killed inside a checkpoint's save leaves that checkpoint incomplete,
``--resume_from_checkpoint true`` skips it (one line naming it) and the resumed run ends bit-identical to an
uninterrupted one; an incomplete checkpoint named explicitly is refused; ``auto`` starts from step 0 when there is
none.

The kill is chosen by the test-only hook ``GROUNDING_RL_FAULT_AFTER`` (:mod:`grounding_rl.update.checkpoints`), not by
timing. In-process, its SIGKILL is replaced by an exception the run cannot catch (the files on disk are what a kill
leaves); one test kills a real process. The reference weights are the killed run's own: it dies inside the save of
its last checkpoint, after that checkpoint's weights were written, so they are the weights an uninterrupted run ends
with.
"""
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from grounding_rl.paths import REPO_ROOT
from grounding_rl.update import checkpoints

torch.set_num_threads(1)


class Killed(BaseException):
    """What the fault hook raises in-process instead of SIGKILL (no ``except Exception`` catches it)."""


def sft_argv(demo_dir, model_dir, out, *extra, peft=False):
    argv = ["--config", str(REPO_ROOT / "configs" / "demo_sft.yaml"), "--model_name_or_path", str(model_dir),
            "--train_file", str(demo_dir / "train.jsonl"), "--output_dir", str(out), "--max_train_samples", "4",
            "--per_device_train_batch_size", "2", "--max_steps", "3", "--warmup_steps", "1", "--learning_rate",
            "3e-3", "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", "1", "--disable_tqdm", "true",
            "--report_to", "none", *extra]
    return argv + (["--use_peft", "--lora_r", "4", "--lora_alpha", "8"] if peft else [])


def killed_and_resumed(tmp_path, demo_dir, model_dir, monkeypatch, capsys, point, peft=False):
    """Run 3 SFT steps killed after ``checkpoint-3/<point>`` is written; rerun with ``--resume_from_checkpoint true``.
    Returns (the killed run's step-3 weights, the resumed run's final weights, the resume's stderr)."""
    from grounding_rl.cli.sft import main

    out = tmp_path / "run"
    name = "adapter_model.safetensors" if peft else "model.safetensors"
    monkeypatch.setattr(checkpoints, "_die", lambda: (_ for _ in ()).throw(Killed()))
    monkeypatch.setenv(checkpoints.FAULT_ENV, f"checkpoint-3/{point}")
    with pytest.raises(Killed):
        main(sft_argv(demo_dir, model_dir, out, peft=peft))
    monkeypatch.delenv(checkpoints.FAULT_ENV)
    assert checkpoints.checkpoint_problem(out / "checkpoint-2") is None
    assert checkpoints.checkpoint_problem(out / "checkpoint-3") is not None
    reference = load_file(str(out / "checkpoint-3" / name))  # written before the kill: the weights after step 3
    capsys.readouterr()
    assert main(sft_argv(demo_dir, model_dir, out, "--resume_from_checkpoint", "true", peft=peft)) == 0
    err = capsys.readouterr().err
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and 3 in [h["step"] for h in state["log_history"] if "loss" in h]
    assert checkpoints.checkpoint_problem(out / "checkpoint-3") is None  # saved again, whole
    return reference, load_file(str(out / name)), err


def assert_identical(a, b):
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


@pytest.mark.parametrize("point", ["model.safetensors", "optimizer.pt", "rng_state.pth", "trainer_state.json"])
def test_sft_killed_inside_a_save_resumes_bit_identical(tmp_path, demo_dir, bpe_tiny_model_dir, monkeypatch, capsys,
                                                        point):
    reference, final, err = killed_and_resumed(tmp_path, demo_dir, bpe_tiny_model_dir, monkeypatch, capsys, point)
    assert_identical(final, reference)
    line = next(line for line in err.splitlines() if line.startswith("resume_from_checkpoint: skipped"))
    assert line.startswith("resume_from_checkpoint: skipped checkpoint-3 (") and line.endswith("a save cut short)")


def test_lora_killed_inside_a_save_resumes_bit_identical(tmp_path, demo_dir, bpe_tiny_model_dir, monkeypatch, capsys):
    reference, final, _ = killed_and_resumed(tmp_path, demo_dir, bpe_tiny_model_dir, monkeypatch, capsys,
                                             "optimizer.pt", peft=True)
    assert_identical(final, reference)


def test_incomplete_checkpoints_are_found_from_the_folder(tmp_path, demo_dir, bpe_tiny_model_dir, capsys):
    """A real SIGKILL (the environment variable in a child process) inside checkpoint-2's save; a checkpoint of an
    earlier version cut short (no mark, truncated weights) is skipped too; naming an incomplete checkpoint is one line,
    exit 2; ``auto`` on an empty folder starts from step 0."""
    from grounding_rl.cli import main

    out = tmp_path / "run"
    env = {**os.environ, checkpoints.FAULT_ENV: "checkpoint-2/rng_state.pth", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "grounding_rl.cli", "sft",
                           *sft_argv(demo_dir, bpe_tiny_model_dir, out, "--max_steps", "2")],
                          env=env, capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert (out / "checkpoint-2" / "rng_state.pth").is_file() and not (out / "checkpoint-2" / checkpoints.MARK).exists()
    assert checkpoints.newest_complete(out) == (str(out / "checkpoint-1"),
                                                [(str(out / "checkpoint-2"), "its save did not finish")])

    assert main(["sft", *sft_argv(demo_dir, bpe_tiny_model_dir, out, "--resume_from_checkpoint",
                                  str(out / "checkpoint-2"))]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "checkpoint-2 is not a complete train/sft checkpoint" in err

    legacy = out / "checkpoint-1"
    (legacy / checkpoints.MARK).unlink()
    assert checkpoints.checkpoint_problem(legacy) is None  # an earlier version's whole checkpoint
    weights = legacy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert checkpoints.checkpoint_problem(legacy).startswith("model.safetensors is cut short")
    assert checkpoints.newest_complete(out)[0] is None
    assert main(["sft", *sft_argv(demo_dir, bpe_tiny_model_dir, out, "--resume_from_checkpoint", "true")]) == 2
    assert "no complete checkpoint-N folder" in capsys.readouterr().err
    assert main(["sft", *sft_argv(demo_dir, bpe_tiny_model_dir, out, "--max_steps", "2", "--resume_from_checkpoint",
                                  "auto")]) == 0  # none complete: this run's torn saves removed, from step 0
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2
    assert checkpoints.newest_complete(out)[0] == str(out / "checkpoint-2")

    fresh = tmp_path / "fresh"
    assert main(["sft", *sft_argv(demo_dir, bpe_tiny_model_dir, fresh, "--max_steps", "1", "--resume_from_checkpoint",
                                  "auto")]) == 0
    assert json.loads((fresh / "trainer_state.json").read_text())["global_step"] == 1


def signal_at_step(monkeypatch, step: int, signum=None):
    """Send ``signum`` (SIGTERM) to this process when optimizer step ``step`` (1-based) begins."""
    import signal

    from grounding_rl.update import preemption

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == step:
            os.kill(os.getpid(), signum or signal.SIGTERM)
        return control

    monkeypatch.setattr(preemption.PreemptionCallback, "on_step_begin", on_step_begin)


@pytest.fixture(scope="module")
def sft_reference(tmp_path_factory, demo_dir, bpe_tiny_model_dir):
    """An uninterrupted 3-step SFT run (``save_strategy: no``)."""
    from grounding_rl.cli import main

    out = tmp_path_factory.mktemp("sft_reference")
    assert main(["sft", *sft_argv(demo_dir, bpe_tiny_model_dir, out, "--save_strategy", "no")]) == 0
    return out


@pytest.mark.parametrize("at", [2, 3], ids=["mid-run", "last-step"])
def test_sft_sigterm_saves_at_the_step_end_and_resumes_bit_identical(tmp_path, demo_dir, bpe_tiny_model_dir,
                                                                      sft_reference, monkeypatch, capsys, at):
    """SIGTERM during step 2 (or the last, 3) of 3 (``save_strategy: no``): the step ends, its checkpoint is
    written, one line says so, exit 143, no final files; the same command with ``--resume_from_checkpoint auto`` ends
    bit-identical to an uninterrupted run."""
    from grounding_rl.cli import main

    reference_dir, out = sft_reference, tmp_path / "run"
    signal_at_step(monkeypatch, at)
    capsys.readouterr()
    assert main(["sft", *sft_argv(demo_dir, bpe_tiny_model_dir, out, "--save_strategy", "no")]) == 143
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("grounding-rl sft")]
    assert err == [f"grounding-rl sft: stopped by SIGTERM at step {at} of 3: {out / f'checkpoint-{at}'} saved; run the "
                   "same command with --resume_from_checkpoint auto to continue"]
    assert checkpoints.checkpoint_problem(out / f"checkpoint-{at}") is None
    assert not (out / "model.safetensors").exists()
    monkeypatch.undo()
    assert main(["sft", *sft_argv(demo_dir, bpe_tiny_model_dir, out, "--save_strategy", "no",
                                  "--resume_from_checkpoint", "auto")]) == 0
    assert_identical(load_file(str(out / "model.safetensors")), load_file(str(reference_dir / "model.safetensors")))


def test_grpo_signal_stops_at_the_generation_window_end(tmp_path, tiny_model_dir, videos_dir, monkeypatch, capsys):
    """GRPO with ``steps_per_generation: 2`` (a generation window of 2 optimizer steps): SIGUSR1 during step 1 lets
    step 2 finish (the window's end, where a resume is exact), saves checkpoint-2 and returns 138; resumed there, the
    run ends bit-identical to an uninterrupted one."""
    import signal

    from conftest import clip_dataset, grpo_config, make_grpo_trainer

    from grounding_rl.cli.common import train_and_finish

    settings = dict(max_steps=4, logging_steps=1, steps_per_generation=2, learning_rate=1e-3)

    def trainer(out, **extra):
        return make_grpo_trainer(tiny_model_dir, grpo_config(out, **settings, **extra), clip_dataset(videos_dir))

    def weights(t):
        return {k: v.detach().clone() for k, v in t.accelerator.unwrap_model(t.model).state_dict().items()}

    full = trainer(tmp_path / "full")
    full.train()
    signal_at_step(monkeypatch, 1, signal.SIGUSR1)
    stopped = trainer(tmp_path / "run")
    assert train_and_finish(stopped, None, "grounding-rl train") == 138
    assert stopped.state.global_step == 2 and checkpoints.checkpoint_problem(tmp_path / "run" / "checkpoint-2") is None
    assert "stopped by SIGUSR1 at step 2 of 4" in capsys.readouterr().err
    monkeypatch.undo()
    resumed = trainer(tmp_path / "run")
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert_identical(weights(resumed), weights(full))


def test_ctrl_c_twice_exits_at_once_with_130():
    """The second signal of a graceful stop exits at once: one line, status 130, no traceback."""
    code = ("import os, signal, time\n"
            "from grounding_rl.stopping import stop_signals\n"
            "with stop_signals('grounding-rl train', graceful=True) as request:\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    assert request.name == 'SIGINT'\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    time.sleep(5)\n"
            "print('not reached')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert proc.returncode == 130 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["grounding-rl train: SIGINT again: exiting at once; the last complete "
                                        "checkpoint is kept (run the same command with --resume_from_checkpoint auto "
                                        "to continue)"]


def test_eval_stopped_by_a_signal_keeps_its_predictions_and_resumes(tiny_model_dir, videos_dir, tmp_path, monkeypatch,
                                                                    capsys):
    """SIGTERM during an eval (after its third prediction): one line, exit 143, the finished predictions kept; the same
    command again resumes and ends with the predictions of an uninterrupted run."""
    import signal

    import grounding_rl.reward.records as records
    from grounding_rl.cli import main

    def run(out):
        return main(["eval", "--model", str(tiny_model_dir), "--data", str(videos_dir / "annotations.jsonl"), "--out",
                     str(out), "--fps", "1", "--max-pixels", str(28 * 28 * 16), "--min-pixels", str(28 * 28 * 4), "--max-new-tokens", "4",
                     "--limit", "6", "--batch-size", "1", "--num-workers", "0"])

    lines = lambda path: path.read_text().splitlines()  # noqa: E731
    assert run(tmp_path / "once") == 0
    original, made = records.prediction_record, []

    def record(*args, **kwargs):
        made.append(1)
        if len(made) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    monkeypatch.setattr(records, "prediction_record", record)
    capsys.readouterr()
    assert run(tmp_path / "stopped") == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("grounding-rl eval: stopped by SIGTERM; what was finished is kept")
    kept = lines(tmp_path / "stopped" / "predictions.jsonl")
    assert 1 <= len(kept) <= 3 and not (tmp_path / "stopped" / "metrics.json").exists()
    monkeypatch.undo()
    assert run(tmp_path / "stopped") == 0
    assert f"{len(kept)} already in" in capsys.readouterr().out
    assert lines(tmp_path / "stopped" / "predictions.jsonl") == lines(tmp_path / "once" / "predictions.jsonl")


def test_a_full_disk_in_a_checkpoint_save_is_one_line_and_loses_nothing(tmp_path, demo_dir, bpe_tiny_model_dir,
                                                                       monkeypatch, capsys):
    """ENOSPC while checkpoint-2's optimizer state is written: one line naming the folder and the cause, exit 2,
    checkpoint-1 intact and the torn checkpoint-2 removed; with space again, ``auto`` resumes and ends bit-identical
    to an uninterrupted run. Then the same on a real full disk: a small tmpfs in a private mount namespace
    (``unshare -m``; skipped where the machine does not allow it), enlarged before the rerun."""
    import errno
    import shlex

    from grounding_rl.cli import main

    reference = tmp_path / "full"
    assert main(["sft", *sft_argv(demo_dir, bpe_tiny_model_dir, reference)]) == 0
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if "checkpoint-2" in str(f):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    out = tmp_path / "run"
    monkeypatch.setattr(torch, "save", save)
    capsys.readouterr()
    assert main(["sft", *sft_argv(demo_dir, bpe_tiny_model_dir, out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"grounding-rl sft: error: {out / 'checkpoint-2'}: writing the checkpoint failed (No space left on "
                       "device); the earlier checkpoints are intact: free space and run the same command with "
                       "--resume_from_checkpoint auto")
    assert checkpoints.checkpoint_problem(out / "checkpoint-1") is None and not (out / "checkpoint-2").exists()
    monkeypatch.undo()
    assert main(["sft", *sft_argv(demo_dir, bpe_tiny_model_dir, out, "--resume_from_checkpoint", "auto")]) == 0
    assert_identical(load_file(str(out / "model.safetensors")), load_file(str(reference / "model.safetensors")))

    # a real full disk: a tmpfs in a private mount namespace, holding one checkpoint and a half; then made larger
    sizes = sum(p.stat().st_size for p in (reference / "checkpoint-1").rglob("*") if p.is_file())
    mount, run, kept = tmp_path / "mnt", tmp_path / "mnt" / "run", tmp_path / "kept.safetensors"
    mount.mkdir()
    argv = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "grounding_rl.cli", "sft",
                                               *sft_argv(demo_dir, bpe_tiny_model_dir, run)])
    script = (f"mount -t tmpfs -o size={sizes * 3 // 2} tmpfs {mount} || exit 99\n"
              f"{argv}; echo first=$?\n"
              f"ls {run}\n"
              f"mount -o remount,size=256m {mount}\n"
              f"{argv} --resume_from_checkpoint auto; echo second=$?\n"
              f"cp {run}/model.safetensors {kept}\n")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    if proc.returncode == 99 or "unshare:" in proc.stderr:
        pytest.skip(f"no private tmpfs here: {proc.stderr.strip()[:200]}")
    assert "first=2" in proc.stdout and "second=0" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "checkpoint-1\n" in proc.stdout and "checkpoint-2\n" not in proc.stdout  # the torn one removed
    line = next(line for line in proc.stderr.splitlines() if line.startswith("grounding-rl sft: error:"))
    assert line.startswith(f"grounding-rl sft: error: {run / 'checkpoint-2'}: writing the checkpoint failed (")
    assert_identical(load_file(str(kept)), load_file(str(reference / "model.safetensors")))


def test_a_file_size_limit_on_predictions_keeps_only_complete_rows(tmp_path):
    """``prlimit --fsize`` (EFBIG) while predictions are appended: one line naming the file, the file cut back to its
    last complete row; appending again after the limit is lifted goes on from there."""
    import shutil as shell

    if shell.which("prlimit") is None:
        pytest.skip("no prlimit here")
    path = tmp_path / "predictions.jsonl"
    code = ("import sys\nfrom grounding_rl.errors import UserError\nfrom grounding_rl.jsonl_files import JsonlAppender\n"
            "writer = JsonlAppender(sys.argv[1])\n"
            "try:\n    [writer.write({'qid': str(i), 'answer': 'x' * 20}) for i in range(100)]\n"
            "except UserError as err:\n    print(err, file=sys.stderr)\n    sys.exit(2)\n")
    proc = subprocess.run(["prlimit", "--fsize=300", sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"{path}: writing a row failed (File too large); the rows before it are kept: free "
                                   "space and run the same command again to go on")
    rows = path.read_text().splitlines(keepends=True)
    assert path.stat().st_size <= 300 and all(row.endswith("\n") for row in rows)
    assert [json.loads(row)["qid"] for row in rows] == [str(i) for i in range(len(rows))] and len(rows) == 6  # 46 bytes a row


def test_a_full_disk_turns_the_frame_cache_off(tmp_path, monkeypatch, caplog):
    """ENOSPC while the frame cache writes: a warning, nothing half-written left, no more writes; the clip is still
    returned by the decoder (``put`` returns False)."""
    import errno

    import numpy as np

    from grounding_rl.data.cache import FrameCache
    from grounding_rl.data.video import SampledVideo, VideoSettings

    cache = FrameCache(tmp_path / "cache")
    video_file = tmp_path / "v.mp4"
    video_file.write_bytes(b"x")
    clip = SampledVideo(frames=np.zeros((2, 4, 4, 3), np.uint8), path=str(video_file), source_fps=25.0, duration=1.0,
                        frame_indices=[0, 12], timestamps=[0.0, 0.48], sampled_fps=2.0, backend="decord")
    calls = []

    def full(*args, **kwargs):
        calls.append(1)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", full)
    assert cache.put(video_file, VideoSettings(), clip) is False
    assert cache.put(video_file, VideoSettings(), clip) is False and len(calls) == 1  # off: no second try
    assert "writing failed (No space left on device); the cache is off" in caplog.text
    assert list((tmp_path / "cache").iterdir()) == []


def test_disk_errors_are_recognised_through_the_libraries():
    """An ``OSError`` with ENOSPC/EFBIG/EDQUOT anywhere in the chain, safetensors' text and torch's zip writer are a
    full disk; other errors are not."""
    import errno

    from grounding_rl.errors import disk_error

    assert disk_error(OSError(errno.ENOSPC, "x")) == "No space left on device"
    try:
        try:
            raise OSError(errno.EDQUOT, "quota")
        except OSError as inner:
            raise RuntimeError("saving failed") from inner
    except RuntimeError as outer:
        assert disk_error(outer) == "Disk quota exceeded"
    assert disk_error(Exception('Error while serializing: IoError(Os { code: 27, kind: FileTooLarge, message: '
                                '"File too large" })')) == "File too large"
    assert disk_error(RuntimeError("basic_ios::clear: iostream error")).startswith(("File too large",
                                                                                   "the write failed"))
    assert disk_error(OSError(errno.EACCES, "denied")) is None and disk_error(ValueError("code: 5")) is None


def test_a_full_disk_in_the_end_of_run_files_is_one_line_naming_the_file(tmp_path):
    """``metrics.json`` (and every file written through the atomic writers) on a full disk: the dispatcher's one line
    names the file and the cause; nothing half-written is left beside it."""
    import errno
    from unittest import mock

    from grounding_rl.errors import user_message
    from grounding_rl.eval.report import write_metrics_json
    from grounding_rl.jsonl_files import write_jsonl_atomic

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    for write, path in ((lambda p: write_metrics_json(p, {"n": 1}, {}), tmp_path / "metrics.json"),
                        (lambda p: write_jsonl_atomic(p, [{"a": 1}]), tmp_path / "rows.jsonl")):
        with mock.patch("os.replace", full), pytest.raises(OSError) as info:
            write(path)
        assert user_message(info.value) == (f"{path}: writing failed (No space left on device); what was complete is "
                                            "kept: free space and run the same command again")
        assert list(tmp_path.iterdir()) == []
