"""Processor round trip with the real Qwen2.5-VL processor files, and grounding_config.json."""
import json

import pytest
import torch

from grounding_rl.data.video import VideoSettings, sample_frames
from grounding_rl.family.qwen2_5_vl import QWEN2_5_VL
from grounding_rl.prompts.preprocessing import CONFIG_NAME, GroundingConfig, build_inputs

torch.set_num_threads(1)

VIDEO_PAD_ID = 151656  # <|video_pad|> in the Qwen2.5-VL tokenizer
SMALL = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)  # few tokens per frame: a fast processor call


@pytest.fixture(scope="module")
def processor(qwen_processor_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(qwen_processor_dir)


@pytest.fixture(scope="module")
def clips(videos_dir):
    """The 6.56 s avi sampled at 1, 2 and 4 fps (T = 6, 12, 26)."""
    path = videos_dir / "mmaction2_eye_makeup.avi"
    return {fps: sample_frames(path, VideoSettings(fps=fps, **SMALL)) for fps in (1.0, 2.0, 4.0)}


def test_round_trip_second_per_grid_and_token_count(processor, clips):
    videos = [clips[2.0], clips[1.0], clips[4.0]]
    assert [v.num_frames for v in videos] == [12, 6, 26]
    batch = build_inputs(processor, ["a woman applies eye makeup.", "makeup", "eyes"], videos)

    # second_per_grid_ts = temporal_patch_size / sampled fps: never the processor's 24-fps fallback (0.083)
    assert batch["second_per_grid_ts"].tolist() == pytest.approx([1.0, 2.0, 0.5])
    grids = batch["video_grid_thw"].tolist()
    for video, (t, h, w), row, mask in zip(videos, grids, batch["input_ids"], batch["attention_mask"]):
        frames_t, frames_h, frames_w, _ = video.frames.shape
        assert (t, h, w) == (frames_t // 2, frames_h // 14, frames_w // 14)  # no second resize by the processor
        expected_tokens = frames_t // 2 * (frames_h // 28) * (frames_w // 28)
        assert int((row == VIDEO_PAD_ID).sum()) == expected_tokens
        assert mask[-1] == 1  # left padding: every row ends with a real token
    assert batch["attention_mask"][:, 0].tolist().count(0) == 2  # the two shorter rows are padded on the left
    patches = sum(t * h * w for t, h, w in grids)
    assert tuple(batch["pixel_values_videos"].shape) == (patches, 3 * 2 * 14 * 14)
    assert batch["mm_token_type_ids"].shape == batch["input_ids"].shape


def test_video_metadata_describes_the_sampled_clip(clips):
    meta = QWEN2_5_VL.video_metadata(clips[4.0])
    assert meta.fps == 4.0 and meta.total_num_frames == 26 and list(meta.frames_indices) == list(range(26))


def test_length_mismatch_is_an_error(processor, clips):
    with pytest.raises(ValueError, match="2 queries but 1 videos"):
        build_inputs(processor, ["a", "b"], [clips[2.0]])


def test_grounding_config_round_trip(tmp_path):
    config = GroundingConfig(
        prompt_template="timezero",
        video=VideoSettings(fps=2.0, min_pixels=16 * 28 * 28, total_pixels=3584 * 28 * 28, max_frames=128,
                            sampler="qwen_vl_utils"),
        reward_funcs=["iou", "format"],
        reward_weights=[5.0, 1.0],
        video_layout="transformers5",
    )
    path = config.save(tmp_path / "ckpt")
    assert path == tmp_path / "ckpt" / CONFIG_NAME
    loaded = GroundingConfig.load(tmp_path / "ckpt")
    assert loaded == config and loaded.video.total_pixels == 3584 * 28 * 28 and loaded.reward_weights == [5.0, 1.0]
    assert json.loads(path.read_text())["video"]["sampler"] == "qwen_vl_utils" == loaded.video.sampler
    old = json.loads(path.read_text())
    del old["video"]["sampler"]  # a checkpoint saved before the knob existed: the exact sampler
    assert GroundingConfig.from_dict(old).video.sampler == "exact"
    assert GroundingConfig.load(tmp_path / "ckpt").video_layout == "transformers5"
    del old["video_layout"]  # saved before the layout was a choice: the release's layout
    assert GroundingConfig.from_dict(old).video_layout == "released" == GroundingConfig().video_layout
    assert GroundingConfig.load(tmp_path / "nothing_here") is None
    path.write_text("{not json")
    with pytest.raises(ValueError, match=CONFIG_NAME):
        GroundingConfig.load(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="unknown prompt_template"):
        GroundingConfig(prompt_template="nope")
    with pytest.raises(ValueError, match="unknown video_layout 'outer'"):
        GroundingConfig(video_layout="outer")


def _changed(setting) -> dict:
    """A value of ``setting`` other than its default, as keywords of GroundingConfig or VideoSettings (with the
    token budget that a setting needing one, budget_lowers_fps, is refused without)."""
    default, choices = setting.field.default, setting.field.metadata.get("choices")
    if setting.type is bool:
        value = not default
    elif setting.type is str:
        value = next(c for c in (choices or ("timezero",)) if c != default)
    else:
        value = setting.type(default * 2 if default else 8)
    if setting.key == setting.name:  # a GroundingConfig field
        return {setting.name: value}
    try:
        VideoSettings(**{setting.name: value})
        return {setting.name: value}
    except ValueError:
        return {setting.name: value, "total_tokens": 8}


def test_each_saved_setting_is_declared_once_and_reaches_every_command(tmp_path):
    """Every setting grounding_config.json records (prompt_template, video_layout, each VideoSettings field with a
    help) is a training key (video_<name>) with its default and help, a flag of eval, infer and difficulty
    (--video-<name>, None = keep) that reaches PreprocessingOverrides, and round-trips through grounding_config.json
    and the overrides: adding a setting is one field."""
    import dataclasses

    from grounding_rl.cli import difficulty, eval as eval_cli, infer
    from grounding_rl.eval.settings import PreprocessingOverrides, resolve_config
    from grounding_rl.prompts.preprocessing import PreprocessingArguments, saved_settings

    settings = saved_settings()
    train = {f.name: f for f in dataclasses.fields(PreprocessingArguments)}
    parsers = {eval_cli.build_parser(): ["--model", "m", "--data", "d", "--out", "o"],
               difficulty.build_parser(): ["--model", "m", "--data", "d", "--out", "o"],
               infer.build_parser(): ["--model", "m", "--video", "v", "--query", "q"]}
    assert {s.key for s in settings} == set(train) - {"max_prompt_length"}
    assert {s.name for s in settings} == {f.name for f in dataclasses.fields(PreprocessingOverrides)}
    for setting in settings:
        changed = _changed(setting)
        value = changed[setting.name]
        key = train[setting.key]
        assert (key.default, key.metadata["help"]) == (setting.field.default, setting.field.metadata["help"])
        flag = "--" + setting.key.replace("_", "-")
        for parser, required in parsers.items():
            args = parser.parse_args(required + ([flag] if value is True else [flag, str(value)]))
            given = dataclasses.asdict(PreprocessingOverrides.from_args(args))
            assert {k: v for k, v in given.items() if v is not None} == {setting.name: value}, (parser.prog, flag)
        if setting.key == setting.name:
            saved, arguments = GroundingConfig(**changed), PreprocessingArguments(**changed)
            assert getattr(arguments, setting.key) == value
        else:
            saved = GroundingConfig(video=VideoSettings(**changed))
            arguments = PreprocessingArguments(**{"video_" + k: v for k, v in changed.items()})
            assert arguments.video_settings == saved.video
        saved.save(tmp_path / setting.key)
        assert resolve_config(tmp_path / setting.key)[0] == saved  # written, read back
        overridden = resolve_config(tmp_path / "none", PreprocessingOverrides(**changed))[0]
        assert overridden == dataclasses.replace(GroundingConfig(), **{k: v for k, v in changed.items()
                                                                       if k not in VideoSettings.__dataclass_fields__},
                                                 video=saved.video), setting.key
    older = ["--fps", "1", "--min-pixels", "2", "--max-pixels", "3", "--total-pixels", "4", "--max-frames", "5",
             "--no-video-cover-tail"]  # today's spellings, aliases
    args = eval_cli.build_parser().parse_args(parsers[next(iter(parsers))] + older)
    assert {k: v for k, v in PreprocessingOverrides.from_args(args).video().items() if v is not None} == {
        "fps": 1.0, "min_pixels": 2, "max_pixels": 3, "total_pixels": 4, "max_frames": 5, "cover_tail": False}


def test_each_answering_mode_setting_is_declared_once_and_reaches_every_command():
    """The zoom's knobs (ZoomSettings) and the crop-call limit (ToolSettings) are each one field: the flag of eval and
    infer (--max-turns an alias; none on difficulty) with its help, default and choices, train's key (zoom_margin,
    zoom_spend, max_tool_calling_iterations) and sft's (max_tool_calling_iterations) with its help and default, and
    one check that each command reports under its own name."""
    import dataclasses
    import re

    from grounding_rl.cli import difficulty, eval as eval_cli, infer
    from grounding_rl.errors import UserError
    from grounding_rl.eval.turns import check_turns_run
    from grounding_rl.paths import REPO_ROOT
    from grounding_rl.prompts.preprocessing import settings_of
    from grounding_rl.rollout.tools import ToolSettings
    from grounding_rl.rollout.zoom import ZoomSettings
    from grounding_rl.update.recipes.crop_tool import CropTool, CropToolArguments
    from grounding_rl.update.recipes.two_pass_zoom import TwoPassZoom, TwoPassZoomArguments
    from grounding_rl.update.sft import GroundingSFTConfig

    train = {f.name: f for cls in (TwoPassZoomArguments, CropToolArguments) for f in dataclasses.fields(cls)}
    sft = {f.name: f for f in dataclasses.fields(GroundingSFTConfig)}
    takes = {"zoom_margin": (train,), "zoom_spend": (train,), "zoom_time": (),
             "max_tool_calling_iterations": (train, sft)}
    settings = settings_of(ZoomSettings, "zoom_") + settings_of(ToolSettings)
    assert [s.key for s in settings] == list(takes)
    parsers = {eval_cli.build_parser(): ["--model", "m", "--data", "d", "--out", "o"],
               infer.build_parser(): ["--model", "m", "--video", "v", "--query", "q"]}
    for setting in settings:
        declared = (setting.field.default, setting.field.metadata["help"])
        assert all((fields[setting.key].default, fields[setting.key].metadata["help"]) == declared
                   for fields in takes[setting.key]), setting.key
        for parser in parsers:
            action = next(a for a in parser._actions if a.dest == setting.key)
            assert (action.default, action.help, action.choices) == (*declared, setting.field.metadata.get("choices"))
    assert not {a.dest for a in difficulty.build_parser()._actions} & set(takes)
    given = ["--zoom", "--zoom-margin", "0.5", "--zoom-spend", "resolution", "--zoom-time", "video", "--max-turns", "3"]
    for parser, required in parsers.items():
        args = parser.parse_args(required + given)
        assert eval_cli.zoom_from_args(args) == ZoomSettings(0.5, "resolution", "video")
        assert args.max_tool_calling_iterations == 3
    for extra, turns in (([], 0), (["--max-tool-calling-iterations", "2"], 2)):
        request = eval_cli.request_from_args(eval_cli.build_parser().parse_args(list(parsers.values())[0] + extra))
        assert (request.max_turns, request.zoom) == (turns, None)
    # one declaration in the package; the checks written once, each command naming the setting its own way
    sources = "".join(p.read_text() for p in (REPO_ROOT / "grounding_rl").rglob("*.py"))
    for name in ("margin", "spend", "time", "max_tool_calling_iterations", "zoom_margin", "zoom_spend"):
        assert len(re.findall(rf"^\s+{name}: [\w |]+ = ", sources, re.M)) == (name in ("margin", "spend", "time",
                                                                                       "max_tool_calling_iterations"))
    assert not re.search(r'add_argument\("--(zoom-|max-t)', sources)
    for kwargs, message in (({"margin": -1}, "--zoom-margin must be ≥ 0 (got -1)"),
                            ({"spend": "x"}, "--zoom-spend must be one of fps, resolution (got 'x')")):
        with pytest.raises(UserError, match=re.escape(message)):
            ZoomSettings(**kwargs)
    with pytest.raises(UserError, match=re.escape("--max-tool-calling-iterations must be ≥ 0 (got -1)")):
        check_turns_run(-1, False, "exact", "default")
    assert TwoPassZoom.problems(TwoPassZoomArguments(zoom_margin=-1, zoom_spend="x"), None) == [
        "zoom_margin must be ≥ 0 (got -1)", "zoom_spend must be one of fps, resolution (got 'x')"]
    assert CropTool.problems(CropToolArguments(max_tool_calling_iterations=-1), None) == [
        "max_tool_calling_iterations must be ≥ 0 (got -1)"]


def test_a_prompt_longer_than_max_prompt_length_is_the_users_one_line():
    """The settings' mistake is a UserError (one line, exit 2; it was a traceback, exit 1, after the model loaded) and
    still a ValueError where the multi-turn rollout catches one."""
    from grounding_rl.errors import UserError, user_message
    from grounding_rl.prompts.preprocessing import check_prompt_length

    check_prompt_length(4096, 4096, "sample 3")  # at the limit: fine
    with pytest.raises(UserError) as caught:
        check_prompt_length(5000, 4096, "sample 3 (qid x, a.mp4)")
    assert isinstance(caught.value, ValueError)
    assert user_message(caught.value).startswith("sample 3 (qid x, a.mp4): prompt is 5000 tokens, more than "
                                                 "max_prompt_length 4096; prompts are never truncated")
