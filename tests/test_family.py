"""The model families: which family a checkpoint is, Qwen3-VL's textual timestamps through the real processor, and
its prompt layout (the release's, transformers 4.57, by default) with the 3-D position ids that follow it.

Qwen3-VL's processor writes ``<t seconds>`` before each temporal pair of frames from the ``video_metadata`` it is
given (transformers 5.24 ``Qwen3VLProcessor._calculate_timestamps``). Every printed time must be the mean *true* time
of its pair — the decoded frame's presentation time (PyAV, display order) minus the first frame's — to the printed
precision, on every shared clip at 1, 2 and 4 fps, and when ``max_frames`` stretches the time scale.
"""
import re

import av
import pytest
import torch

from grounding_rl.data.video import VideoSettings, sample_frames
from grounding_rl.family import family_of, family_of_checkpoint
from grounding_rl.family.qwen2_5_vl import QWEN2_5_VL
from grounding_rl.family.qwen3_vl import QWEN3_VL
from grounding_rl.models.loading import load_policy, load_processor
from grounding_rl.models.vision import rope_position_ids
from grounding_rl.prompts.preprocessing import build_inputs
from grounding_rl.prompts.templates import render_prompt

torch.set_num_threads(1)

CLIPS = ["charades_OHOFG.mp4", "decord_flipping_a_pancake.mkv", "mmaction2_basketball_drill.mp4",
         "mmaction2_eye_makeup.avi", "mmaction2_kinetics_arm_wrestling.mp4", "mmaction2_pool_cleaning.mp4"]
SMALL = dict(min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 4)  # 64x64 frames: the times, not the pixels, are tested
STAMP = re.compile(r"<(\d+\.\d) seconds>")


@pytest.fixture(scope="module")
def qwen3_processor(qwen3_processor_dir):
    return load_processor(str(qwen3_processor_dir))


@pytest.fixture(scope="module")
def true_times(videos_dir):
    """Per clip: every decoded frame's presentation time in seconds (PyAV, sorted = display order) minus the first."""
    out = {}
    for name in CLIPS:
        with av.open(str(videos_dir / name)) as container:
            times = sorted(frame.time for frame in container.decode(container.streams.video[0]))
        out[name] = [t - times[0] for t in times]
    return out


def _printed(processor, video):
    ids = build_inputs(processor, ["a person does something."], [video])["input_ids"][0]
    return [float(s) for s in STAMP.findall(processor.tokenizer.decode(ids))]


def _assert_exact(printed, video, times, where):
    pairs = [(video.frame_indices[k], video.frame_indices[k + 1]) for k in range(0, video.num_frames, 2)]
    assert len(printed) == len(pairs) == video.num_frames // 2, where
    for g, ((a, b), shown) in enumerate(zip(pairs, printed)):
        mean = (times[a] + times[b]) / 2
        assert abs(shown - mean) <= 0.05 + 1e-6, (where, g, shown, mean)
        if abs(abs(mean * 10 % 1) - 0.5) > 1e-6:  # not a rounding tie: the very digit
            assert shown == float(f"{mean:.1f}"), (where, g, shown, mean)


def test_family_from_model_type_config_and_processor(qwen_processor_dir, qwen3_processor_dir, bpe_tiny_model_dir):
    assert family_of("qwen2_5_vl") is QWEN2_5_VL
    assert family_of("qwen3_vl") is family_of("qwen3_vl_moe") is QWEN3_VL
    assert family_of_checkpoint(qwen3_processor_dir) is QWEN3_VL
    assert family_of_checkpoint(bpe_tiny_model_dir) is QWEN2_5_VL
    assert family_of(load_processor(str(qwen3_processor_dir))) is QWEN3_VL
    assert family_of(load_processor(str(qwen_processor_dir))) is QWEN2_5_VL
    assert (QWEN2_5_VL.pixel_factor, QWEN3_VL.pixel_factor) == (28, 32)
    assert QWEN3_VL.video_settings(VideoSettings()).pixel_factor == 32
    with pytest.raises(ValueError, match="llava.*supported: qwen2_5_vl, qwen3_vl, qwen3_vl_moe"):
        family_of("llava")


@pytest.mark.parametrize("fps", [1.0, 2.0, 4.0])
def test_every_timestamp_is_the_mean_true_time_of_its_pair(videos_dir, qwen3_processor, true_times, fps):
    settings = QWEN3_VL.video_settings(VideoSettings(fps=fps, **SMALL))
    for name in CLIPS:
        video = sample_frames(videos_dir / name, settings)
        assert video.frames.shape[1] % 32 == 0 and video.frames.shape[2] % 32 == 0
        printed = _printed(qwen3_processor, video)
        _assert_exact(printed, video, true_times[name], (name, fps))
        assert printed[0] == float(f"{true_times[name][video.frame_indices[1]] / 2:.1f}")


def test_timestamps_stay_true_when_max_frames_stretches_the_time_scale(videos_dir, qwen3_processor, true_times):
    name = "charades_OHOFG.mp4"  # 35.1 s at 9.53 fps: 2 fps wants 70 frames, max_frames keeps 16
    video = sample_frames(videos_dir / name, QWEN3_VL.video_settings(VideoSettings(fps=2.0, max_frames=16, **SMALL)))
    assert video.num_frames == 16 and video.sampled_fps == pytest.approx(16 / video.duration)
    printed = _printed(qwen3_processor, video)
    _assert_exact(printed, video, true_times[name], name)
    assert printed[-1] > 30.0  # the clip is covered to its end, not cut at 8 s (16 frames at 2 fps)


def test_wrong_metadata_would_print_wrong_times(videos_dir, qwen3_processor, true_times):
    """The check has teeth: nominal times k / f (metadata range(T) at the sampled fps) miss the odd-fps clip's."""
    from transformers.video_utils import VideoMetadata

    name = "charades_OHOFG.mp4"
    video = sample_frames(videos_dir / name, QWEN3_VL.video_settings(VideoSettings(fps=2.0, **SMALL)))
    text = qwen3_processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "x"}]}], add_generation_prompt=True)
    nominal = VideoMetadata(total_num_frames=video.num_frames, fps=video.sampled_fps,
                            frames_indices=list(range(video.num_frames)))
    ids = qwen3_processor(text=[text], videos=[video.frames], video_metadata=[nominal],
                          **QWEN3_VL.processor_kwargs())["input_ids"][0]
    wrong = [float(s) for s in STAMP.findall(qwen3_processor.tokenizer.decode(ids))]
    with pytest.raises(AssertionError):
        _assert_exact(wrong, video, true_times[name], name)


def test_qwen3_prompt_ids_and_positions_built_by_hand(videos_dir, tiny_qwen3_model_dir):
    """A clip of three temporal groups (6 frames at 1 fps, at 0, 1, …, 5 s), its prompt ids written out by hand from
    the chat template's text: ``released`` (the default) is transformers 4.57's layout, the groups
    ``<t seconds><|vision_start|><|video_pad|>×2<|vision_end|>`` alone; ``transformers5`` the same inside the template's
    ``<|vision_start|>`` … ``<|vision_end|>``. build_inputs gives exactly these ids, and the 3-D position ids follow
    the layout: each text token one step, each frame's 1×2 merged patches at T = H = p, W = p, p + 1, the next token at
    p + 2 (get_rope_index from mm_token_type_ids). No second_per_grid_ts (time is in the text)."""
    processor = load_processor(str(tiny_qwen3_model_dir))
    model = load_policy(str(tiny_qwen3_model_dir))
    tok = processor.tokenizer
    video = sample_frames(videos_dir / "mmaction2_eye_makeup.avi",
                          QWEN3_VL.video_settings(VideoSettings(fps=1.0, **SMALL)))
    assert video.timestamps == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], abs=1e-6)
    start, pad, end = (tok.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|video_pad|>", "<|vision_end|>"))
    before, after = render_prompt(processor, "q", "default").split("<|vision_start|><|video_pad|><|vision_end|>")

    def encode(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    groups = []
    for seconds in ("0.5", "2.5", "4.5"):  # the mean time of each pair of frames
        groups += encode(f"<{seconds} seconds>") + [start, pad, pad, end]
    lengths = {}
    for layout, kwargs in (("released", {}), ("transformers5", {"video_layout": "transformers5"})):
        features = build_inputs(processor, ["q"], [video], **kwargs)
        assert "second_per_grid_ts" not in features
        assert features["video_grid_thw"].tolist() == [[3, 2, 4]]  # 3 groups of 2×4 patches: 1×2 merged
        want = encode(before) + (groups if layout == "released" else [start] + groups + [end]) + encode(after)
        ids = features["input_ids"][0]
        assert ids.tolist() == want, (layout, tok.decode(ids))
        assert torch.equal(features["mm_token_type_ids"][0] == 2, ids == pad)
        expected, p, i = [], 0, 0
        while i < len(want):
            if want[i] == pad:  # one frame: 1 × 2 merged patches
                expected += [[p, p, p], [p, p, p + 1]]
                p, i = p + 2, i + 2
            else:
                expected.append([p, p, p])
                p, i = p + 1, i + 1
        assert rope_position_ids(model, features)[:, 0].T.tolist() == expected, layout
        lengths[layout] = len(want)
    assert lengths["transformers5"] == lengths["released"] + 2
    transformers5 = build_inputs(processor, ["q"], [video], video_layout="transformers5")["input_ids"]
    with pytest.raises(RuntimeError, match="inside an outer .*not in video_layout 'released'"):
        QWEN3_VL.check_video_layout(processor, transformers5, "released")
    with pytest.raises(ValueError, match="unknown video_layout 'outer'"):
        build_inputs(processor, ["q"], [video], video_layout="outer")
