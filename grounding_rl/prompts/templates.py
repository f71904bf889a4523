"""Prompt templates: the think/answer instruction around the query, as a chat conversation with the video.

A checkpoint must be evaluated with the prompt it was trained with, so the template is a named choice saved in every
checkpoint's ``grounding_config.json`` (see :mod:`grounding_rl.prompts.preprocessing`). :func:`answer_text` writes a
ground-truth interval in the answer format the templates ask for (the SFT target).

Thinking-free templates (``default_no_think``, ours; ``timelens``, TimeLens's own prompt) ask for the answer alone,
without a ``<think>`` block: TimeLens (arXiv:2512.14698, its training-paradigm ablation) trains GRPO this way. The
format reward then checks the answer-only form (a think block present scores 0), the SFT target has no think block,
and the answer parser reads the interval as before. Switching is the one ``prompt_template`` key, the same in the SFT
and GRPO configs.
"""
from __future__ import annotations

from dataclasses import dataclass

EVENT = "[EVENT]"
DURATION = "[DURATION]"  # the video's length in whole seconds ("{:.0f}"), for prompts that state it

# Answer formats: what a template asks the model to write, so the format reward accepts exactly that.
THINK_ANSWER = "think_answer"  # <think>…</think><answer>S to E</answer>, S and E plain seconds ("12.54 to 17.83")
ANSWER_ONLY = "answer_only"  # <answer>S to E</answer> alone, no think block ("<answer>12.54 to 17.83</answer>")
TIMELENS = "timelens"  # untagged "The event happens in S - E seconds" (TencentARC/TimeLens, evaluation/utils.py)
# Interval sets: a JSON array of [start, end] pairs.
JSON_SPANS = "json_spans"  # the array alone, bare or inside <answer></answer>, no think block (TimeLens2)
THINK_JSON_SPANS = "think_json_spans"  # <think>…</think><answer>[[S, E], …]</answer>
ANSWER_FORMATS = (THINK_ANSWER, ANSWER_ONLY, TIMELENS, JSON_SPANS, THINK_JSON_SPANS)
# The answer formats without a think block (thinking-free templates).
THINKING_FREE_FORMATS = (ANSWER_ONLY, TIMELENS, JSON_SPANS)
# The answer formats that ask for every span (an interval set) rather than one interval.
SET_FORMATS = (JSON_SPANS, THINK_JSON_SPANS)


@dataclass(frozen=True)
class PromptTemplate:
    """A named prompt: the user text around the query, where the video goes, and the answer format it asks for.

    Attributes:
        text: the instruction, with ``[EVENT]`` where the query goes.
        answer_format: one of :data:`ANSWER_FORMATS`.
        video_first: the video part comes before the text in the user turn (TimeLens) instead of after it (TimeZero,
            Time-R1, VideoChat-R1).
        source: where the text is copied from, verbatim.
    """

    text: str
    answer_format: str = THINK_ANSWER
    video_first: bool = False
    source: str = "ours"


# TimeZero's published prompt (its trainer and evaluator use the same text): ../shared/DESIGN-NOTES.md.
TIMEZERO = (
    'To accurately pinpoint the event "[EVENT]" in the video, determine the precise time period of the event.\n\n'
    "Output your thought process within the <think> </think> tags, including analysis with either specific "
    "timestamps (xx.xx) or time ranges (xx.xx to xx.xx) in <timestep> </timestep> tags.\n\n"
    "Then, provide the start and end times (in seconds, precise to two decimal places) in the format "
    '"start time to end time" within the <answer> </answer> tags. For example: "12.54 to 17.83".'
)

# Time-R1's QUESTION_TEMPLATE_TG_v1 (xiaomi-research/time-r1, src/time_r1/rl/timer1_trainer.py): TimeZero's text
# without "specific timestamps (xx.xx) or".
TIME_R1 = (
    'To accurately pinpoint the event "[EVENT]" in the video, determine the precise time period of the event.\n\n'
    "Output your thought process within the <think> </think> tags, including analysis with either specific time "
    "ranges (xx.xx to xx.xx) in <timestep> </timestep> tags.\n\n"
    "Then, provide the start and end times (in seconds, precise to two decimal places) in the format "
    '"start time to end time" within the <answer> </answer> tags. For example: "12.54 to 17.83".'
)

# VideoChat-R1's QUESTION_TEMPLATE (OpenGVLab/VideoChat-R1, src/open_r1/trainer/grpo_trainer_video_tg.py): the same
# text as TimeZero's, character for character (its system prompt is commented out there, so none here either).
VIDEOCHAT_R1 = TIMEZERO

# TimeLens's GROUNDER_PROMPT (TencentARC/TimeLens, evaluation/utils.py), "{}" → [EVENT]; the video comes first.
TIMELENS_PROMPT = (
    "Please find the visual event described by the sentence '[EVENT]', determining its starting and ending times. "
    "The format should be: 'The event happens in <start time> - <end time> seconds'."
)

# lmms-eval's Charades-STA prompt (EvolvingLMMs-Lab/lmms-eval @75571cf, lmms_eval/tasks/charades_sta/charades.yaml
# pre_prompt + caption + ". " + post_prompt, utils.temporal_grounding_doc_to_text), typos kept ("seonds"); its
# Qwen2.5-VL backend puts the video first. Its TimeLens task's prompt is TIMELENS_PROMPT, character for character.
LMMS_CHARADES_STA = (
    "Please find the visual event described by a sentence in the video, determining its starting and ending times. "
    "The format should be: 'The event happens in the start time - end time'. For example, The event 'person turn a "
    "light on' happens in the 24.3 - 30.4 seonds. Now I will give you the textual sentence: [EVENT]. Please return its "
    "start time and end time."
)

# lmms-eval's ExtremeWhenBench prompt (lmms_eval/tasks/extremewhenbench/utils.py @75571cf, DEFAULT_PROMPT with
# {dur:.0f} → [DURATION], {question} → [EVENT]): it states the video's length.
LMMS_EXTREMEWHENBENCH = (
    "[Video Temporal Grounding]\nYou are watching a [DURATION]-second long video.\nPlease find the moment described by "
    "the following question, determining its starting and ending times. The format should be: 'The event happens in "
    "the start time - end time'. For example, The event 'person turn a light on' happens in the 24.3 - 30.4 seconds. "
    'Now I will give you the question: "[EVENT]"\nPlease return its start time and end time.'
)

# Ours: shorter (fewer prompt tokens per clip), same answer format.
DEFAULT = (
    'When does the event "[EVENT]" happen in the video? Think briefly within <think> </think> tags, then give the '
    'start and end times in seconds within <answer> </answer> tags, as "start to end", e.g. <answer>12.54 to '
    "17.83</answer>."
)

# Ours, thinking-free: the default text without the think instruction, so the two differ only in the think block.
DEFAULT_NO_THINK = (
    'When does the event "[EVENT]" happen in the video? Do not think; give only the start and end times in seconds '
    'within <answer> </answer> tags, as "start to end", e.g. <answer>12.54 to 17.83</answer>.'
)

# TimeLens2's TimeLens2-93K prompt_template (MCG-NJU/TimeLens2, grpo/configs/data/timelens2.json), "{query}" →
# [EVENT]; its dataset puts the video before the text (grpo/timelens/data/dataset.py).
TIMELENS2_PROMPT = (
    "You are given a video.\nTask: temporal retrieval.\nGiven the query: \"[EVENT]\", return ALL time spans (in "
    "seconds) where the query is relevant.\nOutput format MUST be a JSON array of [start, end] pairs, e.g. [[0, 3.5], "
    "[10, 12]].\n"
)

# TimeLens2's TimeLens-100K prompt_template (MCG-NJU/TimeLens2 @a5ce450, grpo/configs/data/timelens2.json), "{query}"
# → [EVENT], its typo "[[start, end]]]" kept: the prompt its GRPO trains that source with.
TIMELENS_100K_PROMPT = (
    "Please find the visual event described by the sentence '[EVENT]', determining its starting and ending times.\n"
    "Return the result strictly as [[start, end]]] (in seconds)."
)

# Ours, for interval sets: the default's shape, asking for every span as a JSON array.
DEFAULT_MULTI = (
    'When does the event "[EVENT]" happen in the video? It may happen more than once. Think briefly within <think> '
    "</think> tags, then give every time span in seconds within <answer> </answer> tags as a JSON array of [start, "
    "end] pairs, e.g. <answer>[[3.50, 9.00], [14.20, 17.83]]</answer>."
)

PROMPT_TEMPLATES: dict[str, PromptTemplate] = {
    "default": PromptTemplate(DEFAULT),
    "default_no_think": PromptTemplate(DEFAULT_NO_THINK, answer_format=ANSWER_ONLY),
    "timezero": PromptTemplate(TIMEZERO, source="www-Ye/TimeZero (trainer and evaluator)"),
    "time_r1": PromptTemplate(TIME_R1, source="xiaomi-research/time-r1, src/time_r1/rl/timer1_trainer.py"),
    "videochat_r1": PromptTemplate(VIDEOCHAT_R1,
                                   source="OpenGVLab/VideoChat-R1, src/open_r1/trainer/grpo_trainer_video_tg.py"),
    "timelens": PromptTemplate(TIMELENS_PROMPT, answer_format=TIMELENS, video_first=True,
                               source="TencentARC/TimeLens, evaluation/utils.py"),
    "default_multi": PromptTemplate(DEFAULT_MULTI, answer_format=THINK_JSON_SPANS),
    "timelens2": PromptTemplate(TIMELENS2_PROMPT, answer_format=JSON_SPANS, video_first=True,
                                source="MCG-NJU/TimeLens2 @a5ce450, grpo/configs/data/timelens2.json"),
    "timelens_100k": PromptTemplate(TIMELENS_100K_PROMPT, answer_format=JSON_SPANS, video_first=True,
                                    source="MCG-NJU/TimeLens2 @a5ce450, grpo/configs/data/timelens2.json"),
    "lmms_charades_sta": PromptTemplate(LMMS_CHARADES_STA, answer_format=TIMELENS, video_first=True,
                                        source="EvolvingLMMs-Lab/lmms-eval @75571cf, "
                                               "lmms_eval/tasks/charades_sta/charades.yaml"),
    "lmms_extremewhenbench": PromptTemplate(LMMS_EXTREMEWHENBENCH, answer_format=TIMELENS, video_first=True,
                                            source="EvolvingLMMs-Lab/lmms-eval @75571cf, "
                                                   "lmms_eval/tasks/extremewhenbench/utils.py"),
}
TEMPLATES: dict[str, str] = {name: t.text for name, t in PROMPT_TEMPLATES.items()}

# The think text of SFT targets: short and generic (the localisation is learned from the video, not the reasoning).
DEFAULT_THINK = "The event is visible in the video, so I find when it starts and ends."


def get_template(name: str) -> PromptTemplate:
    """The :class:`PromptTemplate` named ``name``. Raises ValueError for an unknown name (lists the known ones)."""
    if name not in PROMPT_TEMPLATES:
        raise ValueError(f"unknown prompt_template {name!r}; known: {sorted(PROMPT_TEMPLATES)}")
    return PROMPT_TEMPLATES[name]


def answer_text(start: float, end: float, think: str = DEFAULT_THINK, template: str = "default") -> str:
    """A completion in ``template``'s answer format for an interval in seconds (two decimals): the SFT target.
    ``think`` is used only by templates that ask for a think block (thinking-free ones write the answer alone).

    >>> answer_text(3.5, 9.0, "x")
    '<think>x</think><answer>3.50 to 9.00</answer>'
    >>> answer_text(3.5, 9.0, "x", template="default_no_think")
    '<answer>3.50 to 9.00</answer>'
    >>> answer_text(3.5, 9.0, template="timelens")
    'The event happens in 3.50 - 9.00 seconds'

    Raises:
        ValueError: unknown template name.
    """
    answer_format = get_template(template).answer_format
    if answer_format in SET_FORMATS:
        return answer_set_text([(start, end)], think, template)
    if answer_format == TIMELENS:
        return f"The event happens in {start:.2f} - {end:.2f} seconds"
    if answer_format == ANSWER_ONLY:
        return f"<answer>{start:.2f} to {end:.2f}</answer>"
    return f"<think>{think}</think><answer>{start:.2f} to {end:.2f}</answer>"


def spans_text(spans) -> str:
    """A JSON array of ``[start, end]`` pairs in seconds with two decimals: ``[[3.50, 9.00], [14.20, 17.83]]``."""
    return "[" + ", ".join(f"[{s:.2f}, {e:.2f}]" for s, e in spans) + "]"


def answer_set_text(spans, think: str = DEFAULT_THINK, template: str = "default_multi") -> str:
    """A completion in ``template``'s answer format for the interval set ``spans`` (seconds): the SFT target of
    multi-span data. A set template writes every span (``timelens2``: the bare array; ``default_multi``:
    ``<think>…</think><answer>[[…], …]</answer>``); a single-span template writes the hull (first start, last end) as
    :func:`answer_text` does.

    >>> answer_set_text([(3.5, 9.0), (14.2, 17.83)], template="timelens2")
    '[[3.50, 9.00], [14.20, 17.83]]'
    """
    answer_format = get_template(template).answer_format
    if answer_format == JSON_SPANS:
        return spans_text(spans)
    if answer_format == THINK_JSON_SPANS:
        return f"<think>{think}</think><answer>{spans_text(spans)}</answer>"
    return answer_text(min(s for s, _ in spans), max(e for _, e in spans), think, template)


def is_set_template(template: str) -> bool:
    """Whether ``template`` asks for every span (an interval set). Raises ValueError for an unknown name."""
    return get_template(template).answer_format in SET_FORMATS


def is_thinking_free(template: str) -> bool:
    """Whether ``template`` asks for the answer alone, without a think block (``default_no_think``, ``timelens``).
    Raises ValueError for an unknown name."""
    return get_template(template).answer_format in THINKING_FREE_FORMATS


def instruction(query: str, template: str = "default", duration: float | None = None) -> str:
    """The user text for one query; ``duration`` (seconds, the video's length) fills a template that states it
    (``[DURATION]``, written ``f"{duration:.0f}"`` as lmms-eval writes it).

    Raises:
        ValueError: unknown template name (lists the known ones); a template that states the duration without one.
    """
    text = get_template(template).text
    if DURATION in text:
        if duration is None:
            raise ValueError(f"prompt_template {template!r} states the video's duration: give it")
        text = text.replace(DURATION, f"{duration:.0f}")
    return text.replace(EVENT, query.strip())


def conversation(query: str, template: str = "default", duration: float | None = None) -> list[dict]:
    """A one-turn chat: user content is the instruction text, then the video (TimeZero's, Time-R1's and VideoChat-R1's
    order), or the video first for a ``video_first`` template (TimeLens). No system message, so Qwen's chat template
    adds its default one."""
    parts = [{"type": "text", "text": instruction(query, template, duration)}, {"type": "video"}]
    if get_template(template).video_first:
        parts.reverse()
    return [{"role": "user", "content": parts}]


def render_prompt(processor, query: str, template: str = "default", duration: float | None = None) -> str:
    """The chat-templated prompt text (with one ``<|vision_start|><|video_pad|><|vision_end|>`` placeholder that the
    processor expands to the clip's video tokens), ending with the assistant turn's opening; ``duration`` as in
    :func:`instruction`."""
    return processor.apply_chat_template(conversation(query, template, duration), tokenize=False,
                                         add_generation_prompt=True)


def split_prompt(text: str) -> tuple[str, str] | None:
    """``(query, template name)`` when ``text`` is a registered template with its ``[EVENT]`` filled in (trailing
    whitespace ignored), e.g. the prompts TimeLens2's rollout files bake into their ``query``; None otherwise.
    Templates with other placeholders are not tried; the first template that matches wins."""
    import re

    for name, template in PROMPT_TEMPLATES.items():
        body = template.text.rstrip()
        if body.count("[EVENT]") != 1 or re.search(r"\[(?!EVENT\])[A-Z_]+\]", body):
            continue
        head, tail = body.split("[EVENT]")
        found = re.fullmatch(re.escape(head) + r"(.+?)" + re.escape(tail), text.rstrip(), re.DOTALL)
        if found:
            return found.group(1), name
    return None
