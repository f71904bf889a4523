"""Hour-long videos: the token budget, the unsampled tail, windows of a clip, Qwen3-VL's timestamp tokens, and the
Ego4D-NLQ and ExtremeWhenBench readers (synthetic files of their shapes; the data cannot be fetched here)."""
import importlib.util
import json
from dataclasses import replace

import numpy as np
import pytest

from grounding_rl.data.readers import read_annotations
from grounding_rl.data.samples import Sample, validate
from grounding_rl.data.video import (
    VideoSettings,
    WindowError,
    budget_max_frames,
    frame_size,
    sample_frames,
    sample_window,
    sampling_plan,
    window_indices,
)
from grounding_rl.paths import REPO_ROOT

# TimeLens2's training budget (grpo/scripts/train.sh, grpo/timelens/data/video.py): 2 fps, 16,384 tokens of 32x32
# pixels a clip, at least 1 token a frame, 512 frames at most (its fps_max_frames for 16k), Qwen3-VL's factor.
TIMELENS2 = VideoSettings(fps=2.0, max_frames=512, total_tokens=16384, min_tokens=1, max_pixels=768 * 32 * 32,
                          pixel_factor=32)


# ------------------------------------------------------------------------------------------------- token budget
def test_token_budget_is_timelens2s_pixel_rule():
    """total_pixels = total_tokens · factor², min_pixels = min_tokens · factor²: the same frames as the pixel form."""
    assert (TIMELENS2.budget_pixels, TIMELENS2.floor_pixels) == (16384 * 1024, 1024)
    pixels = VideoSettings(fps=2.0, max_frames=512, total_pixels=16384 * 1024, min_pixels=1024,
                           max_pixels=768 * 32 * 32, pixel_factor=32)
    for size, frames in (((720, 1280), 512), ((360, 640), 120), ((1080, 1920), 8)):
        assert frame_size(*size, frames, TIMELENS2) == frame_size(*size, frames, pixels)
    # an hour of 720p: 512 frames (max_frames), 256 pairs of 192x320 = 60 tokens: 15,360 ≤ 16,384
    frames, f = sampling_plan(TIMELENS2, 3600.0)
    height, width = frame_size(720, 1280, frames, TIMELENS2)
    assert (frames, f, height, width) == (512, 512 / 3600, 192, 320)
    assert frames // 2 * height * width // 32**2 == 15360 <= 16384
    # the same number of tokens means the family's own pixels: Qwen2.5-VL's factor 28
    qwen25 = replace(TIMELENS2, pixel_factor=28, max_pixels=768 * 28 * 28)
    assert (qwen25.budget_pixels, qwen25.floor_pixels) == (16384 * 784, 784)


# The token budget against qwen-vl-utils 0.0.14's own code: process_vision_info given the budget in pixels, the floor,
# fps and max_frames, and no max_pixels (as TimeLens2's grpo/timelens/data/video.py calls it): its per-frame cap is then
# VIDEO_MAX_TOKEN_NUM · factor² (786,432 for Qwen3-VL's 32; 602,112 for Qwen2.5-VL's 28).
def _token_settings(factor: int, tokens: int) -> VideoSettings:
    return VideoSettings(fps=2.0, max_frames=512, total_tokens=tokens, min_tokens=1, pixel_factor=factor)


def _qwen_vl_utils_video(video: str, factor: int, tokens: int) -> tuple:
    """(T, H, W) from ``process_vision_info`` for one video element."""
    from qwen_vl_utils import process_vision_info

    element = {"type": "video", "video": video, "fps": 2.0, "max_frames": 512, "total_pixels": tokens * factor ** 2,
               "min_pixels": factor ** 2}
    _, videos = process_vision_info([{"role": "user", "content": [element]}], image_patch_size=factor // 2)
    frames = videos[0]
    return frames.shape[0], frames.shape[2], frames.shape[3]


@pytest.fixture(scope="module")
def encoded_clips(tmp_path_factory):
    """30-fps h264 files of 3 s and 30 s at 640×360 and 1280×720 (one grey frame repeated: cheap to encode and
    decode)."""
    import av

    folder, paths = tmp_path_factory.mktemp("budget_clips"), {}
    for seconds in (3, 30):
        for width, height in ((640, 360), (1280, 720)):
            path = folder / f"{seconds}s_{width}x{height}.mp4"
            with av.open(str(path), "w") as container:
                stream = container.add_stream("libx264", rate=30)
                stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
                stream.options = {"preset": "ultrafast"}
                frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), 128, np.uint8), format="rgb24")
                frame = frame.reformat(format="yuv420p")
                for i in range(30 * seconds):
                    frame.pts = i
                    for packet in stream.encode(frame):
                        container.mux(packet)
                for packet in stream.encode():
                    container.mux(packet)
            paths[(seconds, width, height)] = path
    return paths


def test_token_budget_frames_equal_process_vision_infos_on_encoded_files(encoded_clips):
    """Qwen3-VL at 16,384 tokens: every frame count and size equals qwen-vl-utils'; e.g. 3 s of 1280×720: 6 frames of
    640×1152 (2,160 merged tokens), where the cap of Qwen2.5-VL's default max_pixels gave 576×1024. (Qwen2.5-VL's
    cap is the default itself: the described clips below cover it without decoding twice.)"""
    factor = 32
    settings = _token_settings(factor, 16384)
    for (seconds, width, height), path in encoded_clips.items():
        ours = sample_frames(path, settings)
        assert (ours.num_frames, *ours.frames.shape[1:3]) == _qwen_vl_utils_video(str(path), factor, 16384), (
            seconds, width, height)
        if (factor, seconds, width) == (32, 3, 1280):
            assert (ours.num_frames, *ours.frames.shape[1:3]) == (6, 640, 1152)


@pytest.mark.parametrize("factor", [32, 28])
@pytest.mark.parametrize("tokens", [16384, 65536])
def test_token_budget_plan_equals_qwen_vl_utils_for_described_clips(monkeypatch, factor, tokens):
    """180 s to 2.5 h of 30-fps 1280×720 and 640×360, described rather than encoded: qwen-vl-utils' ``fetch_video``
    runs as it is, its reader replaced by one that reports the clip's frame count through its own ``smart_nframes``
    and its resize by a shape-only one; our :func:`sampling_plan` and :func:`frame_size` give the same T, H, W."""
    import torch
    from qwen_vl_utils import vision_process

    described = {}

    def reader(element):
        seconds, height, width = described[element["video"]]
        total = seconds * 30
        frames = vision_process.smart_nframes(element, total_frames=total, video_fps=30.0)
        video = torch.empty(frames, 3, height, width, dtype=torch.uint8, device="meta")
        return video, {"fps": 30.0, "frames_indices": [], "total_num_frames": total}, frames / total * 30.0

    monkeypatch.setitem(vision_process.VIDEO_READER_BACKENDS, "described", reader)
    monkeypatch.setattr(vision_process, "get_video_reader_backend", lambda: "described")
    monkeypatch.setattr(vision_process.transforms.functional, "resize",
                        lambda video, size, **_: torch.empty(video.shape[0], 3, *size, device="meta"))
    settings = _token_settings(factor, tokens)
    for seconds in (3, 30, 180, 600, 1800, 3600, 9000):
        for height, width in ((720, 1280), (360, 640)):
            described[f"clip_{seconds}_{width}"] = (seconds, height, width)
            frames, _ = sampling_plan(settings, float(seconds))
            ours = (frames, *frame_size(height, width, frames, settings))
            assert ours == _qwen_vl_utils_video(f"clip_{seconds}_{width}", factor, tokens), (seconds, width)


def test_a_max_pixels_of_its_own_still_caps_a_token_budget():
    capped = replace(_token_settings(32, 16384), max_pixels=640 * 640)
    assert capped.ceiling_pixels == 409600 and _token_settings(32, 16384).ceiling_pixels == 786432
    assert _token_settings(28, 16384).ceiling_pixels == 602112  # Qwen2.5-VL: the default, unchanged
    assert VideoSettings(pixel_factor=32).ceiling_pixels == 602112  # no token budget: max_pixels as given


def test_budget_lowers_fps_once_frames_reach_the_floor():
    # min_tokens 64 (TimeLens2's config default): floor 65,536 px; 2 · 16,777,216 / ⌊1.05 · 65,536⌋ = 487.6 → 486
    rule = VideoSettings(fps=2.0, max_frames=512, total_tokens=16384, min_tokens=64, max_pixels=768 * 32 * 32,
                         pixel_factor=32, budget_lowers_fps=True)
    assert budget_max_frames(rule) == 486 and budget_max_frames(TIMELENS2) is None
    assert budget_max_frames(replace(rule, min_tokens=1)) == 31212  # TimeLens2's scripts: never binding
    assert sampling_plan(rule, 3600.0) == (486, 486 / 3600)  # spread over the hour, exact scale
    assert sampling_plan(rule, 60.0) == (120, 2.0)  # a minute: 120 frames fit, fps kept
    for frames in (486, 400, 120):  # under the rule the budget holds whatever the source size
        for size in ((720, 1280), (480, 640), (1080, 1920)):
            height, width = frame_size(*size, frames, rule)
            assert frames // 2 * height * width <= rule.budget_pixels, (frames, size)
    # without the rule, 768 frames (max_frames 768) of 720p sit at the floor, 192x320: 384 · 61,440 > 16,777,216
    free = replace(rule, budget_lowers_fps=False, max_frames=768)
    assert sampling_plan(free, 3600.0) == (768, 768 / 3600)
    assert frame_size(720, 1280, 768, free) == (192, 320) and 384 * 192 * 320 == 23592960 > rule.budget_pixels
    assert sampling_plan(replace(free, budget_lowers_fps=True), 3600.0) == (486, 486 / 3600)


def test_contradictory_budgets_are_refused():
    with pytest.raises(ValueError, match="total_tokens .* or total_pixels .*, not both"):
        VideoSettings(total_tokens=100, total_pixels=10**6)
    with pytest.raises(ValueError, match="min_tokens .* or min_pixels .*, not both"):
        VideoSettings(min_tokens=4, min_pixels=3136)
    with pytest.raises(ValueError, match="budget_lowers_fps needs a budget"):
        VideoSettings(budget_lowers_fps=True)
    with pytest.raises(ValueError, match="cover_tail is for the exact sampler"):
        VideoSettings(cover_tail=True, sampler="qwen_vl_utils")
    with pytest.raises(ValueError, match="total_tokens must be > 0"):
        VideoSettings(total_tokens=0)


def test_settings_written_before_the_long_video_fields_compare_equal():
    """Fingerprints, eval runs and frame-cache keys hold VideoSettings.to_dict(): the new fields appear only when set,
    so a run or a cache entry made before them still matches."""
    assert set(VideoSettings().to_dict()) == {"fps", "min_frames", "max_frames", "min_pixels", "max_pixels",
                                              "total_pixels", "sampler", "pixel_factor"}
    assert VideoSettings(total_tokens=8, cover_tail=True).to_dict()["total_tokens"] == 8
    assert "budget_lowers_fps" not in VideoSettings(total_tokens=8, cover_tail=True).to_dict()


def test_training_arguments_carry_the_long_video_settings():
    from grounding_rl.prompts.preprocessing import GroundingConfig, PreprocessingArguments

    args = PreprocessingArguments(video_total_tokens=16384, video_min_tokens=1, video_budget_lowers_fps=True,
                                  video_cover_tail=True)
    assert args.preprocessing_problems() == []
    video = args.video_settings
    assert (video.total_tokens, video.min_tokens, video.budget_lowers_fps, video.cover_tail) == (16384, 1, True, True)
    saved = GroundingConfig(video=video).to_dict()  # grounding_config.json: read back as written
    assert GroundingConfig.from_dict(json.loads(json.dumps(saved))).video == video
    assert PreprocessingArguments(video_total_tokens=8, video_total_pixels=9).preprocessing_problems() == [
        "give video_total_tokens (8) or video_total_pixels (9), not both"]


def test_eval_overrides_replace_a_budget_given_the_other_way(tmp_path):
    from grounding_rl.eval.settings import PreprocessingOverrides, resolve_config
    from grounding_rl.prompts.preprocessing import GroundingConfig

    GroundingConfig(video=VideoSettings(total_pixels=3584 * 28 * 28, min_pixels=16 * 28 * 28)).save(tmp_path)
    overrides = PreprocessingOverrides(total_tokens=16384, min_tokens=1, cover_tail=True)
    config, source = resolve_config(tmp_path, overrides)
    video = config.video
    assert (video.total_pixels, video.total_tokens, video.min_tokens, video.cover_tail) == (None, 16384, 1, True)
    assert "cover_tail" in source and "total_tokens" in source


# ---------------------------------------------------------------------------------------------------- the tail
def test_the_tail_of_a_35_2_second_clip_at_1_fps():
    frames, f = sampling_plan(VideoSettings(fps=1.0), 35.2)
    assert (frames, f) == (34, 1.0)  # frames at 0..33 s: the last pair's timestamp <32.5 seconds>, 33 to 35.2 unseen
    assert (frames - 2 + frames - 1) / 2 / f == 32.5
    frames, f = sampling_plan(VideoSettings(fps=1.0, cover_tail=True), 35.2)
    assert frames == 34 and f == pytest.approx(34 / 35.2) and frames / f == pytest.approx(35.2)


def _bench_tail():
    spec = importlib.util.spec_from_file_location("bench_tail", REPO_ROOT / "scripts" / "bench_tail.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tail_figures_by_hand():
    def sample(end, duration):
        return Sample("v.mp4", "q", 0.0, end, duration, "x", "jsonl")

    # 10.9 s at 1 fps: T = 10, frames at 0..9 s; ends 10.5 (past both), 9.5 (past the last frame only), 8 (neither)
    figures = _bench_tail().tail_figures([sample(10.5, 10.9), sample(9.5, 10.9), sample(8.0, 10.9)],
                                         VideoSettings(fps=1.0))
    assert figures["queries"] == 3
    assert figures["after_period_pct"] == pytest.approx(100 / 3)
    assert figures["after_period_depth_s"] == pytest.approx(0.5)
    assert figures["after_last_frame_pct"] == pytest.approx(200 / 3)
    assert figures["after_last_frame_depth_s"] == pytest.approx((1.5 + 0.5) / 2)


def test_charades_sta_tail_figures(benchmarks_dir):
    samples, _ = validate(read_annotations("charades_sta", benchmarks_dir / "charades_sta" / "charades_sta_test.txt",
                                           durations=benchmarks_dir / "charades_sta" / "charades.json"), log_limit=0)
    figures = _bench_tail().tail_figures(samples, VideoSettings(fps=2.0))
    assert figures["queries"] == 3720
    assert round(figures["after_period_pct"], 1) == 15.5 and round(figures["after_period_depth_s"], 2) == 0.49
    assert round(figures["after_last_frame_pct"], 1) == 17.7 and round(figures["after_last_frame_depth_s"], 2) == 0.91
    covered = _bench_tail().tail_figures(samples, VideoSettings(fps=2.0, cover_tail=True))
    assert covered["after_period_pct"] == 0.0


# ------------------------------------------------------------------------------------------------------ windows
@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """8 s of 64x48 at 24 fps (192 frames, h264 with B-frames), each frame a different picture."""
    import av

    path = tmp_path_factory.mktemp("clip") / "clip.mp4"
    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.options = {"preset": "ultrafast", "bframes": "2", "g": "50"}
        for i in range(192):
            image = np.full((48, 64, 3), (i * 5) % 256, np.uint8)
            image[rng.integers(0, 48), :, :] = 255 - image[0, 0]
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


SMALL = VideoSettings(fps=2.0, min_pixels=32 * 32, max_pixels=64 * 64)  # no budget: the size does not depend on T


def test_window_is_the_whole_samplings_frames(clip):
    whole = sample_frames(clip, SMALL)
    assert whole.num_frames == 16 and whole.sampled_fps == 2.0  # 0, 0.5, ..., 7.5 s
    window = sample_window(clip, 2.1, 5.0, SMALL)  # grid times 2.5, 3.0, ..., 5.0: six frames
    assert window.window == (2.1, 5.0) and window.sampled_fps == 2.0 and window.num_frames == 6
    assert window.frame_indices == whole.frame_indices[5:11]
    assert window.timestamps == whole.timestamps[5:11] and window.timestamps[0] == 2.5  # absolute times
    np.testing.assert_array_equal(window.frames, whole.frames[5:11])
    assert window.sampling() == {"fps": 2.0, "frames": 6, "height": 56, "width": 56, "window": [2.1, 5.0]}
    assert whole.sampling() == {"fps": 2.0, "frames": 16, "height": 56, "width": 56}


def test_window_with_a_frame_cap_or_cover_tail_spreads_over_the_window(clip):
    capped = sample_window(clip, 1.0, 7.0, replace(SMALL, max_frames=4))
    assert capped.num_frames == 4 and capped.sampled_fps == pytest.approx(4 / 6.0)
    assert capped.timestamps == pytest.approx([1.0, 2.5, 4.0, 5.5])  # 1 + 1.5 j
    indices, f = window_indices(192, 24.0, replace(SMALL, cover_tail=True), 1.0, 7.0)  # 13 grid points → 12 frames
    assert f == pytest.approx(2.0) and indices == [24 + 12 * j for j in range(12)]
    indices, f = window_indices(192, 24.0, replace(SMALL, cover_tail=True), 1.0, 6.8)  # 12 grid points → 12 frames
    assert len(indices) == 12 and f == pytest.approx(12 / 5.8)
    with pytest.raises(WindowError, match="empty or outside"):
        sample_window(clip, 5.0, 5.0, SMALL)
    with pytest.raises(WindowError, match="empty or outside"):
        window_indices(192, 24.0, SMALL, 9.0, 12.0)


def test_qwen3_vl_timestamps_of_a_window_are_absolute(clip):
    from grounding_rl.family.qwen3_vl import QWEN3_VL, TICKS_PER_SECOND

    window = sample_window(clip, 4.0, 6.0, SMALL)
    meta = QWEN3_VL.video_metadata(window)
    assert [i / TICKS_PER_SECOND for i in meta.frames_indices] == [4.0, 4.5, 5.0, 5.5]  # <4.2 seconds>, <5.2 …>


# -------------------------------------------------------------------------------------- Qwen3-VL timestamp text
def test_qwen3_vl_timestamp_tokens_match_its_tokenizer(qwen3_processor_dir):
    from transformers import AutoTokenizer

    from grounding_rl.family.qwen2_5_vl import QWEN2_5_VL
    from grounding_rl.family.qwen3_vl import QWEN3_VL

    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_processor_dir))
    times = [0.0, 0.5, 31.0, 34.0, 3410.0, 3415.0, 12344.9, 12345.1]
    pairs = [f"<{(a + b) / 2:.1f} seconds>" for a, b in zip(times[::2], times[1::2])]
    counted = sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in pairs)
    assert pairs[2] == "<3412.5 seconds>" and QWEN3_VL.time_text_tokens(times) == counted == 6 + 7 + 9 + 10
    assert QWEN2_5_VL.time_text_tokens(times) == 0
    frames, f = sampling_plan(TIMELENS2, 3600.0)  # an hour: 256 pairs of mostly four-digit times
    assert QWEN3_VL.time_text_tokens(np.arange(frames) / f) == 6 + 6 * 7 + 64 * 8 + 185 * 9 == 2225


# ------------------------------------------------------------------------------------------------------ readers
def _nlq(tmp_path):
    """An nlq_val.json of Ego4D's shape: one video, two clips; a query without text and one without an annotation id."""
    def query(start, end, text="where did I put the keys?"):
        item = {"clip_start_sec": start, "clip_end_sec": end, "clip_start_frame": int(start * 30),
                "clip_end_frame": int(end * 30), "video_start_sec": start + 120.0, "video_end_sec": end + 120.0,
                "template": "Objects: Where is object X?", "slot_x": "keys"}
        if text is not None:
            item["query"] = text
        return item

    data = {"version": "v2", "videos": [{"video_uid": "vid-a", "clips": [
        {"clip_uid": "clip-1", "video_start_sec": 120.0, "video_end_sec": 600.0, "annotations": [
            {"annotation_uid": "ann-1", "language_queries": [query(10.5, 14.0), query(30.0, 31.5, None),
                                                            query(470.0, 480.0, "  who did I talk to? ")]}]},
        {"clip_uid": "clip-2", "video_start_sec": 900.0, "video_end_sec": 1380.0, "annotations": [
            {"language_queries": [query(0.0, 2.0, "what did I cut")]}]}]}]}
    path = tmp_path / "nlq_val.json"
    path.write_text(json.dumps(data))
    return path


def test_ego4d_nlq_reader_clip_time(tmp_path, caplog):
    path = _nlq(tmp_path)
    samples = list(read_annotations("ego4d_nlq", path, video_root=tmp_path / "clips"))
    assert [s.qid for s in samples] == ["ann-1:0", "ann-1:1", "ann-1:2", "ego4d_nlq:clip-2#0.0"]
    assert samples[0].video == str(tmp_path / "clips" / "clip-1.mp4")
    assert (samples[0].start, samples[0].end, samples[0].duration) == (10.5, 14.0, 480.0)
    assert "1 of 4 language queries have no text" in caplog.text
    kept, counts = validate(samples)
    assert counts == {"kept": 3, "dropped": 1, "clamped": 0}  # the query without text
    assert kept[1].query == "who did I talk to?" and kept[2].video.endswith("clip-2.mp4")


def test_ego4d_nlq_reader_video_time(tmp_path):
    path = _nlq(tmp_path)
    durations = {"vid-a": 2400.0}
    samples = list(read_annotations("ego4d_nlq_video", path, video_root=tmp_path, durations=durations))
    assert all(s.video == str(tmp_path / "vid-a.mp4") and s.duration == 2400.0 for s in samples)
    assert [(s.start, s.end) for s in samples] == [(130.5, 134.0), (150.0, 151.5), (590.0, 600.0), (900.0, 902.0)]
    assert samples[0].source == "ego4d_nlq_video"
    from grounding_rl.data.samples import AnnotationError

    with pytest.raises(AnnotationError, match="no duration for video 'vid-a'"):
        list(read_annotations("ego4d_nlq_video", path, video_root=tmp_path))


def test_ego4d_nlq_reader_names_the_clip_of_a_bad_query(tmp_path):
    from grounding_rl.data.samples import AnnotationError

    path = _nlq(tmp_path)
    data = json.loads(path.read_text())
    data["videos"][0]["clips"][1]["annotations"][0]["language_queries"][0]["clip_end_sec"] = "late"
    path.write_text(json.dumps(data))
    with pytest.raises(AnnotationError, match=r"nlq_val\.json: clip clip-2, annotation 0, query 0: clip_end_sec must "
                                              r"be a number of seconds, got 'late'"):
        list(read_annotations("ego4d_nlq", path))
    path.write_text(json.dumps({"version": "v2"}))
    with pytest.raises(AnnotationError, match="expected Ego4D-NLQ's"):
        list(read_annotations("ego4d_nlq", path))


EWB = [  # the dataset card's example row, and a second query on the same video
    {"qid": "-WnyRMZqV1U_q042", "video_id": "-WnyRMZqV1U", "source_corpus": "VideoMME",
     "question": "When does an elderly woman with round glasses speak into a microphone?",
     "correct_interval": [1805, 1822], "duration_s": 17, "video_duration_s": 4271, "category": "reaction"},
    {"qid": "-WnyRMZqV1U_q043", "video_id": "-WnyRMZqV1U", "source_corpus": "VideoMME", "question": "When is it dark?",
     "correct_interval": [4260, 4300], "duration_s": 40, "video_duration_s": 4271, "category": "scene"},
]


@pytest.mark.parametrize("layout", ["jsonl", "list", "questions"])
def test_extremewhenbench_reader(tmp_path, layout):
    path = tmp_path / ("ewb.jsonl" if layout == "jsonl" else "ewb.json")
    text = {"jsonl": "\n".join(json.dumps(row) for row in EWB) + "\n\n", "list": json.dumps(EWB),
            "questions": json.dumps({"questions": EWB})}[layout]
    path.write_text(text)
    samples = list(read_annotations("extremewhenbench", path, video_root=tmp_path / "videos"))
    assert [s.qid for s in samples] == ["-WnyRMZqV1U_q042", "-WnyRMZqV1U_q043"]
    first = samples[0]
    assert first.video == str(tmp_path / "videos" / "-WnyRMZqV1U.mp4") and first.source == "extremewhenbench"
    assert (first.start, first.end, first.duration) == (1805.0, 1822.0, 4271.0)  # video_duration_s, not duration_s
    kept, counts = validate(samples)
    assert counts == {"kept": 2, "dropped": 0, "clamped": 1} and kept[1].end == 4271.0 and kept[1].raw_end == 4300.0


def test_extremewhenbench_reader_errors_name_the_row(tmp_path):
    from grounding_rl.data.samples import AnnotationError

    path = tmp_path / "ewb.jsonl"
    path.write_text(json.dumps(EWB[0]) + "\n" + json.dumps({**EWB[1], "correct_interval": [1, 2, 3]}) + "\n")
    with pytest.raises(AnnotationError, match=r"ewb\.jsonl:2: a timestamp must be \[start, end\]"):
        list(read_annotations("extremewhenbench", path))
    path.write_text(json.dumps({**EWB[0], "video_duration_s": None}) + "\n")
    with pytest.raises(AnnotationError, match=r"ewb\.jsonl:1: no duration for video '-WnyRMZqV1U'"):
        list(read_annotations("extremewhenbench", path))


# ------------------------------------------------------------------------------------------------ evaluation cost
def test_a_video_with_many_queries_is_decoded_once(monkeypatch):
    """ExtremeWhenBench asks about 12 questions of each video: one decode for all of them, whatever the batch size,
    and every row of the video holds the same clip object (so its rows in a batch share one vision encoding)."""
    from grounding_rl.rollout import greedy as runner

    decoded = []

    def fake_sample_frames(path, settings, cache=None):
        decoded.append(path)
        return object()

    monkeypatch.setattr(runner, "sample_frames", fake_sample_frames)
    videos = ["long.mp4"] * 12 + ["other.mp4"] * 2
    batches = list(runner.clip_batches(runner.group_by_video(videos), VideoSettings(), batch_size=5, num_workers=0))
    assert decoded == ["long.mp4", "other.mp4"]
    assert [len(b) for b in batches] == [5, 5, 4]
    clips = {id(clip) for batch in batches for position, clip, _ in batch if position < 12}
    assert len(clips) == 1 and sorted(p for b in batches for p, _, _ in b) == list(range(14))


# ------------------------------------------------------------------------------------------------ benchmark files
def test_long_video_benchmark_definitions(tmp_path):
    from grounding_rl.eval.benchmarks import anchors_table, load_benchmark

    ego = load_benchmark(REPO_ROOT / "evaluation" / "ego4d_nlq_val.yaml", data_root_dir=str(tmp_path))
    ewb = load_benchmark(REPO_ROOT / "evaluation" / "extremewhenbench.yaml", data_root_dir=str(tmp_path))
    assert (ego.format, ewb.format) == ("ego4d_nlq", "extremewhenbench")
    assert (ego.expected_queries, ewb.expected_queries) == (None, 2273)
    # TimeLens2's Ego4D-NLQ protocol: 2 fps, ≤ 2,048 frames, 1 to 128,000 tokens, ≤ 480x480 px a frame
    video = replace(ego.protocol.video, pixel_factor=32)  # as a Qwen3-VL checkpoint gets it
    assert (video.fps, video.max_frames, video.floor_pixels, video.budget_pixels, video.max_pixels) == (
        2.0, 2048, 1024, 128000 * 1024, 480 * 480)
    assert {a["method"]: a["mIoU"] for a in ego.anchors} == {"TimeLens2-8B (Qwen3-VL-8B)": 19.0}
    # ExtremeWhenBench's reference run: 768 frames over each video (an hour: f = 768 / 3600)
    assert sampling_plan(ewb.protocol.video, 3600.0) == (768, 768 / 3600) and ewb.max_new_tokens == 128
    best = {a["method"]: a["mIoU"] for a in ewb.anchors if a["setting"].startswith("best")}
    assert best == {"Qwen3.5-9B": 11.0, "InternVL3.5-8B": 0.3, "LLaVA-OneVision-7B": 0.3, "LLaVA-NextVideo-7B": 0.1}
    page = (REPO_ROOT / "evaluation" / "anchors.md").read_text()
    assert anchors_table(ego.anchors) in page and anchors_table(ewb.anchors) in page


def test_each_answer_records_the_rate_and_size_of_its_clip(monkeypatch, clip):
    from grounding_rl.reward.records import prediction_record
    from grounding_rl.rollout import greedy as runner

    video = sample_frames(clip, SMALL)
    monkeypatch.setattr(runner, "generate_answers", lambda model, processor, queries, videos, *a, **k:
                        ["<answer>1 to 2</answer>"] * len(queries))
    batch = [(0, video, None), (1, None, "x.mp4: no such video file"), (2, video, None)]
    rows = runner.answer_batch(None, None, batch, ["a", "b", "c"], "default", runner.SamplingParams.greedy(8))
    assert [(p, e is None, s) for p, _, e, s in rows] == [(0, True, video.sampling()), (1, False, None),
                                                          (2, True, video.sampling())]
    record = prediction_record(Sample("v.mp4", "a", 1.0, 2.0, 8.0, "q", "jsonl"), rows[0][1], None, rows[0][3])
    assert record["sampling"] == {"fps": 2.0, "frames": 16, "height": 56, "width": 56} and record["iou"] == 1.0
    assert "sampling" not in prediction_record(Sample("v.mp4", "a", 1.0, 2.0, 8.0, "q", "jsonl"), None, "broken")


def test_fits_answers_for_a_16k_token_video_prompt(shared, capsys):
    from grounding_rl.cli import main

    zero3 = REPO_ROOT / "configs" / "accelerate" / "zero3.yaml"
    assert main(["fits", "configs/qwen3_vl_8b_charades_timelens.yaml", "--gpus", "8", "--accelerate-config",
                 str(zero3), "--video-tokens", "16384", "--video-seconds", "3600", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # after DeepSpeed's first-import notice
    work, video = report["workload"], report["video"]
    # the recipe takes 448 frames (224 pairs) of the hour: their <t seconds> are 1,947 tokens of text
    assert (video["frames"], work["video_tokens"], work["time_tokens"]) == (448, 16384, 1947)
    assert work["prompt_tokens"] == 16384 + 1947 + 300 and report["prompt_refused"]  # max_prompt_length 18,432
    (row,) = report["strategies"]
    assert row["name"] == "zero3" and row["bytes"]["total"] > 0


def test_eval_and_infer_flags_carry_the_long_video_overrides():
    from grounding_rl.cli.eval import build_parser
    from grounding_rl.eval.settings import PreprocessingOverrides

    args = build_parser().parse_args(["--model", "m", "--data", "d.jsonl", "--out", "o", "--video-total-tokens",
                                      "16384", "--video-min-tokens", "1", "--video-cover-tail",
                                      "--no-video-budget-lowers-fps"])
    video = PreprocessingOverrides.from_args(args).video()
    assert (video["total_tokens"], video["min_tokens"], video["cover_tail"], video["budget_lowers_fps"]) == (
        16384, 1, True, False)
    from grounding_rl.errors import UserError

    with pytest.raises(UserError, match="--video-total-tokens must be > 0"):
        PreprocessingOverrides(total_tokens=0).check()
