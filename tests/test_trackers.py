"""``report_to`` trackio, tensorboard and wandb (offline): a 2-step tiny GRPO run leaves its scalars (reward per
function, IoU, KL, length, phase timings) and its completions table readable back from each tracker's local files;
a tracker that is not installed is one line naming the extra, exit 2, before any model loads."""
import json
import sqlite3
import struct

import pytest
import torch
from conftest import clip_dataset, grpo_config, make_grpo_trainer, varied_reward

from grounding_rl.update.curves import curves_callback

torch.set_num_threads(1)
SCALARS = ("reward", "rewards/iou/mean", "rewards/varied_reward/mean", "rewards/varied_reward/std", "kl",
           "completions/mean_length", "timing/generate", "timing/reward")
COLUMNS = ("query", "video", "frame_times", "completion", "parsed", "ground_truth", "iou", "varied_reward")


def wandb_history(path):
    """The ``history`` records of a wandb run file (``run-ID.wandb``: a 7-byte header, then LevelDB's log format,
    32 KiB blocks of chunks with a 7-byte header each: CRC, length, type FULL 1 / FIRST 2 / MIDDLE 3 / LAST 4; each
    record a ``wandb_internal_pb2.Record``) as ``{key: value}`` dicts (nested keys joined by ``/``)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, block, chunks = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's trailer too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunks, pos = chunks + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            if record.WhichOneof("record_type") == "history":
                yield {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                       for item in record.history.item}


@pytest.fixture
def tracked_run(tmp_path_factory, tiny_model_dir, videos_dir, monkeypatch):
    """One 2-step run logging to all three trackers at once (saves at each step, log_completions)."""
    tmp = tmp_path_factory.mktemp("tracked")
    out = tmp / "out"
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(out), "WANDB_SILENT": "true",
                       "TRACKIO_DIR": str(tmp / "trackio")}.items():
        monkeypatch.setenv(key, value)
    import trackio.sqlite_storage

    monkeypatch.setattr(trackio.sqlite_storage, "TRACKIO_DIR", tmp / "trackio")  # read once, at import
    config = grpo_config(out, max_steps=2, logging_steps=1, beta=0.04, log_completions=True,
                         num_completions_to_print=2, report_to=["tensorboard", "trackio", "wandb"],
                         save_strategy="steps", save_steps=1, project="grl_test", run_name="tracked")
    trainer = make_grpo_trainer(tiny_model_dir, config, clip_dataset(videos_dir), reward_funcs=("iou", varied_reward))
    trainer.add_callback(curves_callback())
    trainer.train()
    import wandb

    wandb.finish()  # the run file is complete once the run ends (at the process's exit in a command)
    logged = {key: [e[key] for e in trainer.state.log_history if key in e] for key in SCALARS}
    return out, tmp / "trackio", logged


def test_every_tracker_reads_back_the_scalars_and_the_completions(tracked_run):
    out, trackio_dir, logged = tracked_run
    assert all(len(values) == 2 for values in logged.values()), logged
    # tensorboard: event files under output_dir/runs, the completions a text summary
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list(out.glob("runs/*/events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(events[0].parent), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    for key in SCALARS:
        assert [e.value for e in acc.Scalars(f"train/{key}")] == pytest.approx(logged[key], rel=1e-5), key
    texts = acc.Tensors("completions/text_summary")
    assert [t.step for t in texts] == [1, 2]
    table = texts[0].tensor_proto.string_val[0].decode()
    header = table.splitlines()[0]
    assert all(column in header for column in COLUMNS) and "mmaction2_pool_cleaning.mp4" in table
    # trackio: the project's SQLite store under TRACKIO_DIR
    with sqlite3.connect(trackio_dir / "grl_test.db") as db:
        rows = [json.loads(m) for m, in db.execute("SELECT metrics FROM metrics ORDER BY step, timestamp")]
    scalars = [r for r in rows if "train/kl" in r]
    for key in SCALARS:
        assert [r[f"train/{key}"] for r in scalars] == pytest.approx(logged[key], rel=1e-5), key
    tables = [r["completions"] for r in rows if "completions" in r]
    assert len(tables) == 2
    assert all(c in json.dumps(tables[0]) for c in COLUMNS)
    # wandb offline: the history records of the run file under WANDB_DIR/wandb (wandb's protobuf Record)
    run_files = list(out.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(run_files) == 1
    history = list(wandb_history(run_files[0]))
    scalars = [h for h in history if "train/kl" in h]
    for key in SCALARS:
        assert [h[f"train/{key}"] for h in scalars] == pytest.approx(logged[key], rel=1e-5), key
    tables = [h["completions/path"] for h in history if "completions/path" in h]
    assert len(tables) == 2
    table_file = run_files[0].parent / "files" / tables[0]
    saved = json.loads(table_file.read_text())
    assert all(c in saved["columns"] for c in COLUMNS) and len(saved["data"]) == 2
    row = dict(zip(saved["columns"], saved["data"][0]))
    assert json.loads(row["ground_truth"]) == [1.0, 4.0] and len(json.loads(row["frame_times"])) >= 2
    # the curves, drawn at each save and at the end
    assert (out / "training_curves.png").stat().st_size > 10_000


def test_a_tracker_not_installed_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    """Before any model loads or anything is written: the output folder is not created."""
    import transformers.integrations

    from grounding_rl.cli import main
    from grounding_rl.paths import REPO_ROOT

    monkeypatch.setattr(transformers.integrations, "get_available_reporting_integrations", lambda: ["tensorboard"])
    argv = ["train", "--config", str(REPO_ROOT / "configs" / "demo_grpo.yaml"), "--output_dir", str(tmp_path / "o")]
    assert main([*argv, "--report_to", "wandb"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("grounding-rl train: error: command line: report_to 'wandb': wandb is not installed (pip install "
                   "'grounding-rl[trackers]'), or drop it from report_to")
    assert not (tmp_path / "o").exists()


def test_trackios_init_lines_go_to_stderr(monkeypatch, capsys):
    """trackio's ``init`` prints where its metrics go on stdout; once ``report_to`` names trackio, those lines are on
    stderr (stdout carries only the command's output)."""
    import trackio

    from grounding_rl.update.trackers import check_trackers

    def init(project):
        print(f"* Trackio project initialized: {project}")
        return project

    monkeypatch.setattr(trackio, "init", init)
    check_trackers(["trackio"], "config.yaml")
    check_trackers(["trackio"], "config.yaml")  # wrapped once
    assert trackio.init("p") == "p"
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "* Trackio project initialized: p\n")
