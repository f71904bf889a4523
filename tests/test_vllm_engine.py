"""The vLLM engine's model-free parts, which run without vllm: what vLLM is given (prompt ids with the placeholder
collapsed, clip metadata, sampling settings), transformers' M-RoPE rule, the vLLM config knobs and the engine choice.
vLLM itself is checked against transformers in tests/test_vllm_cpu.py (.venv-vllm)."""
import pytest
import torch

from grounding_rl.data.video import VideoSettings, sample_frames
from grounding_rl.family import family_of
from grounding_rl.family.qwen2_5_vl import QWEN2_5_VL, transformers_mrope_positions
from grounding_rl.family.qwen3_vl import QWEN3_VL
from grounding_rl.models.loading import load_policy, load_processor
from grounding_rl.models.vision import rope_position_ids
from grounding_rl.prompts.preprocessing import build_inputs
from grounding_rl.prompts.templates import render_prompt
from grounding_rl.rollout.generation import HFGenerateEngine, SamplingParams
from grounding_rl.rollout.vllm import sampling_kwargs, vllm_prompts, vllm_video
from grounding_rl.update.engines import make_rollout_engine

QUERY = "person opens the door."


def test_collapse_video_of_either_family_and_layout_and_errors():
    assert QWEN2_5_VL.collapse_video([1, 7, 9, 9, 9, 8, 2], video_id=9, start_id=7, end_id=8) == [1, 7, 9, 8, 2]
    stamp = {(5, 6): "<0.5 seconds>"}  # ids 5, 6: a timestamp

    def decode(ids):
        return stamp.get(tuple(ids), "x")

    # Qwen3-VL's groups, released layout (nothing around them) and transformers5's (the template's pair kept)
    assert QWEN3_VL.collapse_video([1, 5, 6, 7, 9, 9, 8, 5, 6, 7, 9, 9, 8, 2], 9, 7, 8, decode) == [1, 9, 2]
    assert QWEN3_VL.collapse_video([1, 7, 5, 6, 7, 9, 9, 8, 5, 6, 7, 9, 9, 8, 8, 2], 9, 7, 8, decode) == [1, 7, 9, 8, 2]
    for family in (QWEN2_5_VL, QWEN3_VL):
        assert family.collapse_video([1, 2, 3], video_id=9, start_id=7, end_id=8) == [1, 2, 3]
        with pytest.raises(ValueError, match="enclosed"):
            family.collapse_video([1, 9, 9, 8], video_id=9, start_id=7, end_id=8)
    with pytest.raises(ValueError, match="timestamp"):
        QWEN3_VL.collapse_video([1, 7, 9, 5, 7, 9, 8], video_id=9, start_id=7, end_id=8, decode=lambda ids: "x")
    with pytest.raises(ValueError, match="Qwen2.5-VL"):  # a Qwen3-VL expansion is not Qwen2.5-VL's
        QWEN2_5_VL.collapse_video([1, 5, 6, 7, 9, 9, 8, 5, 6, 7, 9, 9, 8, 2], 9, 7, 8, decode)


@pytest.fixture(scope="module")
def clip_of(videos_dir):
    def sample(family):
        settings = VideoSettings(fps=2.0, min_pixels=4 * 28 * 28, max_pixels=4 * 28 * 28, max_frames=12)
        return sample_frames(videos_dir / "charades_OHOFG.mp4", family.video_settings(settings))
    return sample


@pytest.mark.parametrize("layout", ["released", "transformers5"])
def test_vllm_prompt_is_the_unexpanded_prompt_of_either_family(family_model_dir, clip_of, layout):
    """Collapsing the processor's expanded ids gives the tokenized chat-template text with the video as one
    ``<|video_pad|>`` (what vLLM expands itself), for Qwen2.5-VL's run of video tokens and Qwen3-VL's timestamped
    groups alike, in either video layout (Qwen3-VL released: no <|vision_start|> … <|vision_end|> around it)."""
    processor = load_processor(str(family_model_dir))
    family = family_of(processor)
    clip = clip_of(family)
    inputs = build_inputs(processor, [QUERY, QUERY + " again"], [clip, clip], "default", video_layout=layout)
    tok = processor.tokenizer
    ids = {k: tok.convert_tokens_to_ids(t) for k, t in (("video_token_id", "<|video_pad|>"),
                                                         ("vision_start_token_id", "<|vision_start|>"),
                                                         ("vision_end_token_id", "<|vision_end|>"))}
    prompts, expanded = vllm_prompts(inputs, [clip, clip], family, ids,
                                     decode=lambda x: tok.decode(x, skip_special_tokens=False))
    for row, query in enumerate([QUERY, QUERY + " again"]):
        text = render_prompt(processor, query, "default")
        if family.name == "qwen3_vl" and layout == "released":
            text = text.replace("<|vision_start|><|video_pad|><|vision_end|>", "<|video_pad|>")
        want = tok(text)["input_ids"]
        assert prompts[row]["prompt_token_ids"] == want
        assert expanded[row] == inputs["input_ids"][row][inputs["attention_mask"][row].bool()].tolist()
        assert len(expanded[row]) > len(want) + 5  # the video tokens (and Qwen3-VL's timestamps) were collapsed
        assert prompts[row]["mm_processor_kwargs"]["do_sample_frames"] is False
    assert prompts[0]["multi_modal_data"]["video"][0] is clip.frames


def test_vllm_video_metadata_gives_the_sampled_rate(clip_of, tiny_model_dir):
    family = family_of(load_processor(str(tiny_model_dir)))
    clip = clip_of(family)
    frames, meta = vllm_video(clip, family)
    assert frames.shape[0] == clip.num_frames == 12
    assert meta["frames_indices"] == list(range(12)) and meta["total_num_frames"] == 12
    # vLLM's Qwen2.5-VL rate len(frames_indices) / total_num_frames · fps is the sampled rate itself
    assert len(meta["frames_indices"]) / meta["total_num_frames"] * meta["fps"] == pytest.approx(clip.sampled_fps)
    assert meta["duration"] == pytest.approx(12 / clip.sampled_fps)
    assert meta["do_sample_frames"] is False


def test_transformers_mrope_rule_equals_get_rope_index(tiny_model_dir, clip_of):
    """The rule vLLM is given reproduces transformers' position ids of a Qwen2.5-VL prompt whose temporal ids run past
    its spatial extent (12 frames: 6 temporal groups 2 s apart, 2×2 merged patches)."""
    model = load_policy(str(tiny_model_dir)).eval()
    processor = load_processor(str(tiny_model_dir))
    clip = clip_of(family_of(model))
    inputs = build_inputs(processor, [QUERY], [clip], "default")
    hf = rope_position_ids(model, inputs)[:, 0]
    row = inputs["input_ids"][0].tolist()
    video = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    t, h, w = inputs["video_grid_thw"][0].tolist()
    interval = float(inputs["second_per_grid_ts"][0]) * model.config.vision_config.tokens_per_second
    positions, delta = transformers_mrope_positions([(row.index(video), t, h // 2, w // 2, interval)], len(row))
    assert torch.equal(positions, hf)
    assert int(hf[0].max()) > int(hf[1].max())  # temporal past spatial: the case vLLM's own rule gets wrong
    assert delta == int(hf[0, -1]) + 1 - len(row)


def test_transformers_mrope_rule_worked_example():
    positions, delta = transformers_mrope_positions([(2, 2, 1, 2, 2.0)], 7)
    assert positions.tolist() == [[0, 1, 2, 2, 4, 4, 4], [0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 3, 2, 3, 4]]
    assert delta == -2


def test_sampling_kwargs():
    assert sampling_kwargs(SamplingParams.greedy(8)) == dict(max_tokens=8, logprobs=0, detokenize=False, n=1,
                                                             temperature=0.0, top_p=1.0, top_k=0,
                                                             repetition_penalty=1.0)
    sampled = sampling_kwargs(SamplingParams(16, temperature=0.7, top_p=0.9, top_k=0, repetition_penalty=1.1))
    assert (sampled["temperature"], sampled["top_p"], sampled["top_k"], sampled["repetition_penalty"]) == (
        0.7, 0.9, 0, 1.1)


def test_vllm_config_knobs_and_engine_choice(tmp_path):
    from grounding_rl.update.config import GroundingGRPOConfig

    common = dict(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, report_to=[])
    args = GroundingGRPOConfig.build(**common)
    correction = args.recipe_args["vllm_importance_sampling"]
    assert (args.use_vllm, args.vllm_mode, correction.vllm_importance_sampling_mode,
            correction.vllm_importance_sampling_clip_max, correction.vllm_importance_sampling_clip_min) == (
        False, "colocate", "sequence_mask", 3.0, None)
    assert (args.vllm_gpu_memory_utilization, args.vllm_tensor_parallel_size, args.vllm_enable_sleep_mode) == (
        0.3, 1, False)
    with pytest.raises(ValueError, match="only 'colocate'"):
        GroundingGRPOConfig(**common, use_vllm=True, vllm_mode="server")
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode"):
        GroundingGRPOConfig.build(**common, use_vllm=True, vllm_importance_sampling_mode="sequence")
    assert isinstance(make_rollout_engine(args, None, None, None), HFGenerateEngine)


class RecordingEngine:
    """A rollout engine that answers a fixed text and records what it was given."""

    logps_need_correcting = False

    def __init__(self, ids):
        self.ids, self.seen = ids, None

    def generate(self, model, inputs, params):
        self.seen = (model, inputs, params)
        return torch.tensor([self.ids] * inputs["input_ids"].shape[0])


def test_eval_and_infer_decode_through_another_engine(tiny_model_dir, clip_of):
    """``generate_answers(..., engine=)`` (eval / infer --engine vllm) hands the engine the processor's prompt rows and
    each row's clip, no HF model, and decodes what it returns."""
    from grounding_rl.rollout.generation import generate_answers

    processor = load_processor(str(tiny_model_dir))
    clip = clip_of(family_of(processor))
    answer = "<answer>1.0 to 2.0</answer>"
    engine = RecordingEngine(processor.tokenizer(answer)["input_ids"])
    out = generate_answers(None, processor, [QUERY, QUERY + " again"], [clip, clip], "default",
                           SamplingParams.greedy(8), engine=engine)
    assert out == [answer, answer]
    model, inputs, params = engine.seen
    assert model is None and params.do_sample is False
    assert inputs["clips"] == [clip, clip] and "video_index" not in inputs
    assert inputs["input_ids"].shape[0] == 2


def test_generation_inputs_carry_each_rows_clip():
    from grounding_rl.update.batching import generation_inputs

    batch = {"prompt_ids": torch.ones(2, 3, dtype=torch.long), "prompt_mask": torch.ones(2, 3, dtype=torch.long)}
    items = [{"clip": "a"}, {"clip": "b"}]
    assert generation_inputs(batch, items)["clips"] == ["a", "b"]
    assert "clips" not in generation_inputs(batch)


@pytest.mark.parametrize("layout", ["released", "transformers5"])
def test_vllm_conversation_prompt_is_the_hf_loops_turn_with_every_video(family_model_dir, clip_of, layout):
    """The vLLM prompt of a conversation's second model turn (after a crop of 4-12 s): the ids the HF loop generates
    from, each video collapsed on its own — the chat template's text of the whole conversation so far with one
    ``<|video_pad|>`` per video — and the clip then the window, each with its own frames and sampled-rate metadata."""
    from grounding_rl.rollout import conversation as conv
    from grounding_rl.rollout import tools
    from grounding_rl.rollout.vllm import conversation_prompt

    processor = load_processor(str(family_model_dir))
    family = family_of(processor)
    clip = clip_of(family)
    tok = processor.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    crop = '<tool_call>{"name": "crop", "arguments": {"start": 4, "end": 12}}</tool_call>'
    t = conv.start(processor, family, QUERY, clip, "default", 2, layout)
    environment = tools.CropEnvironment(family.video_settings(VideoSettings(fps=2.0, min_pixels=4 * 28 * 28,
                                                                            max_pixels=4 * 28 * 28, max_frames=12)))
    conv.step(t, tok(crop, add_special_tokens=False)["input_ids"] + [end], processor, family, environment,
              max_turns=2, end_ids=[end], layout=layout)
    assert not t.done and t.windows == [(4.0, 12.0)]
    ids = {k: tok.convert_tokens_to_ids(v) for k, v in (("video_token_id", "<|video_pad|>"),
                                                         ("vision_start_token_id", "<|vision_start|>"),
                                                         ("vision_end_token_id", "<|vision_end|>"))}
    prompt, expanded = conversation_prompt(t, family, ids, decode=lambda x: tok.decode(x, skip_special_tokens=False))
    assert expanded == t.prompt_ids + t.completion_ids
    text = tools.render(processor, t.messages, t.protocol, True)  # the template's conversation, one pad per video
    if family.name == "qwen3_vl" and layout == "released":
        text = text.replace("<|vision_start|><|video_pad|><|vision_end|>", "<|video_pad|>")
    assert prompt["prompt_token_ids"] == tok(text)["input_ids"]
    assert prompt["prompt_token_ids"].count(ids["video_token_id"]) == 2
    (clip_frames, clip_meta), (window_frames, window_meta) = prompt["multi_modal_data"]["video"]
    assert clip_frames is clip.frames and window_frames is t.window_clips[0].frames
    assert window_meta == vllm_video(t.window_clips[0], family)[1] and window_meta["do_sample_frames"] is False
    assert window_meta["total_num_frames"] == t.window_clips[0].num_frames
    assert window_meta != clip_meta  # the window's own timing (its rate, or its frames' source indices)
