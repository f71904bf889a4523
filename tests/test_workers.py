"""Clip-decoding workers: they end when their parent is killed with SIGKILL (grounding_rl.data.workers.die_with_parent),
for the eval loader (clip_batches) and the trainers' (a DataLoader whose collate_fn is a VideoCollator); the trainers'
first batch shows its decoding clip by clip."""
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# Makes both loaders with two workers each, takes one batch from each (the workers then hold decoded clips not yet
# sent), prints the workers' pids and waits to be killed.
PARENT = """
import os, sys, time
import torch.utils.data
from grounding_rl.data.dataset import VideoCollator
from grounding_rl.data.video import VideoSettings
from grounding_rl.rollout.greedy import clip_batches, group_by_video

settings = VideoSettings(fps=2.0, min_pixels=64 * 28 * 28, max_pixels=64 * 28 * 28)
videos = sys.argv[1:]
evaluating = clip_batches(group_by_video(videos), settings, batch_size=1, num_workers=2)
next(evaluating)
items = [{"index": i, "video": v, "qid": str(i)} for i, v in enumerate(videos)]
training = iter(torch.utils.data.DataLoader(items, batch_size=1, num_workers=2,
                                            collate_fn=VideoCollator(items, settings)))
next(training)
me = os.getpid()
print(open(f"/proc/{me}/task/{me}/children").read(), flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a killed worker may wait to be reaped by init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_workers_end_when_the_parent_is_killed(videos_dir):
    videos = [str(p) for p in sorted(videos_dir.glob("mmaction2_*.mp4"))] * 2
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, *videos], stdout=subprocess.PIPE, text=True, env=env)
    workers = []
    try:
        workers = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(workers) == 4 and all(_alive(pid) for pid in workers)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in workers if _alive(pid)] == []
    finally:
        parent.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_first_batch_logs_its_decoding_clip_by_clip(videos_dir, caplog):
    from grounding_rl.data.dataset import GroundingDataset, VideoCollator
    from grounding_rl.data.video import VideoSettings

    dataset = GroundingDataset([{"video": str(videos_dir / name), "query": "q", "start": 1.0, "end": 2.0,
                                 "duration": 10.0, "qid": name} for name in ("mmaction2_pool_cleaning.mp4",
                                                                              "mmaction2_basketball_drill.mp4")])
    collator = VideoCollator(dataset, VideoSettings(fps=1.0, min_pixels=4 * 28 * 28, max_pixels=4 * 28 * 28))
    with caplog.at_level(logging.INFO, logger="grounding_rl.data.dataset"):
        collator([dataset[0], dataset[0], dataset[1], dataset[1]])  # G = 2 copies of each clip: 2 decodes
        first = [r.getMessage() for r in caplog.records]
        caplog.clear()
        collator([dataset[1], dataset[0]])
    assert first[0].startswith("first batch: decoding 2 clip(s)")
    assert [m.split(" decoded in ")[0] for m in first[1:]] == ["first batch: clip 1 of 2", "first batch: clip 2 of 2"]
    assert first[2].endswith("(%s)" % (videos_dir / "mmaction2_basketball_drill.mp4"))
    assert caplog.records == []  # later batches: silent
