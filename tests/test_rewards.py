"""Reward functions and their weighted sum (issue 3, point 3)."""
import math

import pytest
import torch

from grounding_rl.reward.rewards import (
    REWARD_FUNCS, format_reward, get_reward_funcs, iou_reward, query_iou, tiou_reward, weighted_rewards,
)

SEED = ["10.00 to 12.00", "15.30 to 18.50", "15.00 to 18.00", "14.80 to 18.20"]


def seed_completions(conversational: bool):
    texts = [f"<think>Looking at the frames...</think>\n<answer>{a}</answer>" for a in SEED]
    return [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts


def columns(n, start=15.0, end=18.0, duration=40.0):
    return {"start": [start] * n, "end": [end] * n, "duration": [duration] * n}


@pytest.mark.parametrize("conversational", [False, True])
def test_seed_iou_format_and_weighted_sum(conversational):
    completions = seed_completions(conversational)
    cols = columns(4)
    iou = iou_reward(completions, prompts=["p"] * 4, trainer_state=None, **cols)
    fmt = format_reward(completions, **cols)
    assert [round(x, 4) for x in iou] == [0.0, 0.7714, 1.0, 0.8824]
    assert fmt == [1.0, 1.0, 1.0, 1.0]
    total = weighted_rewards([iou, fmt], [5.0, 1.0])
    assert [round(x, 3) for x in total] == [1.0, 4.857, 6.0, 5.412]


def test_weighted_sum_trl_semantics():
    assert weighted_rewards([[1.0, 2.0], [3.0, 4.0]]) == [4.0, 6.0]  # weights default to 1.0 each
    out = weighted_rewards(torch.tensor([[0.5, float("nan"), float("nan")], [1.0, 1.0, float("nan")]]), [2.0, 1.0])
    assert out[:2] == [2.0, 1.0] and math.isnan(out[2])  # nansum; all-NaN stays NaN (TRL: unscorable)
    assert weighted_rewards([[0.5, None]], [2.0])[0] == 1.0
    with pytest.raises(ValueError, match="Number of reward weights"):
        weighted_rewards([[1.0], [1.0]], [1.0])


def test_reversed_and_unparseable_get_zero():
    completions = ["<think>x</think><answer>18.0 to 15.0</answer>", "<think>x</think><answer>soon</answer>",
                   "no tags at all"]
    assert iou_reward(completions, **columns(3)) == [0.0, 0.0, 0.0]
    assert tiou_reward(completions, **columns(3)) == [0.0, 0.0, 0.0]
    assert query_iou((18.0, 15.0), (15.0, 18.0), 40.0) == 0.0
    assert query_iou(None, (15.0, 18.0), 40.0) == 0.0


def test_prediction_clamped_to_duration():
    # pred (30, 50) on a 40 s video becomes (30, 40): IoU with (35, 40) = 5 / 10 (unclamped it would be 5 / 20)
    assert iou_reward(["<answer>30 to 50</answer>"], **columns(1, 35.0, 40.0, 40.0)) == [0.5]
    # wholly past the end: (45, 50) -> (40, 40), zero length -> 0
    assert iou_reward(["<answer>45 to 50</answer>"], **columns(1, 35.0, 40.0, 40.0)) == [0.0]


def test_tiou_time_r1_formula():
    # pred (14.8, 18.2), gt (15, 18), D 40: 3/3.4 * (1 - 0.2/40) * (1 - 0.2/40)
    out = tiou_reward(["<answer>14.8 to 18.2</answer>"], **columns(1))
    assert out[0] == pytest.approx(3 / 3.4 * 0.995 * 0.995)
    # gt past the video end (Charades): clamped pred (0, 10) vs gt (0, 30) on D 10 -> 1/3 * 1 * (1 - 20/10) < 0 -> 0
    assert tiou_reward(["<answer>0 to 12</answer>"], **columns(1, 0.0, 30.0, 10.0)) == [0.0]


@pytest.mark.parametrize("text, expected", [
    ("<think>a</think><answer>1 to 2</answer>", 1.0),
    ("  <think>\nmulti\nline\n</think>\n\n<answer> 00:01 to 00:02 </answer>\n", 1.0),
    ("<think>a</think><answer>18 to 15</answer>", 1.0),  # parses; the iou reward handles reversal
    ("<answer>1 to 2</answer>", 0.0),  # no think
    ("<think>a</think>text<answer>1 to 2</answer>", 0.0),  # text between
    ("<think>a</think><answer>1 to 2</answer> done", 0.0),  # text after
    ("<think>a</think><answer>one to two</answer>", 0.0),  # does not parse
    ("<think>a</think><answer>1 to 2</answer><answer>3 to 4</answer>", 0.0),  # two answers
    ("<think>a<think>b</think><answer>1 to 2</answer>", 0.0),  # nested tag
])
def test_format_rule(text, expected):
    assert format_reward([text]) == [expected]


def test_registry_and_errors():
    assert set(REWARD_FUNCS) == {"iou", "format", "tiou"}
    assert get_reward_funcs(["iou", "format"]) == [iou_reward, format_reward]
    with pytest.raises(ValueError, match="unknown reward"):
        get_reward_funcs(["accuracy"])
    with pytest.raises(ValueError, match="'duration' column"):
        iou_reward(["<answer>1 to 2</answer>"], start=[1.0], end=[2.0])
    with pytest.raises(ValueError, match="sample 1"):
        iou_reward(["<answer>1 to 2</answer>"] * 2, start=[1.0, 1.0], end=[2.0, 2.0], duration=[10.0, 0.0])
