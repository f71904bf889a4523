"""Zoom (eval / infer --zoom): the window, the pass-2 settings, absolute time, the record; a tiny-model two-pass run;
the long demo clips."""
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from grounding_rl.data.samples import Sample
from grounding_rl.data.video import VideoSettings, frame_size, window_indices, window_settings
from grounding_rl.errors import UserError
from grounding_rl.eval import zoom as zm
from grounding_rl.rollout import zoom as rzm

torch.set_num_threads(1)

FAST = ["--fps", "1", "--max-pixels", str(28 * 28 * 16), "--min-pixels", str(28 * 28 * 4), "--max-new-tokens", "12"]


# ------------------------------------------------------------------------------------------------ pure functions
def test_zoom_window_widens_the_answer_by_the_margin_and_at_least_one_patch():
    assert rzm.zoom_window((40.0, 50.0), 150.0, 1.0, 0.25) == ((30.0, 60.0), False)  # m = max(10, 8)
    assert rzm.zoom_window((2.0, 3.0), 150.0, 1.0, 0.25) == ((0.0, 11.0), False)  # m = 8, clipped at 0
    assert rzm.zoom_window((50.0, 40.0), 150.0, 0.5, 1.0) == ((35.0, 55.0), False)  # reversed: ordered, m = 5
    assert rzm.zoom_window((140.0, 170.0), 150.0, 0.0, 0.5) == ((136.0, 150.0), False)  # clamped to 150, m = 4


def test_zoom_window_falls_back_to_the_centre_half():
    assert rzm.zoom_window(None, 150.0, 1.0, 0.25) == ((37.5, 112.5), True)
    assert rzm.zoom_window((200.0, 210.0), 150.0, 1.0, 0.25) == ((37.5, 112.5), True)  # wholly after the clip
    assert rzm.zoom_window((-5.0, -1.0), 40.0, 1.0, 0.25) == ((10.0, 30.0), True)  # wholly before it


FIRST = {"fps": 0.32, "frames": 48, "height": 56, "width": 56}  # 150 s at 48 frames of 56x56
SETTINGS = VideoSettings(fps=1.0, max_frames=48, min_pixels=3136, max_pixels=3136)


def test_window_settings_spend_on_fps_keeps_the_frame_count_and_size():
    s2 = window_settings(SETTINGS, FIRST, (30.0, 60.0), "fps")
    assert s2.fps == pytest.approx(1.6) and s2.max_frames == 48
    indices, f = window_indices(600, 4.0, s2, 30.0, 60.0)  # a 150 s clip written at 4 fps
    assert len(indices) == 48 and f == pytest.approx(1.6)  # the grid k / 1.6 from 30 s: 49 times, floor2 48
    assert indices[0] == 120 and indices[-1] == round((30 + 47 / 1.6) * 4)
    assert frame_size(112, 112, 48, s2) == (56, 56)


def test_window_settings_spend_on_resolution_keeps_the_rate_and_the_pixels():
    s2 = window_settings(SETTINGS, FIRST, (30.0, 60.0), "resolution")
    spent = 48 * 56 * 56
    assert s2.fps == 0.32 and s2.total_pixels == spent // 2 and s2.total_tokens is None
    assert s2.max_pixels == spent // 8  # T₂ planned as floor2(0.32 · 30) = 8 frames
    indices, f = window_indices(600, 4.0, s2, 30.0, 60.0)
    assert len(indices) == 10 and f == 0.32  # k / 0.32 for k = 10 … 19
    height, width = frame_size(112, 112, len(indices), s2)
    assert (height, width) == (112, 112)  # 4x pass 1's pixels, the source's own size
    assert len(indices) * height * width <= spent


def test_window_settings_unknown_spend():
    with pytest.raises(ValueError, match="spend"):
        window_settings(SETTINGS, FIRST, (0.0, 10.0), "colour")


def test_absolute_time_and_position_offsets():
    assert rzm.to_absolute((2.0, 5.5), 30.25) == (32.25, 35.75)
    assert rzm.to_absolute((32, 35.0), 0.0) == (32.0, 35.0)
    assert rzm.to_absolute(None, 30.25) is None
    assert rzm.position_offset(30.0, 2) == 60 and rzm.position_offset(12.3, 2) == 25


def test_shift_video_positions_moves_only_the_video_tokens_temporal_ids():
    # row 0: left-padded by one; 1 text, 2 video, 2 text tokens. row 1: no padding, 2 text, 2 video, 1 text
    types = torch.tensor([[0, 0, 2, 2, 0, 0], [0, 0, 2, 2, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    positions = torch.tensor([[[0, 0, 1, 3, 2, 3], [0, 1, 2, 4, 3, 4]]] * 3)  # (3, 2, 6); spatial rows alike
    shifted, deltas = rzm.shift_video_positions(positions, types, mask, [10, 0])
    assert shifted[0, 0].tolist() == [0, 0, 11, 13, 2, 3] and shifted[1:].equal(positions[1:])
    assert shifted[0, 1].equal(positions[0, 1])
    assert deltas.tolist() == [[13 + 1 - 5], [4 + 1 - 6]]
    assert positions[0, 0, 2] == 1  # the input is untouched


def test_zoom_record_keeps_both_passes():
    sample = Sample(video="v.mp4", query="q", start=40.0, end=44.0, duration=150.0, qid="a", source="t")
    first = {"qid": "a", "answer": "<answer>38 to 50</answer>", "start": 38.0, "end": 50.0, "iou": 4 / 12,
             "sampling": FIRST}
    zoom = {"window": [26.0, 62.0], "fallback": False, "answer": "<answer>2 to 6</answer>",
            "interval": (40.0, 45.0), "sampling": {"fps": 1.333333, "frames": 48, "height": 56, "width": 56,
                                                   "window": [26.0, 62.0]}, "error": None}
    record = zm.zoom_record(first, zoom, sample)
    assert record["start"] == 40.0 and record["end"] == 45.0 and record["iou"] == pytest.approx(4 / 5)
    assert record["answer"] == "<answer>2 to 6</answer>" and record["sampling"]["window"] == [26.0, 62.0]
    assert record["pass1"] == {"answer": first["answer"], "start": 38.0, "end": 50.0, "iou": 4 / 12,
                               "sampling": FIRST}
    assert record["zoom_window"] == [26.0, 62.0] and record["zoom_fallback"] is False
    failed = zm.zoom_record(first, {**zoom, "error": "zoom window: too short"}, sample)
    assert failed["start"] == 38.0 and failed["zoom_error"] == "zoom window: too short"
    assert zm.zoom_record(first, None, sample) is first


def test_zoom_summary_counts_fallbacks_recall_and_pass1():
    def record(gt, window, fallback, first, final):
        return {"qid": str(gt), "gt_start": gt[0], "gt_end": gt[1], "gt_raw_start": gt[0], "gt_raw_end": gt[1],
                "duration": 100.0, "answer": "<answer>x</answer>", "start": final[0], "end": final[1],
                "zoom_window": window, "zoom_fallback": fallback,
                "pass1": {"answer": None if first is None else "<answer>x</answer>",
                          "start": None if first is None else first[0], "end": None if first is None else first[1]}}

    records = [record((10, 20), [5, 25], False, (10, 20), (12, 20)),  # pass 1 IoU 1, final 0.8
               record((60, 70), [25, 75], True, None, (60, 70))]  # fallback, pass 1 none (0), final 1
    summary = zm.zoom_summary(records)
    assert summary["queries"] == 2 and summary["fallbacks"] == 1 and summary["window_errors"] == 0
    assert summary["window_recall"] == 100.0
    assert summary["pass1"]["mIoU"] == pytest.approx(50.0) and summary["pass1"]["R1@0.5"] == pytest.approx(50.0)


def test_zoom_settings_and_flags_are_checked():
    from grounding_rl.family import family_of

    with pytest.raises(UserError, match="--zoom-margin"):
        zm.ZoomSettings(margin=-1).check()
    with pytest.raises(UserError, match="Qwen3-VL"):
        zm.ZoomSettings(time="window").check_family(family_of("qwen3_vl"))
    with pytest.raises(UserError, match="vllm"):
        zm.ZoomSettings(time="video").check_family(family_of("qwen2_5_vl"), "vllm")
    zm.ZoomSettings(time="window").check_family(family_of("qwen2_5_vl"), "vllm")
    zm.ZoomSettings().check_family(family_of("qwen3_vl"))  # the family's default
    with pytest.raises(UserError, match="exact sampler"):
        zm.check_run(zm.ZoomSettings(), "no-such-dir", "hf", "qwen_vl_utils", "default")
    with pytest.raises(UserError, match="--zoom: prompt_template 'timelens2' asks for a set"):
        zm.check_run(zm.ZoomSettings(), "no-such-dir", "hf", "exact", "timelens2")
    zm.check_run(zm.ZoomSettings(), "no-such-dir", "hf", "exact", "default")
    assert family_of("qwen2_5_vl").zoom_time() == "window" and family_of("qwen3_vl").zoom_time() == "video"
    assert family_of("qwen2_5_vl").zoom_time("video") == "video"
    from grounding_rl.cli.eval import build_parser, zoom_from_args

    parser = build_parser()
    base = ["--model", "m", "--data", "d", "--out", "o"]
    with pytest.raises(UserError, match="--zoom-spend given without --zoom"):
        zoom_from_args(parser.parse_args(base + ["--zoom-spend", "resolution"]))
    assert zoom_from_args(parser.parse_args(base)) is None
    assert zoom_from_args(parser.parse_args(base + ["--zoom", "--zoom-margin", "0.5"])) == zm.ZoomSettings(0.5)


# ------------------------------------------------------------------------------------------------ tiny model
def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_eval_zoom_two_passes_resume_and_decodes(tiny_model_dir, videos_dir, tmp_path, monkeypatch, capsys):
    """Pass 1 decodes each video once for all its queries, each window is decoded by seeking once; the records keep
    both passes; an interrupted zoom run resumes to the same predictions; a one-pass rerun in the folder is
    refused."""
    import grounding_rl.data.video as video_module
    from grounding_rl.cli import main as cli
    from grounding_rl.rollout import greedy

    data = videos_dir / "annotations.jsonl"
    whole, windows = [], []
    sample_frames, sample_window = video_module.sample_frames, video_module.sample_window

    def counting_sample_frames(path, *args, **kwargs):
        whole.append(path)
        return sample_frames(path, *args, **kwargs)

    def counting_sample_window(path, start, end, *args, **kwargs):
        windows.append((path, start, end))
        return sample_window(path, start, end, *args, **kwargs)

    monkeypatch.setattr(greedy, "sample_frames", counting_sample_frames)
    monkeypatch.setattr(video_module, "sample_window", counting_sample_window)

    def run(out, *extra):
        return cli(["eval", "--model", str(tiny_model_dir), "--data", str(data), "--out", str(out), *FAST,
                    "--num-workers", "0", "--batch-size", "4", "--limit", "6", "--zoom", *extra])

    assert run(tmp_path / "once") == 0
    records = _lines(tmp_path / "once" / "predictions.jsonl")
    videos = {r["video"] for r in records}
    assert len(whole) == len(videos) and len(windows) == 6
    for record, (_, start, end) in zip(records, windows):
        assert record["zoom_window"] == [round(start, 6), round(end, 6)]
        assert record["sampling"]["window"][0] == pytest.approx(start)
        assert set(record["pass1"]) == {"answer", "start", "end", "iou", "sampling"}
        assert "window" not in record["pass1"]["sampling"]
        if record["pass1"]["start"] is None:  # the random model rarely writes a parseable answer
            assert record["zoom_fallback"] is True
            assert record["zoom_window"][1] - record["zoom_window"][0] == pytest.approx(
                record["zoom_window"][1] / 3 * 2, rel=0.01)  # the centre half [d/4, 3d/4]
    saved = json.loads((tmp_path / "once" / "eval_config.json").read_text())["zoom"]
    assert saved == dataclasses.asdict(zm.ZoomSettings()) == {"margin": 1.0, "spend": "fps", "time": None}
    metrics = json.loads((tmp_path / "once" / "metrics.json").read_text())
    assert metrics["sampling"]["zoom"]["spend"] == "fps"
    assert metrics["zoom"]["queries"] == 6
    assert metrics["zoom"]["fallbacks"] == sum(r["zoom_fallback"] for r in records)

    assert run(tmp_path / "resumed", "--limit", "3") == 0
    capsys.readouterr()
    assert run(tmp_path / "resumed") == 0
    assert "3 already in" in capsys.readouterr().out
    assert _lines(tmp_path / "resumed" / "predictions.jsonl") == records

    one_pass = ["eval", "--model", str(tiny_model_dir), "--data", str(data), "--out", str(tmp_path / "once"), *FAST,
                "--num-workers", "0", "--limit", "6"]
    assert cli(one_pass) == 2
    assert "zoom:" in capsys.readouterr().err


def test_infer_zoom_prints_both_prompts(tiny_model_dir, videos_dir, capsys):
    from grounding_rl.cli import infer as infer_cli

    rc = infer_cli.main(["--model", str(tiny_model_dir), "--video", str(videos_dir / "charades_OHOFG.mp4"),
                         "--query", "person sitting down in a chair.", "--zoom", "--print-prompt", "--json", *FAST])
    assert rc == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)[0]
    window = result["zoom_window"]
    heading = f"--- pass 2 (zoom window {window[0]:.2f}–{window[1]:.2f} s) ---"
    err = captured.err
    assert heading in err and err.count("<|vision_start|>") == 2
    assert err.index("(pass 1)") < err.index(heading)
    assert result["pass1"]["sampling"]["frames"] > 0 and result["sampling"]["window"] == window


# ------------------------------------------------------------------------------------------------ long demo clips
def test_long_demo_clips_have_short_events_and_a_time_bar():
    from grounding_rl.dev import demo

    specs = [demo.clip_spec(0, "train", i, 120.0, 180.0, long=True) for i in range(40)]
    assert all(120.0 <= s.duration <= 180.0 and 2.0 <= s.end - s.start <= 5.0 for s in specs)
    assert {s.end - s.start for s in specs} == {2.0, 3.0, 4.0, 5.0}
    assert demo.time_bar_length([0.0, 1.5, 90.0, 179.9, 200.0]).tolist() == [0, 1, 56, 111, 112]
    spec = specs[0]
    frames = demo.render_frames(spec)
    assert len(frames) == spec.duration * demo.LONG_FPS
    t = 100 * demo.LONG_FPS  # frame at 100 s: a bar of round(112 · 100 / 180) = 62 pixels
    bottom = frames[t, demo.SIZE - demo.TIME_BAR_ROWS:]
    assert (bottom[:, :62] == 0).all() and (bottom[:, 62:] != 0).any(axis=-1).all()
    assert not (demo.render_frames(demo.clip_spec(0, "train", 0))[:, -1] == 0).all(axis=-1).any()  # short: no bar


def test_video_time_offsets_shift_qwen2_5_vl_positions_inside_the_block_only(tiny_model_dir, videos_dir):
    """``time="video"``: inside the block the model's own ``get_rope_index`` (what ``generate`` calls) puts the window's
    video tokens at their time in the whole video; outside it nothing changes."""
    from grounding_rl.data.video import sample_window
    from grounding_rl.models.loading import load_for_inference
    from grounding_rl.models.vision import core_model, rope_position_ids
    from grounding_rl.prompts.preprocessing import build_inputs

    model, processor = load_for_inference(str(tiny_model_dir), "cpu")
    clip = sample_window(videos_dir / "charades_OHOFG.mp4", 20.0, 30.0,
                         VideoSettings(fps=1.0, max_pixels=28 * 28 * 16, min_pixels=28 * 28 * 4))
    inputs = dict(build_inputs(processor, ["q"], [clip], "default"))
    before = rope_position_ids(model, inputs)
    offset = rzm.position_offset(float(clip.timestamps[0]), model.config.vision_config.tokens_per_second)
    assert offset == 40
    with rzm.video_time_offsets(model, [offset]):
        inside = rope_position_ids(model, inputs)
    video = inputs["mm_token_type_ids"][0] == 2
    assert (inside[0, 0, video] - before[0, 0, video]).unique().tolist() == [40]
    assert inside[0, 0, ~video].equal(before[0, 0, ~video]) and inside[1:].equal(before[1:])
    assert rope_position_ids(model, inputs).equal(before)
    assert "get_rope_index" not in vars(core_model(model))


def test_qwen3_vl_pass_2_prompt_shows_the_windows_true_timestamps(tiny_qwen3_model_dir, videos_dir, capsys):
    """Qwen3-VL: the pass-2 prompt's ``<t seconds>`` lie inside the zoom window (absolute time), pass 1's span the
    clip; the default ``--zoom-time`` resolves to ``video`` for this family."""
    import re

    from grounding_rl.cli import infer as infer_cli

    fast = ["--fps", "1", "--max-pixels", str(32 * 32 * 16), "--min-pixels", str(32 * 32 * 4),
            "--max-new-tokens", "12"]
    rc = infer_cli.main(["--model", str(tiny_qwen3_model_dir), "--video", str(videos_dir / "charades_OHOFG.mp4"),
                         "--query", "person sitting down in a chair.", "--zoom", "--print-prompt", "--json", *fast])
    assert rc == 0
    captured = capsys.readouterr()
    window = json.loads(captured.out)[0]["zoom_window"]
    first, second = captured.err.split("--- pass 2 (zoom window")
    times1 = [float(t) for t in re.findall(r"<(\d+\.\d) seconds>", first)]
    times2 = [float(t) for t in re.findall(r"<(\d+\.\d) seconds>", second)]
    assert times1[0] < 1.0 and times1[-1] > 30.0
    assert times2 and window[0] - 0.05 <= times2[0] and times2[-1] <= window[1] + 0.05
