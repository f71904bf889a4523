"""report.html (the error gallery ``eval`` writes beside report.md) and the timeline drawing it shares with
``infer --plot``: queries picked, frames at their true times, passes and crop windows drawn, and the page rendered by
Chromium (headless shell, offline, no JavaScript)."""
import base64
import io
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from grounding_rl.data.video import VideoSettings
from grounding_rl.eval.gallery import draw_timeline, lane, pick, write_report_html
from grounding_rl.eval.report import plot_iou_hist

CHROMIUM = "chromium-headless-shell"
INSTALL = "apt-get install -y --no-install-recommends chromium-headless-shell"
SMALL = VideoSettings(fps=2.0, max_pixels=28 * 28 * 16, min_pixels=28 * 28 * 4)


def _record(qid, video, iou, start, end, gt=(1.0, 4.0), duration=6.56, **extra):
    return {"qid": qid, "video": str(video), "query": f"query {qid}", "duration": duration, "gt_start": gt[0],
            "gt_end": gt[1], "answer": f"<think>why {qid}</think><answer>{start} to {end}</answer>",
            "reasoning": f"why {qid}", "start": start, "end": end, "iou": iou, **extra}


def _records(videos_dir):
    clip = videos_dir / "mmaction2_eye_makeup.avi"
    zoom = {"pass1": {"answer": "0 to 5", "start": 0.0, "end": 5.0}, "zoom_window": [0.0, 5.5], "zoom_fallback": False}
    turns = {"conversation": {"turns": [{"text": "<crop>2 to 5</crop>", "kind": "call", "window": [2.0, 5.0]},
                                        {"text": "<answer>2.5 to 4</answer>", "kind": "answer", "window": None}],
                              "windows": [[2.0, 5.0]], "calls": 1, "failures": 0}}
    return [_record("0", clip, 0.5, 1.0, 2.5), _record("1", clip, 0.9, 1.2, 4.0, **zoom),
            _record("2", clip, 0.0, None, None, zoom_error="window not sampled"),
            _record("3", clip, 0.6, 2.5, 4.0, **turns),
            {**_record("4", videos_dir / "absent.mp4", 0.0, None, None, duration=10.0), "answer": None,
             "reasoning": None, "error": "video not found"}]


def test_pick_shows_each_query_once_worst_best_then_random():
    records = [{"qid": str(i), "iou": iou} for i, iou in enumerate([0.5, 0.1, 0.9, 0.1, 0.7, 0.3, 0.0])]
    sections = pick(records, n=2)
    # worst (ties in annotation order), best of the rest, then 2 drawn from 0, 3 and 5
    assert [[r["qid"] for r in chosen] for _, chosen in sections] == [["6", "1"], ["2", "4"], ["3", "5"]]
    assert [title for title, _ in pick(records[:3], n=2)] == ["Worst 2 queries (lowest IoU)",
                                                              "Best 1 queries (highest IoU)"]


def test_lanes_read_passes_and_turns_and_thumbnails_sit_at_their_times(videos_dir):
    records = _records(videos_dir)
    assert lane(records[1])["zoom_window"] == (0.0, 5.5) and lane(records[1])["pass1"] == (0.0, 5.0)
    assert lane(records[3])["windows"] == [(2.0, 5.0)] and lane(records[3])["gts"] == [(1.0, 4.0)]
    assert lane(records[2])["spans"] == [] and lane({"query": "q", "spans": [[3, 1]]}, (0, 2))["gts"] == [(0.0, 2.0)]
    stamps = [0.3, 1.1, 4.0, 6.2]  # uneven: each thumbnail is centred on its own frame's time
    fig = draw_timeline(np.zeros((4, 8, 8, 3), np.uint8), stamps, 6.56, [lane(records[3])], "t", max_frames=4)
    centres = [round((im.get_extent()[0] + im.get_extent()[1]) / 2, 6) for im in fig.axes[0].images]
    assert centres == stamps
    assert len(fig.axes[1].patches) == 3  # crop window, ground truth, prediction


def _chromium():
    path = shutil.which(CHROMIUM)
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{CHROMIUM} is missing in CI: {INSTALL}")
        pytest.skip(f"{CHROMIUM} is not installed: {INSTALL}")
    return [path, "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]


def test_report_html_renders_offline_in_chromium(videos_dir, tmp_path):
    from PIL import Image

    records = _records(videos_dir)
    hist = plot_iou_hist([r["iou"] for r in records], tmp_path / "iou_hist.png")
    metrics = {"n": 5, "R1@0.3": 60.0, "R1@0.5": 60.0, "R1@0.7": 20.0, "mIoU": 40.0}
    page = write_report_html(tmp_path / "report.html", metrics, {"model": "/m/tiny"}, records, hist, SMALL)
    text = page.read_text()
    assert "<script" not in text and "http" not in text.replace("http-equiv", "")
    sources = re.findall(r'<img src="([^"]+)"', text)
    assert len(sources) == 6  # the histogram and one timeline per query
    for source in sources:
        mime, data = re.fullmatch(r"data:(image/(?:png|jpeg));base64,(.+)", source).groups()
        image = Image.open(io.BytesIO(base64.b64decode(data)))
        image.load()
        assert image.format.lower() in mime and image.width > 100
    assert "pass 2 (window 0.00–5.50 s)" in text and "turn 1 (call, crop 2.00–5.00 s)" in text
    assert "error: video not found" in text and "zoom error: window not sampled" in text and "why 0" in text
    chromium = _chromium()
    dom = subprocess.run(chromium + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    # the metrics table as the browser parsed it (it adds the <tbody>), every picture in place
    assert re.search(r"<table><tbody><tr><th>n</th>.*?<th>R1@0.5</th>.*?<td>60.00</td>", dom) and dom.count("<img") == 6
    shot = tmp_path / "shot.png"
    subprocess.run(chromium + [f"--screenshot={shot}", "--window-size=1000,1400", page.as_uri()],
                   capture_output=True, timeout=60, check=True)
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape == (1400, 1000) and pixels.std() > 10


def test_without_chromium_the_render_test_skips_naming_the_install_outside_ci_and_fails_in_ci(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=re.escape(INSTALL)):
        _chromium()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=re.escape(INSTALL)):
        _chromium()
