"""Fixed two-pass zoom training (``two_pass_zoom``): each query's pass-1 group and its pass-2 group on the window of
the group's first answer, each normalised on its own; pass 2 sees the window's frames at their times and is scored
on its answer mapped back to the video's seconds."""
from __future__ import annotations

import math

import pytest
import torch

from grounding_rl.reward.rewards import iou_reward, tiou_reward

PASS1 = ["5.00 to 6.00", "1.00 to 3.00", "1.00 to 4.00", "2.00 to 4.00"]  # IoU with (1, 4): 0, 2/3, 1, 2/3
PASS2 = ["0.00 to 1.00", "0.00 to 2.00", "later", "0.00 to 1.00"]  # window time, t0 = 3 s: 1/3, 1/4, 0, 1/3


def answer(text: str) -> str:
    return f"<think>x</think><answer>{text}</answer>"


def test_a_window_answer_reaches_the_rewards_in_video_seconds():
    from grounding_rl.update.rollout import answer_spans

    assert answer_spans([answer("2.00 to 5.50")], [30.25]) == [(32.25, 35.75)]
    assert answer_spans([answer("2.00 to 5.50"), "no answer"], [0.0, 3.0]) == [(2.0, 5.5), None]
    columns = {"start": [1.0, 1.0], "end": [4.0, 4.0], "duration": [10.0, 10.0]}
    texts = [answer("0.00 to 1.00"), answer("0.00 to 2.00")]
    assert iou_reward(texts, **columns) == [pytest.approx(0.0), pytest.approx(0.25)]  # read as video seconds
    spans = answer_spans(texts, [3.0, 3.0])  # the rollout maps them before the rewards: (3, 4) and (3, 5)
    assert iou_reward(texts, answer_span=spans, **columns) == [pytest.approx(1 / 3), pytest.approx(1 / 4)]
    # tIoU with the duration of the whole video: (3, 4) → 1/3 · (1 − 2/10) · (1 − 0/10)
    assert tiou_reward(texts[:1], answer_span=spans[:1], **{k: v[:1] for k, v in columns.items()}) == [
        pytest.approx(1 / 3 * 0.8)]


def test_two_pass_zoom_settings_are_checked(tmp_path):
    from conftest import grpo_config

    grpo_config(tmp_path, two_pass_zoom=True, zoom_margin=0.5, zoom_spend="resolution")
    for overrides, message in (
            ({"zoom_margin": -1.0}, "zoom_margin must be ≥ 0 (got -1.0)"),
            ({"zoom_spend": "frames"}, "zoom_spend must be one of fps, resolution (got 'frames')"),
            ({"two_pass_zoom": True, "max_tool_calling_iterations": 2},
             "two_pass_zoom does not run with max_tool_calling_iterations"),
            ({"two_pass_zoom": True, "video_sampler": "qwen_vl_utils"}, "with the exact sampler"),
            ({"two_pass_zoom": True, "prompt_template": "timelens2"}, "asks for a set of intervals")):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            grpo_config(tmp_path, **overrides)


class ScriptedEngine:
    """Answers :data:`PASS1` to a whole clip and :data:`PASS2` to a window; keeps the clips it was shown."""

    logps_need_correcting = False

    def __init__(self, tokenizer):
        self.tokenizer, self.seen = tokenizer, []

    def generate(self, model, inputs, params):
        rows = self.answers(inputs["clips"])
        width = max(map(len, rows))
        return torch.tensor([row + [rows[0][-1]] * (width - len(row)) for row in rows])

    def continue_turn(self, trajectories, params):  # pass 2: turn 2 of the zoom's conversation
        return self.answers([t.clip for t in trajectories])

    def answers(self, clips):
        self.seen.append(clips)
        texts = PASS2 if clips[0].window is not None else PASS1
        end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        return [self.tokenizer(answer(t), add_special_tokens=False)["input_ids"] + [end] for t in texts]


def group_advantages(values):
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))  # unbiased, as TRL
    return [(v - mean) / (std + 1e-4) for v in values]


def test_each_pass_is_its_own_group_and_pass_two_sees_the_window(tiny_model_dir, videos_dir, tmp_path):
    """Scripted answers on the 10 s pool clip (ground truth 1-4 s, 1 fps: 10 frames): the group's first answer
    5-6 s widened by one temporal patch (2 s > the margin's 1 s) gives the window 3-8 s, sampled at 2 fps (the same 10
    frames); pass 2 answers in window time and is scored from 3 s on."""
    from conftest import POOL, clip_dataset, grpo_config, make_grpo_trainer

    config = grpo_config(tmp_path, two_pass_zoom=True, reward_funcs=["iou"], max_completion_length=32,
                         log_completions=True)
    trainer = make_grpo_trainer(tiny_model_dir, config, clip_dataset(videos_dir, names=(POOL,)),
                                reward_funcs=["iou"])
    trainer.rollout_engine = engine = ScriptedEngine(trainer.processing_class.tokenizer)
    items = next(iter(trainer.get_train_dataloader()))
    batch = trainer.generate_and_score(items)

    whole, window = engine.seen[0][0], engine.seen[1][0]
    assert whole.window is None and whole.num_frames == 10 and whole.sampled_fps == 1.0
    assert window.window == (3.0, 8.0) and window.num_frames == 10 and window.sampled_fps == 2.0
    assert window.timestamps == pytest.approx([3.0 + 0.5 * k for k in range(10)])
    assert all(c is window for c in engine.seen[1])  # one window per group, sampled once
    # the loss batch: 4 pass-1 rows then 4 pass-2 rows, two groups, Qwen2.5-VL's time scale 2 / f per row
    assert batch["group_ids"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert batch["second_per_grid_ts"].tolist() == [2.0] * 4 + [1.0] * 4
    assert not torch.equal(batch["pixel_values_videos"][:1], batch["pixel_values_videos"][-1:])
    expected = group_advantages([0.0, 2 / 3, 1.0, 2 / 3]) + group_advantages([1 / 3, 1 / 4, 0.0, 1 / 3])
    assert batch["advantages"].tolist() == pytest.approx(expected, abs=1e-5)
    assert expected[:4] == pytest.approx([-1.3904, 0.1986, 0.9932, 0.1986], abs=1e-4)  # hand: std 0.41944
    assert expected[4:] == pytest.approx([0.6599, 0.1320, -1.4518, 0.6599], abs=1e-4)  # hand: std 0.15775
    metrics = trainer._metrics
    assert metrics["zoom/window_recall"] == [0.0] and metrics["zoom/fallbacks"] == [0.0]
    assert metrics["zoom/pass1_reward"] == [pytest.approx(7 / 12)]
    assert metrics["zoom/pass2_reward"] == [pytest.approx(11 / 48)]
    assert trainer.completions["extra"]["zoom_window"] == [None] * 4 + [[3.0, 8.0]] * 4


def test_only_qwen2_5_vl_window_time_shifts_the_answer():
    from grounding_rl.family import family_of

    qwen25, qwen3 = family_of("qwen2_5_vl"), family_of("qwen3_vl")
    assert qwen25.window_answer_shift() and qwen25.window_answer_shift("window")
    assert not qwen25.window_answer_shift("video") and not qwen3.window_answer_shift()
    assert qwen25.window_position_shift("video") and not qwen3.window_position_shift("video")
    assert (qwen25.tool_protocol, qwen3.tool_protocol) == ("text", "native")


def test_two_pass_zoom_trains_two_steps_on_the_tiny_model(tiny_model_dir, videos_dir, tmp_path):
    """Two GRPO steps through the trainer with real sampling: a random tiny model's answers do not parse, so every
    window is the fallback (the centre half); the loss is finite and the zoom metrics are logged."""
    from conftest import clip_dataset, grpo_config, make_grpo_trainer

    config = grpo_config(tmp_path, two_pass_zoom=True, max_steps=2, logging_steps=1, num_generations=2,
                         reward_funcs=["iou", "tests/conftest.py:varied_reward"])
    trainer = make_grpo_trainer(tiny_model_dir, config, clip_dataset(videos_dir),
                                reward_funcs=config.reward_funcs)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and all(math.isfinite(entry["loss"]) for entry in logs)
    assert all(entry["zoom/fallbacks"] == 1.0 and entry["zoom/window_errors"] == 0.0 for entry in logs)
