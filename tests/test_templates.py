"""Prompt templates: the peers' prompts verbatim, each with its answer format, and the strict format reward."""
import pytest

from grounding_rl.prompts import templates
from grounding_rl.prompts.parsing import parse_answer
from grounding_rl.reward.rewards import format_reward


def test_peer_templates_are_the_published_texts():
    # Time-R1 (xiaomi-research/time-r1, src/time_r1/rl/timer1_trainer.py, QUESTION_TEMPLATE_TG_v1) differs from
    # TimeZero's only by "specific timestamps (xx.xx) or"; VideoChat-R1's QUESTION_TEMPLATE is TimeZero's text
    assert templates.TIME_R1 == templates.TIMEZERO.replace("specific timestamps (xx.xx) or time ranges",
                                                           "specific time ranges")
    assert templates.VIDEOCHAT_R1 == templates.TIMEZERO
    assert templates.instruction("a man runs.", "timelens") == (
        "Please find the visual event described by the sentence 'a man runs.', determining its starting and ending "
        "times. The format should be: 'The event happens in <start time> - <end time> seconds'.")
    for name in ("time_r1", "videochat_r1", "timelens"):
        assert "/" in templates.get_template(name).source  # each names its repository and file


def test_each_template_names_its_answer_format_and_video_position():
    formats = {name: t.answer_format for name, t in templates.PROMPT_TEMPLATES.items()}
    assert formats == {"default": "think_answer", "default_no_think": "answer_only", "timezero": "think_answer",
                       "time_r1": "think_answer", "videochat_r1": "think_answer", "timelens": "timelens",
                       "default_multi": "think_json_spans", "timelens2": "json_spans", "timelens_100k": "json_spans",
                       "lmms_charades_sta": "timelens", "lmms_extremewhenbench": "timelens"}
    assert [n for n in sorted(formats) if templates.is_thinking_free(n)] == [
        "default_no_think", "lmms_charades_sta", "lmms_extremewhenbench", "timelens", "timelens2", "timelens_100k"]
    assert [p["type"] for p in templates.conversation("q", "timelens2")[0]["content"]] == ["video", "text"]
    assert [p["type"] for p in templates.conversation("q", "timelens")[0]["content"]] == ["video", "text"]
    assert [p["type"] for p in templates.conversation("q", "time_r1")[0]["content"]] == ["text", "video"]
    with pytest.raises(ValueError, match="unknown prompt_template"):
        templates.get_template("timezero2")


def test_a_template_that_states_the_duration():
    """lmms-eval's ExtremeWhenBench prompt states the video's length as ``f"{dur:.0f}"``."""
    text = templates.instruction("When does he leave?", "lmms_extremewhenbench", duration=3725.5)
    assert text.startswith("[Video Temporal Grounding]\nYou are watching a 3726-second long video.\n")
    assert text.endswith('Now I will give you the question: "When does he leave?"\nPlease return its start time and '
                         "end time.")
    with pytest.raises(ValueError, match="states the video's duration"):
        templates.instruction("q", "lmms_extremewhenbench")


@pytest.mark.parametrize("name", sorted(templates.PROMPT_TEMPLATES))
def test_sft_target_is_what_the_template_asks_for(name):
    target = templates.answer_text(3.5, 9.0, "x", template=name)
    assert format_reward([target], prompt_template=name) == [1.0]
    assert parse_answer(target) == (3.5, 9.0)
    others = {t.answer_format for t in templates.PROMPT_TEMPLATES.values()} - {
        templates.get_template(name).answer_format}
    for other in others:  # and nothing looser: another template's format gets no format reward
        other_name = next(n for n, t in templates.PROMPT_TEMPLATES.items() if t.answer_format == other)
        assert format_reward([templates.answer_text(3.5, 9.0, "x", other_name)], prompt_template=name) == [0.0]


def test_thinking_free_default_differs_from_default_only_in_the_think_block():
    think = templates.instruction("a man runs.", "default")
    free = templates.instruction("a man runs.", "default_no_think")
    assert "<think>" in think and "think" not in free.replace("Do not think", "")
    assert free == ('When does the event "a man runs." happen in the video? Do not think; give only the start and end '
                    'times in seconds within <answer> </answer> tags, as "start to end", e.g. <answer>12.54 to '
                    '17.83</answer>.')
    # the SFT target: the answer alone, whatever think text the config gives
    assert templates.answer_text(3.5, 9.0, "ignored", "default_no_think") == "<answer>3.50 to 9.00</answer>"
    assert templates.answer_text(12.345, 17.8, template="timelens") == "The event happens in 12.35 - 17.80 seconds"
    assert templates.answer_text(3.5, 9.0, "x", "default") == "<think>x</think><answer>3.50 to 9.00</answer>"
    assert [p["type"] for p in templates.conversation("q", "default_no_think")[0]["content"]] == ["text", "video"]


def test_timelens2_template_is_its_93k_prompt_and_set_targets_are_json():
    # MCG-NJU/TimeLens2 @a5ce450, grpo/configs/data/timelens2.json, "timelens2-93k" prompt_template
    assert templates.instruction("a dog jumps", "timelens2") == (
        'You are given a video.\nTask: temporal retrieval.\nGiven the query: "a dog jumps", return ALL time spans (in '
        "seconds) where the query is relevant.\nOutput format MUST be a JSON array of [start, end] pairs, e.g. [[0, "
        "3.5], [10, 12]].\n")
    spans = [(3.5, 9.0), (14.2, 17.83)]
    assert templates.answer_set_text(spans, template="timelens2") == "[[3.50, 9.00], [14.20, 17.83]]"
    assert templates.answer_set_text(spans, "x", "default_multi") == "<think>x</think><answer>[[3.50, 9.00], [14.20, 17.83]]</answer>"
    assert templates.answer_set_text(spans, "x", "default") == "<think>x</think><answer>3.50 to 17.83</answer>"
    for name in ("timelens2", "default_multi"):
        assert format_reward([templates.answer_set_text(spans, "x", name)], prompt_template=name) == [1.0]


def test_timelens_100k_prompt_keeps_its_typo_and_baked_prompts_split_back():
    """TimeLens2's TimeLens-100K template (grpo/configs/data/timelens2.json), ``[[start, end]]]`` as written there."""
    assert templates.instruction("a man sits", "timelens_100k") == (
        "Please find the visual event described by the sentence 'a man sits', determining its starting and ending "
        "times.\nReturn the result strictly as [[start, end]]] (in seconds).")
    for name in ("timelens2", "timelens_100k", "timelens", "default"):
        assert templates.split_prompt(templates.instruction("a man sits", name)) == ("a man sits", name)
    assert templates.split_prompt("a man sits") is None
