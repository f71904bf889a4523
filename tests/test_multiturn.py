"""Multi-turn grounding with the crop tool: the protocol (parsing, validation, error turns, the K-turn limit, the
context budget), the conversation's tokens against the chat template's, and GRPO's log-probs over whole
conversations (model tokens only, exact against turn-by-turn forwards)."""
from __future__ import annotations

import math

import pytest
import torch

from grounding_rl.data.video import VideoSettings, sample_frames
from grounding_rl.reward.window import crop_cost_reward, crop_window_reward, window_coverage, window_reward
from grounding_rl.rollout import conversation as conv
from grounding_rl.rollout import tools
from grounding_rl.rollout.tools import ToolRequest, parse_tool_call

CROP_4_12 = '<think>look</think><tool_call>{"name": "crop", "arguments": {"start": 4, "end": 12}}</tool_call>'
CROP_OUTSIDE = '<tool_call>{"name": "crop", "arguments": {"start": 4, "end": 99}}</tool_call>'
ANSWER = "<think>there</think><answer>5.00 to 9.00</answer>"


def call(args: str) -> str:
    return f'<tool_call>{{"name": "crop", "arguments": {args}}}</tool_call>'


@pytest.mark.parametrize("text, expected", [
    ("<answer>1.00 to 2.00</answer>", ToolRequest("answer")),
    (call('{"start": 4, "end": 9.5}'), ToolRequest("call", (4.0, 9.5))),
    (call('"{\\"start\\": 1, \\"end\\": 2}"'), ToolRequest("call", (1.0, 2.0))),  # arguments as a JSON string
    (call('{"start": -0.005, "end": 30.004}'), ToolRequest("call", (0.0, 30.0))),  # rounding at the ends: clamped
    (call('{"start": 4, "end": 31}'),
     ToolRequest("error", error="the window 4.00-31.00 s is outside the video (0.00-30.00 s)")),
    (call('{"start": -1, "end": 3}'),
     ToolRequest("error", error="the window -1.00-3.00 s is outside the video (0.00-30.00 s)")),
    (call('{"start": 9, "end": 4}'), ToolRequest("error", error="start must be before end")),
    (call('{"start": "a", "end": 4}'), ToolRequest("error", error="start and end must be numbers of seconds")),
    (call('{"start": NaN, "end": 4}'), ToolRequest("error", error="start and end must be numbers of seconds")),
    (call('{"start": 1}'), ToolRequest("error", error="crop needs start and end")),
    ('<tool_call>{"name": "zoom", "arguments": {"start": 1, "end": 2}}</tool_call>',
     ToolRequest("error", error="the only tool is crop")),
    ("<tool_call>{start: 1}</tool_call>", ToolRequest("error", error="the tool call is not valid JSON")),
    ('<tool_call>{"name": "crop"', ToolRequest("error", error="the tool call has no closing </tool_call>")),
    (call('{"start": 1, "end": 2}') * 2, ToolRequest("error", error="one crop per turn")),
])
def test_parse_tool_call(text, expected):
    assert parse_tool_call(text, 30.0) == expected


def test_error_text_is_short_and_says_what_to_do():
    request = ToolRequest("error", error="start must be before end")
    assert tools.error_text(request, 30.0) == ("Error: start must be before end. Call crop with 0 <= start < end <= "
                                               "30.00, or answer.")
    assert tools.error_text(request, 30.0, final=True) == "Error: start must be before end. No more crops: answer now."


def test_window_reward_and_coverage_values():
    assert window_coverage((4, 12), (10, 14)) == 0.5
    assert window_coverage((4, 12), (5, 9)) == 1.0
    assert window_coverage((4, 12), (13, 14)) == 0.0
    assert window_coverage((4, 12), (6, 6)) == 1.0 and window_coverage((4, 12), (3, 3)) == 0.0
    assert window_reward([(0, 30), (4, 12)], (5, 9)) == 0.5  # the last window: IoU 4 / 8
    assert window_reward([], (5, 9)) == 0.0
    assert window_reward([(0, 30)], (5, 9)) == pytest.approx(4 / 30)  # the whole video is not rewarded
    assert crop_window_reward(["x", "y"], crop_windows=[[[4, 12]], []], start=[5, 5], end=[9, 9]) == [0.5, 0.0]
    assert str(crop_cost_reward(["x", "y"], crop_calls=[0, 2])) == "[0.0, -2.0]"  # not -0.0
    with pytest.raises(ValueError, match="max_tool_calling_iterations"):
        crop_window_reward(["x"], start=[5], end=[9])


# ------------------------------------------------------------------------------------------- conversations, no model
@pytest.fixture(scope="module")
def qwen25(qwen_processor_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(qwen_processor_dir)


@pytest.fixture(scope="module")
def qwen3(qwen3_processor_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(qwen3_processor_dir)


SETTINGS = VideoSettings(fps=0.5, max_pixels=64 * 28 * 28, min_pixels=16 * 28 * 28)


def clip_for(processor, videos_dir):
    from grounding_rl.family import family_of

    family = family_of(processor)
    settings = family.video_settings(SETTINGS)
    return family, settings, sample_frames(videos_dir / "charades_OHOFG.mp4", settings)


def scripted(processor, texts):
    """A ``generate`` for run_conversations that answers each round with the next scripted text (+ <|im_end|>)."""
    tok = processor.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    rounds = iter(texts)

    def generate(active):
        step = next(rounds)
        rows = step if isinstance(step, list) else [step] * len(active)
        return [tok(text, add_special_tokens=False)["input_ids"] + ([end] if ends else [])
                for text, ends in ((r, True) if isinstance(r, str) else r for r in rows)]

    return generate, end


def converse(processor, videos_dir, script, max_turns=2, max_prompt_length=None, rows=1):
    family, settings, clip = clip_for(processor, videos_dir)
    generate, end = scripted(processor, script)
    trajectories = [conv.start(processor, family, "a person opens a door", clip, "default", max_turns,
                               max_prompt_length=max_prompt_length) for _ in range(rows)]
    conv.run_conversations(generate, trajectories, processor, family, tools.CropEnvironment(settings), max_turns,
                           end_ids=[end], max_prompt_length=max_prompt_length)
    return family, clip, trajectories


def whole_conversation_ids(processor, family, trajectory):
    """The chat template's rendering of the finished conversation, expanded by the processor with every video."""
    clips = [trajectory.clip] + trajectory.window_clips
    text = tools.render(processor, trajectory.messages, trajectory.protocol, False)
    features = processor(text=[family.video_prompt(processor, text)], videos=[c.frames for c in clips],
                         video_metadata=[family.video_metadata(c) for c in clips], **family.processor_kwargs(),
                         return_tensors="pt")
    return features["input_ids"][0].tolist()


def test_text_protocol_conversation_is_the_chat_templates_tokens(qwen25, videos_dir):
    family, clip, (t,) = converse(qwen25, videos_dir, [CROP_4_12, CROP_OUTSIDE, ANSWER])
    assert [turn["kind"] for turn in t.turns] == ["call", "error", "answer"]
    assert (t.calls, t.failures, t.windows) == (2, 1, [(4.0, 12.0)])
    assert t.turns[1]["error"] == f"the window 4.00-99.00 s is outside the video (0.00-{clip.duration:.2f} s)"
    # the window spends the clip's budget on rate: the same 16 frames of the same size over 8 s
    assert clip.sampling()["frames"] == 16 and t.window_clips[0].sampling()["frames"] == 16
    assert t.window_clips[0].frames.shape[1:] == clip.frames.shape[1:]
    frame = 1.0 / clip.source_fps  # times are the nearest decoded frames' presentation times
    assert 4.0 - frame <= t.window_clips[0].timestamps[0] < t.window_clips[0].timestamps[-1] <= 12.0 + frame
    # the ids the turns were generated from are exactly the template's whole conversation (it adds a final "\n")
    ids = t.prompt_ids + t.completion_ids
    assert whole_conversation_ids(qwen25, family, t) == ids + qwen25.tokenizer("\n")["input_ids"]
    # tool_mask: 1 on the three sampled turns (each with its <|im_end|>), 0 on the two tool turns
    tok = qwen25.tokenizer
    model_tokens = sum(len(tok(x, add_special_tokens=False)["input_ids"]) + 1
                       for x in (CROP_4_12, CROP_OUTSIDE, ANSWER))
    assert sum(t.tool_mask) == model_tokens and len(t.tool_mask) == len(t.completion_ids)
    text = tok.decode(t.completion_ids)
    assert "<|im_start|>user\nFrames 4.00-12.00 s of the video (16 frames at 2.00 fps):<|vision_start|>" in text
    assert "No more crops: answer now.<|im_end|>" in text
    assert len(t.videos) == 2 and t.final_text == ANSWER


def test_native_protocol_uses_qwen3s_tools_and_tool_role_with_true_timestamps(qwen3, videos_dir):
    family, clip, (t,) = converse(qwen3, videos_dir, [CROP_4_12, ANSWER])
    prompt = qwen3.tokenizer.decode(t.prompt_ids)
    assert "<tools>\n" + '{"type": "function", "function": {"name": "crop"' in prompt
    text = qwen3.tokenizer.decode(t.completion_ids)
    assert "<|im_start|>user\n<tool_response>\nFrames 4.00-12.00 s of the video" in text
    stamps = [float(s) for s in __import__("re").findall(r"<(\d+\.\d) seconds>", text)]
    assert stamps and 4.0 <= stamps[0] < stamps[-1] <= 12.0  # the window's absolute times
    newline = qwen3.tokenizer("\n")["input_ids"]
    assert whole_conversation_ids(qwen3, family, t) == t.prompt_ids + t.completion_ids + newline


def test_at_most_k_requests_then_the_answer_is_forced(qwen25, videos_dir):
    _, _, (t,) = converse(qwen25, videos_dir, [CROP_4_12, CROP_4_12], max_turns=1)
    assert [turn["kind"] for turn in t.turns] == ["call", "final"]  # the 2nd request is not executed
    assert (t.calls, len(t.videos)) == (1, 2)
    assert "No more crops: answer now. Frames 4.00-12.00" in qwen25.tokenizer.decode(t.completion_ids)


def test_a_turn_without_its_end_token_ends_the_trajectory_truncated(qwen25, videos_dir):
    _, _, (t,) = converse(qwen25, videos_dir, [[(CROP_4_12, False)]])
    assert t.truncated and t.calls == 0 and t.turns[0]["kind"] == "truncated"


def test_a_tool_turn_that_overflows_the_context_becomes_a_forced_answer(qwen25, videos_dir):
    family, settings, clip = clip_for(qwen25, videos_dir)
    prompt = len(conv.start(qwen25, family, "a person opens a door", clip, "default", 2).prompt_ids)
    _, _, (t,) = converse(qwen25, videos_dir, [CROP_4_12, ANSWER], max_prompt_length=prompt + 100)
    assert t.context_forced and t.windows == [] and len(t.videos) == 1
    assert [turn["kind"] for turn in t.turns] == ["call", "answer"]
    assert "The context is full. No more crops: answer now." in qwen25.tokenizer.decode(t.completion_ids)
    answer = len(qwen25.tokenizer(ANSWER, add_special_tokens=False)["input_ids"]) + 1
    assert t.length - answer <= prompt + 100  # the last turn's input fits max_prompt_length
    with pytest.raises(ValueError, match="more than max_prompt_length"):
        converse(qwen25, videos_dir, [ANSWER], max_prompt_length=prompt - 1)


def test_conversation_metrics_follow_trls_definitions(qwen25, videos_dir):
    from grounding_rl.update.conversation import conversation_metrics

    _, _, trajectories = converse(qwen25, videos_dir, [[ANSWER, CROP_4_12], [ANSWER]], rows=2)
    metrics = conversation_metrics(trajectories, [(5, 9), (10, 14)])
    assert metrics == {"turns/mean": 1.5, "tools/call_frequency": 0.5, "tools/failure_frequency": 0.0,
                       "zoom/coverage": 0.5, "tools/context_forced": 0.0}
    _, _, (t,) = converse(qwen25, videos_dir, [CROP_OUTSIDE, ANSWER])
    assert conversation_metrics([t], [(5, 9)])["tools/failure_frequency"] == 1.0
    assert math.isnan(conversation_metrics([t], [(5, 9)])["zoom/coverage"])


# ------------------------------------------------------------------------------------------------ log-probs, a model
def model_turns(mask):
    """(first, last) positions of each run of 1s in ``mask``."""
    runs, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i - 1))
            start = None
    return runs


@pytest.mark.slow  # ~30 s on two shared cores: four forwards with video
def test_model_token_logps_of_one_forward_equal_the_turn_by_turn_forwards(tiny_model_dir, videos_dir):
    """Exactness: a batch of two hand-built conversations (a crop then an answer; an answer at once), padded together,
    in the loss's one forward, gives at every model token the log-prob of one plain forward over the processor's
    rendering of that whole conversation, and of the unpadded forward over the conversation up to the token's turn
    (what generated the turn); the loss does not see tool tokens."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from grounding_rl.update import grpo
    from grounding_rl.update.conversation import ATTENTION, conversation_batch, conversation_logps, distinct_videos

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    family, clip, (a, b) = converse(processor, videos_dir, [[CROP_4_12, ANSWER], [ANSWER]], rows=2)
    assert (a.calls, b.calls) == (1, 0)
    pad = processor.tokenizer.pad_token_id
    batch = conversation_batch([a, b], pad)
    distinct, index = distinct_videos(batch)
    assert len(distinct) == 2 and index == [0, 1, 0]  # the shared clip is encoded once, then the window
    encoded = []
    encode = model.model.get_video_features
    model.model.get_video_features = lambda pixels, grid, **kw: encoded.append(grid.tolist()) or encode(pixels, grid,
                                                                                                          **kw)
    logps = conversation_logps(model, batch)
    del model.model.get_video_features
    assert len(encoded) == 1 and len(encoded[0]) == 2  # one vision-tower call over the two distinct videos
    assert batch[ATTENTION].sum().item() == len(a.completion_ids) + len(b.completion_ids)
    for row, t in enumerate((a, b)):
        # the reference: the processor's own rendering of the whole conversation, one plain forward, no padding
        clips = [t.clip] + t.window_clips
        text = tools.render(processor, t.messages, t.protocol, False)
        features = processor(text=[text], videos=[c.frames for c in clips],
                             video_metadata=[family.video_metadata(c) for c in clips], **family.processor_kwargs(),
                             return_tensors="pt")
        with torch.no_grad():
            full = torch.log_softmax(model(**features).logits[0].float(), dim=-1)
        ids = features["input_ids"][0]
        p = len(t.prompt_ids)
        assert ids[:p + len(t.completion_ids)].tolist() == t.prompt_ids + t.completion_ids
        reference = full[p - 1:p - 1 + len(t.completion_ids)].gather(1, ids[p:p + len(t.completion_ids), None])[:, 0]
        model_tokens = torch.tensor(t.tool_mask, dtype=torch.bool)
        torch.testing.assert_close(logps[row, :len(t.completion_ids)][model_tokens], reference[model_tokens],
                                   rtol=1e-5, atol=1e-5)
        # and what generated each turn: the unpadded conversation up to that turn (its videos only)
        for first, last in model_turns(t.tool_mask):
            windows = sum(1 for lo, hi in model_turns([1 - m for m in t.tool_mask])
                          if hi < first and 2 in t.completion_mm[lo:hi + 1])
            prefix = conv.Trajectory(query=t.query, clip=t.clip, protocol=t.protocol, prompt_ids=t.prompt_ids,
                                     prompt_mm=t.prompt_mm, videos=t.videos[:1 + windows], messages=[],
                                     completion_ids=t.completion_ids[:last + 1], tool_mask=t.tool_mask[:last + 1],
                                     completion_mm=t.completion_mm[:last + 1])
            alone = conversation_logps(model, conversation_batch([prefix], pad))[0]
            torch.testing.assert_close(logps[row, first:last + 1], alone[first:last + 1], rtol=1e-5, atol=1e-5)
    # the loss counts model tokens only: changing the log-probs at tool tokens changes nothing
    mask = batch["completion_mask"]
    advantages = torch.tensor([1.0, -1.0])
    loss = grpo.grpo_loss(logps, logps.detach(), advantages, mask).loss
    noisy = torch.where(mask.bool(), logps, logps + 5.0)
    assert grpo.grpo_loss(noisy, noisy.detach(), advantages, mask).loss == loss
    assert mask.sum().item() == sum(a.tool_mask) + sum(b.tool_mask) < batch[ATTENTION].sum().item()


def test_generation_encodes_each_video_once_per_rollout_with_the_same_tokens(family_model_dir, videos_dir):
    """Multi-turn generation with the vision cache: three rows of one clip, each first turn sampled by the model then
    replaced by a crop request (rows 0 and 1 the same window, row 2 another), each second turn sampled over the clip
    and the window. With the cache the tower encodes 3 videos (the clip at turn 1, the two windows at turn 2) instead
    of 3 + 6, and for the same seed every sampled token is the same as re-encoding every video of every row at each
    turn; the cached features equal a fresh encoding of each video alone."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from grounding_rl.rollout.generation import SamplingParams

    processor = AutoProcessor.from_pretrained(family_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(family_model_dir, dtype=torch.float32).eval()
    family, settings, clip = clip_for(processor, videos_dir)
    tok = processor.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    crops = [call('{"start": 4, "end": 12}')] * 2 + [call('{"start": 20, "end": 30}')]
    encoded, encode = [], model.model.get_video_features

    def counting(pixel_values_videos, video_grid_thw, **kwargs):  # generate passes them by these names
        encoded.append(len(video_grid_thw))
        return encode(pixel_values_videos, video_grid_thw, **kwargs)

    model.model.get_video_features = counting

    def rollout(cache_vision):
        torch.manual_seed(0)
        encoded.clear()
        sampled = conv.HFTurns(model, tok.pad_token_id, cache_vision)

        def generate(trajectories):
            ids = sampled.continue_turn(trajectories, SamplingParams(max_new_tokens=8))
            return ids if trajectories[0].turns else [tok(c, add_special_tokens=False)["input_ids"] + [end]
                                                      for c in crops]

        trajectories = [conv.start(processor, family, "a person opens a door", clip, "default", 1) for _ in crops]
        conv.run_conversations(generate, trajectories, processor, family, tools.CropEnvironment(settings), 1,
                               end_ids=[end])
        return trajectories, list(encoded), sampled.vision

    cached, calls_cached, vision = rollout(True)
    plain, calls_plain, _ = rollout(False)
    assert calls_cached == [1, 2] and calls_plain == [3, 6]  # videos through the tower at turn 1, turn 2
    assert [t.windows for t in cached] == [[(4.0, 12.0)], [(4.0, 12.0)], [(20.0, 30.0)]]
    assert [t.completion_ids for t in cached] == [t.completion_ids for t in plain]
    assert all(len(t.turns) == 2 for t in cached)
    del model.model.get_video_features
    with torch.no_grad():
        for video in (cached[0].videos + cached[2].videos[1:]):
            alone = model.model.get_video_features(video["pixel_values_videos"], video["video_grid_thw"][None],
                                                   return_dict=True).pooler_output[0]
            torch.testing.assert_close(vision.pooled[vision.index[video["key"]]], alone, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ the trainer
@pytest.mark.slow  # ~25 s: a GRPO step with video on two shared cores
def test_grpo_step_over_conversations_logs_the_tool_metrics(tiny_model_dir, videos_dir, tmp_path, monkeypatch):
    """One GRPO step with the crop tool on the tiny model, its turns scripted (a random model emits no tool call):
    half the rows crop the ground truth's span then answer, half answer at once; the rewards score the final turns
    and the window, the loss trains on model tokens, TRL's tool metrics are logged."""
    from conftest import clip_dataset, grpo_config, make_grpo_trainer

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def scripted_turns(self, trajectories, params):  # round 1: even rows crop 1-4 s, odd rows answer; then all answer
        crop = '<tool_call>{"name": "crop", "arguments": {"start": 1, "end": 4}}</tool_call>'
        texts = [crop if not t.turns and row % 2 == 0 else "<think>x</think><answer>1.00 to 3.00</answer>"
                 for row, t in enumerate(trajectories)]
        return [tok(text, add_special_tokens=False)["input_ids"] + [end] for text in texts]

    monkeypatch.setattr(conv.HFTurns, "continue_turn", scripted_turns)
    config = grpo_config(tmp_path, max_tool_calling_iterations=2, logging_steps=1, max_completion_length=32,
                         reward_funcs=["iou", "format", "crop_window", "crop_cost"], reward_weights=[1, 1, 1, 0.1],
                         beta=0.04, log_completions=True)
    trainer = make_grpo_trainer(tiny_model_dir, config, clip_dataset(videos_dir), reward_funcs=config.reward_funcs)
    trainer.train()
    logs = next(entry for entry in trainer.state.log_history if "loss" in entry)
    assert logs["turns/mean"] == 1.5 and logs["tools/call_frequency"] == 0.5
    assert logs["tools/failure_frequency"] == 0.0 and logs["zoom/coverage"] == 1.0  # the window is the ground truth
    assert logs["rewards/crop_window/mean"] == 0.5 and logs["rewards/crop_cost/mean"] == -0.5
    assert logs["rewards/iou/mean"] == pytest.approx(2 / 3)
    assert math.isfinite(logs["loss"]) and logs["kl"] >= 0.0
    import json

    rows = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    records = [row["extra"]["conversation"] for row in rows]
    assert sorted(r["calls"] for r in records) == [0, 0, 1, 1]
    assert [r["windows"] for r in records if r["calls"]] == [[[1.0, 4.0]], [[1.0, 4.0]]]


# ------------------------------------------------------------------------------------------------ infer --max-turns
INFER_FAST = ["--fps", "1", "--max-pixels", str(28 * 28 * 16), "--min-pixels", str(28 * 28 * 4),
              "--max-new-tokens", "40"]


def test_infer_max_turns_runs_the_conversation_and_prints_every_turn(tiny_model_dir, videos_dir, capsys,
                                                                     monkeypatch):
    import json

    from grounding_rl.cli import infer as infer_cli

    from transformers import AutoTokenizer

    real_turns = conv.HFTurns.continue_turn
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def first_turn_scripted(self, trajectories, params):
        """The first turn requests crop(4, 12) (a random model would not); the second is the model's own, generated
        by ``model.generate`` from the prompt, the crop request and the window (two videos)."""
        assert params.do_sample is False and params.max_new_tokens == 40  # greedy, the per-turn budget
        if all(t.turns for t in trajectories):
            return real_turns(self, trajectories, params)
        return [tok(CROP_4_12, add_special_tokens=False)["input_ids"] + [end] for t in trajectories]

    monkeypatch.setattr(conv.HFTurns, "continue_turn", first_turn_scripted)
    rc = infer_cli.main(["--model", str(tiny_model_dir), "--video", str(videos_dir / "charades_OHOFG.mp4"),
                         "--query", "person sitting down in a chair.", "--max-tool-calling-iterations", "2",
                         "--print-prompt", "--json", *INFER_FAST])
    assert rc == 0
    captured = capsys.readouterr()
    (result,) = json.loads(captured.out)
    turns = result["conversation"]["turns"]
    assert result["conversation"]["windows"] == [[4.0, 12.0]] and turns[0]["kind"] == "call"
    assert len(turns) == 2 and turns[1]["kind"] in ("answer", "final", "truncated")
    assert result["answer"] == turns[1]["text"]
    assert captured.err.count("<|vision_start|>") == 2 and "Frames 4.00-12.00 s of the video" in captured.err
    from grounding_rl.errors import UserError

    from grounding_rl.eval.turns import check_turns_run

    with pytest.raises(UserError, match="--max-tool-calling-iterations and --zoom"):  # one line, exit 2 at the CLI
        check_turns_run(1, True, "exact", "default")
    with pytest.raises(UserError, match="exact sampler"):
        check_turns_run(1, False, "qwen_vl_utils", "default")
    with pytest.raises(UserError, match="set of intervals"):
        check_turns_run(1, False, "exact", "timelens2")
    with pytest.raises(UserError, match="≥ 0"):
        check_turns_run(-1, False, "exact", "default")
    check_turns_run(0, True, "qwen_vl_utils", "timelens2")  # single turn: nothing to refuse
    check_turns_run(2, False, "exact", "default")  # either engine runs the conversation (tests/test_vllm_cpu.py)


def test_eval_max_turns_keeps_the_conversations_and_refuses_a_single_turn_resume(tiny_model_dir, videos_dir, tmp_path,
                                                                                monkeypatch, capsys):
    import json

    from grounding_rl.cli import main as cli

    crops = [True]

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def scripted(self, trajectories, params):  # every query crops 4-12 s, then answers 5-9 s
        return [tok(CROP_4_12 if not t.turns and crops[0] else ANSWER, add_special_tokens=False)["input_ids"] + [end]
                for t in trajectories]

    monkeypatch.setattr(conv.HFTurns, "continue_turn", scripted)
    out = tmp_path / "turns"
    command = ["eval", "--model", str(tiny_model_dir), "--data", str(videos_dir / "annotations.jsonl"), "--out",
               str(out), *INFER_FAST, "--num-workers", "0", "--limit", "3"]
    assert cli(command + ["--max-tool-calling-iterations", "2"]) == 0  # --max-turns (its alias) below
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 3
    for r in records:
        assert (r["start"], r["end"]) == (5.0, 9.0) and r["conversation"]["windows"] == [[4.0, 12.0]]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["turns"]["turns_mean"] == 2.0 and metrics["turns"]["call_frequency"] == 1.0
    assert metrics["sampling"]["max_turns"] == 2
    assert f"ground truth coverage of the last window {metrics['turns']['coverage']}" in capsys.readouterr().out
    assert cli(command) == 2  # single-turn over multi-turn predictions: refused, one line
    assert "max_turns: 2 → 0" in capsys.readouterr().err
    crops[0] = False  # no query asks for a window: no coverage to report, said in words (not "None")
    assert cli(command[:command.index("--out") + 1] + [str(tmp_path / "direct")] + command[command.index("--out") + 2:]
               + ["--max-turns", "2", "--limit", "1"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("eval: crop tool:"))
    assert line.endswith("(0.0 of them refused); no window was sampled"), line


def test_crop_tool_settings_are_checked(tmp_path):
    from conftest import grpo_config

    grpo_config(tmp_path, max_tool_calling_iterations=2, crop_spend="resolution")
    for overrides, message in (
            ({"max_tool_calling_iterations": -1}, "max_tool_calling_iterations must be ≥ 0 (got -1)"),
            ({"crop_spend": "frames"}, "crop_spend must be one of fps, resolution (got 'frames')"),
            ({"max_tool_calling_iterations": 1, "use_gt_injection": True},
             "max_tool_calling_iterations > 0 does not run with use_gt_injection yet"),
            ({"max_tool_calling_iterations": 1, "video_sampler": "qwen_vl_utils"}, "with the exact sampler"),
            ({"max_tool_calling_iterations": 1, "prompt_template": "timelens2"}, "asks for a set of intervals")):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            grpo_config(tmp_path, **overrides)
    from grounding_rl.update.recipes.crop_tool import CropTool, CropToolArguments

    config = grpo_config(tmp_path)  # 1 process refuses tensor parallelism itself, so the recipe sees it set after
    config.use_vllm, config.vllm_tensor_parallel_size = True, 2
    args = CropToolArguments(max_tool_calling_iterations=1)
    assert "runs with vllm_tensor_parallel_size 1" in CropTool.problems(args, config)[0]


def test_crop_tool_under_zero3_needs_the_parameters_gathered_for_generation(tmp_path):
    """Ranks run as many turns as their own conversations need, so each samples alone: under ZeRO-3 that needs the
    parameters gathered (``ds3_gather_for_generation``); partitioned, it is refused when the trainer is built."""
    from types import SimpleNamespace

    from conftest import grpo_config

    from grounding_rl.update.recipes.crop_tool import CropTool

    def trainer(stage):
        plugin = SimpleNamespace(zero_stage=stage)
        return SimpleNamespace(is_deepspeed_enabled=True, share_prompt=False,
                               accelerator=SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)))

    partitioned = CropTool(grpo_config(tmp_path, max_tool_calling_iterations=1, ds3_gather_for_generation=False))
    with pytest.raises(ValueError, match="needs ds3_gather_for_generation: true"):
        partitioned.setup(trainer(3))
    partitioned.setup(trainer(2))  # ZeRO-2 keeps whole parameters on every rank
    CropTool(grpo_config(tmp_path, max_tool_calling_iterations=1)).setup(trainer(3))


def test_conversation_batches_select_and_split_by_row():
    from grounding_rl.update.batching import select_rows, split_rows
    from grounding_rl.update.conversation import ATTENTION, CONVERSATION, conversation_batch, forward_inputs

    def video(n, key):
        return {"pixel_values_videos": torch.full((n, 3), float(n)), "video_grid_thw": torch.tensor([1, 1, n]),
                "key": key}

    def trajectory(prompt, completion, mask, videos):
        return conv.Trajectory(query="q", clip=None, protocol="text", prompt_ids=prompt, prompt_mm=[0] * len(prompt),
                               videos=videos, messages=[], completion_ids=completion, tool_mask=mask,
                               completion_mm=[0] * len(completion))

    a = trajectory([1, 2, 3], [4, 5, 6, 7], [1, 0, 0, 1], [video(2, "clip"), video(3, "window")])
    b = trajectory([1, 2], [8], [1], [video(2, "clip")])
    batch = conversation_batch([a, b], pad_token_id=0)
    assert batch["prompt_ids"].tolist() == [[1, 2, 3], [0, 1, 2]]
    assert batch["completion_ids"].tolist() == [[4, 5, 6, 7], [8, 0, 0, 0]]
    assert batch["completion_mask"].tolist() == [[1, 0, 0, 1], [1, 0, 0, 0]]  # model tokens only
    assert batch[ATTENTION].tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]]  # every real token
    swapped = select_rows(batch, [1, 0])
    assert swapped["completion_ids"].tolist() == [[8, 0, 0, 0], [4, 5, 6, 7]]
    assert [[v["key"] for v in row] for row in swapped[CONVERSATION]] == [["clip"], ["clip", "window"]]
    first, second = split_rows(batch, 2)
    assert first["prompt_ids"].tolist() == [[1, 2, 3]] and len(second[CONVERSATION]) == 1
    inputs = forward_inputs(swapped)
    assert inputs["video_grid_thw"].tolist() == [[1, 1, 2], [1, 1, 2], [1, 1, 3]]  # row by row, token order
    assert inputs["pixel_values_videos"].shape == (7, 3)
    assert inputs["attention_mask"].tolist() == [[0, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]]


@pytest.mark.slow  # ~2 min: 6 GRPO steps with video on two shared cores
def test_crop_tool_run_resumed_at_a_checkpoint_ends_bit_identical(tmp_path, tiny_model_dir, videos_dir, monkeypatch):
    """Multi-turn GRPO (even rows request a crop in their first turn, scripted; every later turn is sampled by the
    model from the conversation with the window) resumed at checkpoint-2 of 4 ends with the uninterrupted weights and
    the same logged metrics."""
    from conftest import clip_dataset, grpo_config, make_grpo_trainer

    from transformers import AutoTokenizer

    real_turns = conv.HFTurns.continue_turn
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    crop = '<tool_call>{"name": "crop", "arguments": {"start": 1, "end": 4}}</tool_call>'

    def first_turn_crops(self, trajectories, params):
        sampled = real_turns(self, trajectories, params)
        if all(t.turns for t in trajectories):
            return sampled
        return [tok(crop, add_special_tokens=False)["input_ids"] + [end] if row % 2 == 0 else ids
                for row, (t, ids) in enumerate(zip(trajectories, sampled))]

    monkeypatch.setattr(conv.HFTurns, "continue_turn", first_turn_crops)

    def trainer(out, **overrides):
        config = grpo_config(out, max_tool_calling_iterations=1, max_steps=4, logging_steps=1, learning_rate=1e-3,
                             save_strategy="steps", save_steps=2, beta=0.04, **overrides)
        return make_grpo_trainer(tiny_model_dir, config, clip_dataset(videos_dir))

    def weights(t):
        return {k: v.detach().clone() for k, v in t.accelerator.unwrap_model(t.model).state_dict().items()}

    full = trainer(tmp_path / "full")
    start = weights(full)
    full.train()
    a = weights(full)
    assert max((a[k].float() - start[k].float()).abs().max().item() for k in a) > 1e-5  # the run moves the weights
    resumed = trainer(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    b = weights(resumed)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    logged = lambda t: {h["step"]: h for h in t.state.log_history if "loss" in h}  # noqa: E731
    wall = ("runtime", "per_second", "step_time", "timing/")
    same = lambda h: {k: v for k, v in h.items() if not any(w in k for w in wall)}  # noqa: E731
    assert logged(full)[3]["tools/call_frequency"] == 0.5
    for step in (3, 4):
        assert same(logged(resumed)[step]) == same(logged(full)[step])
