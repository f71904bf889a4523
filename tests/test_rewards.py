"""Reward functions and their weighted sum."""
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
    total = weighted_rewards(torch.tensor([iou, fmt]).T, [5.0, 1.0])
    assert [round(x, 3) for x in total.tolist()] == [1.0, 4.857, 6.0, 5.412]


def test_weighted_sum_trl_semantics():
    # rows are completions, columns reward functions (TRL's rewards_per_func)
    assert weighted_rewards(torch.tensor([[1.0, 3.0], [2.0, 4.0]])).tolist() == [4.0, 6.0]  # weights 1.0 each
    nan = float("nan")
    out = weighted_rewards(torch.tensor([[0.5, 1.0], [nan, 1.0], [nan, nan]]), [2.0, 1.0]).tolist()
    assert out[:2] == [2.0, 1.0] and math.isnan(out[2])  # nansum; all-NaN stays NaN (TRL: unscorable)
    with pytest.raises(ValueError, match="Number of reward weights"):
        weighted_rewards(torch.ones(1, 2), [1.0])


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
    ("  <think>\nmulti\nline\n</think>\n\n<answer> 1.50 to 2.25 </answer>\n", 1.0),
    ("<think>a</think><answer>00:01 to 00:02</answer>", 0.0),  # read for the IoU, but not the asked "S to E"
    ("<think>a</think><answer>1s to 2s</answer>", 0.0),
    ("<think>a</think><answer>[1, 2]</answer>", 0.0),
    ("<think>a</think><answer>1 - 2</answer>", 0.0),
    ("<think>a</think><answer>1 to " + "9" * 400 + "</answer>", 0.0),  # inf
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
    assert {"iou", "format", "tiou"} <= set(REWARD_FUNCS)
    assert get_reward_funcs(["iou", "format"]) == [iou_reward, format_reward]
    with pytest.raises(ValueError, match="unknown reward"):
        get_reward_funcs(["accuracy"])
    with pytest.raises(ValueError, match="'duration' column"):
        iou_reward(["<answer>1 to 2</answer>"], start=[1.0], end=[2.0])
    with pytest.raises(ValueError, match="sample 1"):
        iou_reward(["<answer>1 to 2</answer>"] * 2, start=[1.0, 1.0], end=[2.0, 2.0], duration=[10.0, 0.0])


def test_register_reward_and_user_functions(tmp_path, monkeypatch):
    from grounding_rl.reward.rewards import register_reward, reward_name

    monkeypatch.setattr("grounding_rl.reward.rewards.REWARD_FUNCS", dict(REWARD_FUNCS))

    @register_reward("length")
    def length(completions, **columns):
        return [float(len(c)) for c in completions]

    assert get_reward_funcs(["length"]) == [length] and reward_name(length) == "length"
    register_reward("length", length)  # the same function again is fine
    with pytest.raises(ValueError, match="already registered"):
        register_reward("length", iou_reward)
    # a user's own file and a module, as reward_funcs entries
    (tmp_path / "my_rewards.py").write_text("def half(completions, **kw):\n    return [0.5] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    (func,) = get_reward_funcs(["my_rewards.py:half"])
    assert func(["a", "b"]) == [0.5, 0.5] and reward_name(func, "my_rewards.py:half") == "my_rewards.py:half"
    assert get_reward_funcs(["grounding_rl.reward.rewards:tiou_reward"]) == [tiou_reward]
    with pytest.raises(ValueError, match="no function 'nope'"):
        get_reward_funcs(["my_rewards.py:nope"])
    with pytest.raises(ValueError, match="no such file"):
        get_reward_funcs(["missing.py:half"])


@pytest.mark.parametrize("template, text, expected", [
    ("timelens", "The event happens in 3.00 - 7.50 seconds", 1.0),
    ("timelens", "The event happens in 3 - 7.5 seconds.", 1.0),
    ("timelens", "<think>a</think><answer>3 to 7</answer>", 0.0),  # not what TimeLens's prompt asks for
    ("timelens", "The event happens in 3.0 to 7.5 seconds", 0.0),
    ("timelens", "I think the event happens in 3.0 - 7.5 seconds", 0.0),
    ("time_r1", "<think>a</think><answer>3.00 to 7.50</answer>", 1.0),
    ("videochat_r1", "The event happens in 3.00 - 7.50 seconds", 0.0),
    ("timezero", "<think>a</think>\n<answer>12.54 to 17.83</answer>", 1.0),
    ("timelens", "<think>a</think>The event happens in 3.00 - 7.50 seconds", 0.0),  # thinking-free: no think block
    # ours, thinking-free: the answer block alone
    ("default_no_think", "<answer>3.00 to 7.50</answer>", 1.0),
    ("default_no_think", "  <answer> 3 to 7.5 </answer>\n", 1.0),
    ("default_no_think", "<think>a</think><answer>3.00 to 7.50</answer>", 0.0),  # a think block present
    ("default_no_think", "<think></think><answer>3.00 to 7.50</answer>", 0.0),  # even an empty one
    ("default_no_think", "<answer>3.00 to 7.50</answer><think>a</think>", 0.0),
    ("default_no_think", "<answer>3.00 to 7.50</answer> done", 0.0),
    ("default_no_think", "<answer>3.00 to 7.50</answer><answer>1 to 2</answer>", 0.0),
    ("default_no_think", "<answer>3.0s to 7.5s</answer>", 0.0),
    ("default_no_think", "3.00 to 7.50", 0.0),
    ("default", "<answer>3.00 to 7.50</answer>", 0.0),  # the think template still asks for its think block
])
def test_format_reward_is_strict_per_template(template, text, expected):
    assert format_reward([text], prompt_template=[template]) == [expected]
    assert format_reward([text], prompt_template=template) == [expected]


def test_format_reward_linear_time():
    """Hostile completions (unclosed tags, long runs of spaces and digits) score 0 in every template, in time linear
    in their length: t(2n) / t(n) < 3 (a backtracking regex would be far above)."""
    from conftest import assert_linear_time

    def texts(n):
        return ["<think>" + " " * n + "</think><answer>" + "1" * (n // 2) + " " * (n // 2) + "</answer>",
                "<think>" * (3 * n // 10) + "</think>" * (3 * n // 10), " " * n + "1" * n,
                "The event happens in " + "1" * n + " - " + " " * n,
                "<answer>" + "1" * (n // 2) + " " * (n // 2) + "</answer>"]

    def run(n):
        hostile = texts(n)
        for template in ("default", "default_no_think", "timelens"):
            assert format_reward(hostile, prompt_template=template) == [0.0] * 5

    run(100_000)
    assert_linear_time(run, 400_000, repeat=5)


def test_tempsamp_shaping_matches_hand_computed_values():
    """τ 0.8, α 1: r ≥ τ → τ + 0.01·ln(r − τ + 1); r < τ → τ − (e^{τ−r} − 1)/(e − 1)."""
    import math

    import torch

    from grounding_rl.reward.shaping import tempsamp_shaping

    out = tempsamp_shaping(torch.tensor([1.0, 0.8, 0.5, 0.0, float("nan")]))
    expected = [0.8 + 0.01 * math.log(1.2), 0.8, 0.8 - (math.exp(0.3) - 1) / (math.e - 1),
                0.8 - (math.exp(0.8) - 1) / (math.e - 1)]
    assert out[:4].tolist() == pytest.approx(expected, abs=1e-6)
    assert out[:4].tolist() == pytest.approx([0.801823, 0.8, 0.596390, 0.086764], abs=1e-6)
    assert math.isnan(out[4].item())
    # a steeper ramp (α 2) and another threshold (τ 0.5): 0.25 → 0.5 − (e^{0.5} − 1)/(e² − 1)
    assert tempsamp_shaping(torch.tensor([0.25]), 0.5, 2.0).item() == pytest.approx(
        0.5 - (math.exp(0.5) - 1) / (math.exp(2) - 1), abs=1e-6)
    with pytest.raises(ValueError, match="alpha"):
        tempsamp_shaping(torch.tensor([0.5]), alpha=0.0)


def test_thinking_free_rewards_on_real_values():
    # gt (15, 18) on a 40 s video; the IoU reads the answer-only form like the tagged one, the format is per template
    answers = ["<answer>15.30 to 18.50</answer>", "<think>x</think><answer>15.30 to 18.50</answer>",
               "<answer>14.80 to 18.20</answer>", "The event happens in 15.00 - 18.00 seconds"]
    cols = columns(4)
    assert [round(x, 4) for x in iou_reward(answers, **cols)] == [0.7714, 0.7714, 0.8824, 1.0]
    assert format_reward(answers, prompt_template="default_no_think", **cols) == [1.0, 0.0, 1.0, 0.0]
    assert format_reward(answers, prompt_template="default", **cols) == [0.0, 1.0, 0.0, 0.0]
    assert format_reward(answers, prompt_template="timelens", **cols) == [0.0, 0.0, 0.0, 1.0]
    # the demo's weights (iou 1.0, format 0.5): answer-only 0.7714 + 0.5, the think form loses its format half
    fmt = format_reward(answers, prompt_template="default_no_think", **cols)
    total = weighted_rewards(torch.tensor([iou_reward(answers, **cols), fmt]).T, [1.0, 0.5])
    assert [round(x, 4) for x in total.tolist()] == [1.2714, 0.7714, 1.3824, 1.0]
    # per-completion template column (what the trainer passes): each completion is judged by its own template
    assert format_reward(answers[:2], prompt_template=["default_no_think", "default"]) == [1.0, 1.0]
