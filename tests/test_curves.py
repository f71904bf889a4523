"""Training curves (grounding_rl.update.curves): the panels a run's log_history fills, training_curves.png written by
every training command at each save and at the end, and ``grounding-rl plot RUN [RUN ...]`` overlaying runs."""
import json

import pytest
from PIL import Image

from grounding_rl.cli import main
from grounding_rl.paths import REPO_ROOT
from grounding_rl.update import curves


def grpo_history(steps=3, scale=1.0):
    """A GRPO run's log_history as Trainer writes it: per-step logs, then the run's summary (no metric of ours)."""
    history = [{"step": s, "epoch": s / steps, "loss": 0.1 * s, "learning_rate": 1e-6 / s, "reward": scale * s,
                "reward_std": 0.2, "rewards/iou/mean": 0.1 * s, "rewards/iou/std": 0.05,
                "rewards/format/mean": 1.0, "rewards/format/std": 0.0, "kl": 0.01 * s,
                "completions/mean_length": 40.0 + s, "timing/generate": 2.0, "timing/reward": 0.1,
                "timing/dynamic_sampling": 1.0, "timing/update": 1.5, "step_time": 3.6} for s in range(1, steps + 1)]
    return history + [{"step": steps, "train_runtime": 12.0, "train_loss": 0.2, "epoch": 1.0}]


def write_run(folder, history, checkpoint=None):
    target = folder / checkpoint if checkpoint else folder
    target.mkdir(parents=True)
    (target / "trainer_state.json").write_text(json.dumps({"global_step": 3, "log_history": history}))
    return folder


def test_panels_follow_what_the_stage_logged():
    titles = [p[0] for p in curves._panels(curves._keys(grpo_history()))]
    assert titles == ["reward (± within-group std)", "IoU", "KL", "loss", "completion length (tokens)",
                      "learning rate", "phase timings (s per step, stacked)"]
    panels = {p[0]: p[2] for p in curves._panels(curves._keys(grpo_history()))}
    assert panels["reward (± within-group std)"] == ["reward", "rewards/iou/mean", "rewards/format/mean"]
    assert panels["phase timings (s per step, stacked)"] == ["timing/generate", "timing/reward", "timing/update"]
    sft = [{"step": 1, "loss": 2.0, "learning_rate": 1e-5, "grad_norm": 1.0, "epoch": 0.5}]
    assert [p[0] for p in curves._panels(curves._keys(sft))] == ["loss", "learning rate"]  # no reward in sft
    assert curves._series(grpo_history(), "reward") == ([1, 2, 3], [1.0, 2.0, 3.0])  # the summary entry left out


def test_plot_overlays_runs_and_reads_a_checkpoint_while_running(tmp_path, capsys):
    one = write_run(tmp_path / "grpo", grpo_history())
    running = write_run(tmp_path / "running", grpo_history(2, scale=0.5), checkpoint="checkpoint-2")
    write_run(tmp_path / "running", grpo_history(1), checkpoint="checkpoint-1")
    assert curves.read_log_history(running)[1]["reward"] == 1.0  # the newest checkpoint's: 2 × 0.5
    out = tmp_path / "cmp.png"
    assert main(["plot", str(one), str(running), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    with Image.open(out) as image:
        assert image.size == (3 * 5.2 * 80, 3 * 3.4 * 80)  # 7 panels: 3 columns, 3 rows at 80 dpi
        assert len(image.convert("RGB").getcolors(1 << 20)) > 50  # drawn, not blank


def test_every_training_command_redraws_at_each_save_and_at_the_end(tmp_path, demo_dir, bpe_tiny_model_dir,
                                                                     monkeypatch):
    """A 2-step sft run through the command, saving each step: drawn at save 1, save 2 and the end, into
    output_dir/training_curves.png, with the panels sft logs (no reward)."""
    drawn = []
    original = curves.draw_curves
    monkeypatch.setattr(curves, "draw_curves", lambda runs, out: drawn.append(
        (out, max(e["step"] for e in next(iter(runs.values()))))) or original(runs, out))
    out = tmp_path / "sft"
    assert main(["sft", "--config", str(REPO_ROOT / "configs" / "demo_sft.yaml"), "--model_name_or_path",
                 str(bpe_tiny_model_dir), "--train_file", str(demo_dir / "train.jsonl"), "--output_dir", str(out),
                 "--max_train_samples", "2", "--per_device_train_batch_size", "1", "--max_steps", "2",
                 "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", "1", "--disable_tqdm", "true",
                 "--report_to", "none"]) == 0
    assert drawn == [(out / "training_curves.png", 1), (out / "training_curves.png", 2),
                     (out / "training_curves.png", 2)]
    assert [p[0] for p in curves._panels(curves._keys(curves.read_log_history(out)))][-2:] == ["loss",
                                                                                               "learning rate"]
    with Image.open(out / "training_curves.png") as image:
        assert image.format == "PNG"
    from grounding_rl.run_record import foreign_to_run

    assert foreign_to_run(out, json.loads((out / "run_fingerprint.json").read_text())) == []


def test_a_run_without_a_logged_step_is_one_line(tmp_path, capsys):
    write_run(tmp_path / "fresh", [{"step": 0, "epoch": 0}], checkpoint="checkpoint-0")
    assert main(["plot", str(tmp_path / "fresh"), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"grounding-rl plot: error: {tmp_path / 'fresh' / 'checkpoint-0' / 'trainer_state.json'}: "
                   "log_history is empty (the run logged no step yet; logging_steps decides when)")
    assert not (tmp_path / "c.png").exists()


def test_plot_reads_a_checkpoint_newer_than_the_finished_runs_state(tmp_path):
    """A finished run continued with --resume_from_checkpoint and a larger max_steps (still going, or stopped): the
    top trainer_state.json is the first end's (step 3); checkpoint-5's is newer and is the one drawn."""
    run = write_run(tmp_path / "continued", grpo_history(3))
    for step in (2, 5):
        write_run(run, grpo_history(step, scale=2.0), checkpoint=f"checkpoint-{step}")
        state = run / f"checkpoint-{step}" / "trainer_state.json"
        state.write_text(json.dumps({**json.loads(state.read_text()), "global_step": step}))
    assert max(e["step"] for e in curves.read_log_history(run)) == 5  # was 3: the stale top file
    (run / "checkpoint-5" / "trainer_state.json").unlink()
    assert curves.read_log_history(run)[0]["reward"] == 1.0  # the top file's (scale 1), not the older checkpoint-2's
