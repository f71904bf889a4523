"""Prompt templates: the think/answer instruction around the query, as a chat conversation with the video.

A checkpoint must be evaluated with the prompt it was trained with, so the template is a named choice saved in every
checkpoint's ``grounding_config.json`` (see :mod:`grounding_rl.prompts.preprocessing`). :func:`answer_text` writes a
ground-truth interval in the answer format the templates ask for (the SFT target).
"""
from __future__ import annotations

EVENT = "[EVENT]"

# TimeZero's published prompt (its trainer and evaluator use the same text): ../shared/DESIGN-NOTES.md.
TIMEZERO = (
    'To accurately pinpoint the event "[EVENT]" in the video, determine the precise time period of the event.\n\n'
    "Output your thought process within the <think> </think> tags, including analysis with either specific "
    "timestamps (xx.xx) or time ranges (xx.xx to xx.xx) in <timestep> </timestep> tags.\n\n"
    "Then, provide the start and end times (in seconds, precise to two decimal places) in the format "
    '"start time to end time" within the <answer> </answer> tags. For example: "12.54 to 17.83".'
)

# Ours: shorter (fewer prompt tokens per clip), same answer format.
DEFAULT = (
    'When does the event "[EVENT]" happen in the video? Think briefly within <think> </think> tags, then give the '
    'start and end times in seconds within <answer> </answer> tags, as "start to end", e.g. <answer>12.54 to '
    "17.83</answer>."
)

# TimeLens's grounding prompt for Qwen3-VL models (TencentARC/TimeLens evaluation/utils.py GROUNDER_PROMPT and
# training/data/grounding.py GROUNDING_PROMPT, verbatim; '{}' is the query). Thinking-free: the answer is
# "The event happens in <start time> - <end time> seconds".
TIMELENS = (
    "Please find the visual event described by the sentence '[EVENT]', determining its starting and ending times. "
    "The format should be: 'The event happens in <start time> - <end time> seconds'."
)

TEMPLATES: dict[str, str] = {"default": DEFAULT, "timezero": TIMEZERO, "timelens": TIMELENS}

# The think text of SFT targets: short and generic (the localisation is learned from the video, not the reasoning).
DEFAULT_THINK = "The event is visible in the video, so I find when it starts and ends."


def answer_text(start: float, end: float, think: str = DEFAULT_THINK) -> str:
    """A completion in the templates' answer format for an interval in seconds (two decimals).

    >>> answer_text(3.5, 9.0, "x")
    '<think>x</think><answer>3.50 to 9.00</answer>'
    """
    return f"<think>{think}</think><answer>{start:.2f} to {end:.2f}</answer>"


def instruction(query: str, template: str = "default") -> str:
    """The user text for one query.

    Raises:
        ValueError: unknown template name (lists the known ones).
    """
    if template not in TEMPLATES:
        raise ValueError(f"unknown prompt_template {template!r}; known: {sorted(TEMPLATES)}")
    return TEMPLATES[template].replace(EVENT, query.strip())


def conversation(query: str, template: str = "default") -> list[dict]:
    """A one-turn chat: user content is the instruction text, then the video (TimeZero's order; no system message,
    so Qwen's chat template adds its default one)."""
    return [{"role": "user", "content": [{"type": "text", "text": instruction(query, template)}, {"type": "video"}]}]


def render_prompt(processor, query: str, template: str = "default") -> str:
    """The chat-templated prompt text (with one ``<|vision_start|><|video_pad|><|vision_end|>`` placeholder that the
    processor expands to the clip's video tokens), ending with the assistant turn's opening."""
    return processor.apply_chat_template(conversation(query, template), tokenize=False, add_generation_prompt=True)
