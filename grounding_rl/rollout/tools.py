"""The crop tool: the model may ask for a closer look at a part of the video before it answers.

A conversation starts with the usual grounding prompt (the whole clip at the budget) plus one sentence offering the
tool. In each model turn the model either answers, or requests ``crop(start, end)`` in the video's absolute seconds
by writing ``<tool_call>{"name": "crop", "arguments": {"start": S, "end": E}}</tool_call>`` (Qwen's own tool-call
format, the one its chat template asks for). The environment then appends a tool turn holding the window's frames,
sampled by :func:`grounding_rl.data.video.sample_window` under the same budget as the whole clip
(:func:`grounding_rl.data.video.window_settings` ``spend="fps"``: T₁ frames of the same size spread over the window),
and the model speaks again. At most K tool calls (``max_tool_calling_iterations``, TRL 1.16's name); the K-th tool
turn says that the next turn must answer (the *forced answer*).

Two protocols (:attr:`grounding_rl.family.Family.tool_protocol`):

- ``native`` (Qwen3-VL): the chat template's own ``tools`` list (the crop schema, :data:`CROP_TOOL`, in the system
  turn) and its ``tool`` role, which it renders as a user turn wrapping ``<tool_response> … </tool_response>``; the
  window's frames carry their true absolute timestamps (``<t seconds>``).
- ``text`` (Qwen2.5-VL, whose template has no tools, and the demo's tiny model): the same ``<tool_call>`` JSON,
  described in the user's instruction (:data:`TEXT_PROTOCOL`), the tool turn a plain user turn. Qwen2.5-VL's time is
  positional and starts at the window's first frame; the tool turn's text states the window's absolute span and the
  answer is always read as absolute seconds.

A malformed request (no closing tag, not JSON, another tool name, missing or non-numeric arguments, start ≥ end) or
one outside the video gets a short error turn (:func:`error_text`), never a crash, and is counted as a failure, as
TRL counts ``tool_failure_count``.

Everything here is pure (text in, text out) except :class:`CropEnvironment`, which decodes frames.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from grounding_rl.data.video import SampledVideo, VideoSettings
from grounding_rl.prompts.preprocessing import CheckedSettings

CROP = "crop"
NATIVE, TEXT = "native", "text"
PROTOCOLS = (NATIVE, TEXT)
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
BOUND_TOLERANCE = 0.01  # seconds a request may pass the video's ends (its two-decimal rounding) before it is refused


@dataclass(frozen=True)
class ToolSettings(CheckedSettings):
    """The crop-call limit K, declared here once: ``max_tool_calling_iterations`` (TRL 1.16's name) in ``train``'s and
    ``sft``'s YAML, ``--max-tool-calling-iterations`` (alias ``--max-turns``, below 0 refused) on ``eval``, ``infer``."""

    max_tool_calling_iterations: int | None = field(default=None, metadata={
        "minimum": 0, "metavar": "K", "help": "the crop tool (TRL's cap on tool-calling turns): at most K "
        "crop(start, end) requests per query, then an answer is required; none or 0 = one turn, no tool. train: "
        "multi-turn GRPO, each model turn up to max_completion_length tokens; sft: the K that crop trajectories "
        "offer (only with crop_trajectory_fraction > 0); eval, infer: each prediction keeps its conversation"})


# The crop tool as a JSON function schema (the ``tools`` argument of a chat template, OpenAI / Qwen format).
CROP_TOOL = {
    "type": "function",
    "function": {
        "name": CROP,
        "description": "Look closer at a part of the video: returns its frames from start to end (seconds of the "
                       "whole video) at a higher frame rate.",
        "parameters": {
            "type": "object",
            "properties": {"start": {"type": "number", "description": "start of the part, seconds"},
                           "end": {"type": "number", "description": "end of the part, seconds"}},
            "required": ["start", "end"],
        },
    },
}

# The sentence added to the user's instruction: the whole protocol for Qwen2.5-VL and the demo, a reminder of the
# limit for Qwen3-VL (whose system turn lists the tool).
TEXT_PROTOCOL = (
    "\n\nBefore answering you may look closer at a part of the video, at most [K] times: write only "
    '<tool_call>{"name": "crop", "arguments": {"start": S, "end": E}}</tool_call> with S and E in seconds of the '
    "video, and its frames will follow."
)
NATIVE_PROTOCOL = "\n\nBefore answering you may call crop to look closer at a part of the video, at most [K] times."
FINAL_NOTE = "No more crops: answer now."


@dataclass(frozen=True)
class ToolRequest:
    """What one model turn asked for.

    Attributes:
        kind: ``answer`` (no tool call: the turn is the final answer), ``call`` (a valid crop) or ``error``.
        window: ``(start, end)`` seconds for a ``call``, else None.
        error: a short reason for an ``error`` (shown to the model in the error turn), else None.
    """

    kind: str
    window: tuple[float, float] | None = None
    error: str | None = None


def parse_tool_call(text: str, duration: float) -> ToolRequest:
    """Read one model turn: an answer, a valid ``crop`` request, or an error.

    Rules: no ``<tool_call>`` → ``answer``. Otherwise exactly one ``<tool_call>…</tool_call>`` holding a JSON object
    ``{"name": "crop", "arguments": {"start": S, "end": E}}`` (``arguments`` may also be a JSON string, as some
    models write it) with finite numbers 0 ≤ S < E ≤ duration (each end within :data:`BOUND_TOLERANCE` seconds; S, E
    then clamped into [0, duration]) → ``call``; anything else → ``error`` with the reason.

    Args:
        text: the decoded model turn (special tokens skipped).
        duration: the video's length, seconds (> 0).

    Returns:
        :class:`ToolRequest`. E.g. ``'<tool_call>{"name": "crop", "arguments": {"start": 4, "end": 9.5}}</tool_call>'``,
        duration 30 → ``ToolRequest("call", (4.0, 9.5))``; the same with end 31 → ``error`` "the window 4.00-31.00 s
        is outside the video (0.00-30.00 s)".
    """
    if TOOL_CALL_OPEN not in text:
        return ToolRequest("answer")
    calls = _CALL.findall(text)
    if not calls:
        return ToolRequest("error", error="the tool call has no closing </tool_call>")
    if len(calls) > 1 or text.count(TOOL_CALL_OPEN) > 1:
        return ToolRequest("error", error="one crop per turn")
    try:
        call = json.loads(calls[0])
    except json.JSONDecodeError:
        return ToolRequest("error", error="the tool call is not valid JSON")
    if not isinstance(call, dict) or call.get("name") != CROP:
        return ToolRequest("error", error=f"the only tool is {CROP}")
    arguments = call.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ToolRequest("error", error="the arguments are not valid JSON")
    if not isinstance(arguments, dict) or "start" not in arguments or "end" not in arguments:
        return ToolRequest("error", error="crop needs start and end")
    try:
        start, end = float(arguments["start"]), float(arguments["end"])
    except (TypeError, ValueError):
        return ToolRequest("error", error="start and end must be numbers of seconds")
    if not (math.isfinite(start) and math.isfinite(end)):
        return ToolRequest("error", error="start and end must be numbers of seconds")
    if start >= end:
        return ToolRequest("error", error="start must be before end")
    if start < -BOUND_TOLERANCE or end > duration + BOUND_TOLERANCE:
        return ToolRequest("error", error=f"the window {start:.2f}-{end:.2f} s is outside the video "
                                          f"(0.00-{duration:.2f} s)")
    return ToolRequest("call", (max(0.0, start), min(float(duration), end)))


def call_text(window: tuple[float, float]) -> str:
    """A model turn requesting ``window``, as :data:`TEXT_PROTOCOL` asks for it (both protocols; the inverse of
    :func:`parse_tool_call`): ``'<tool_call>{"name": "crop", "arguments": {"start": 4.0, "end": 9.5}}</tool_call>'``
    for ``(4.0, 9.5)``, the seconds rounded to two decimals (what the environment then samples) and whole seconds
    written as integers (``"start": 4``)."""
    arguments = {key: int(v) if v == int(v) else v
                 for key, v in (("start", round(float(window[0]), 2)), ("end", round(float(window[1]), 2)))}
    return f"{TOOL_CALL_OPEN}{json.dumps({'name': CROP, 'arguments': arguments})}{TOOL_CALL_CLOSE}"


def error_text(request: ToolRequest, duration: float, final: bool = False) -> str:
    """The short error turn for a refused request: ``"Error: <reason>. Call crop with 0 <= start < end <= 30.00, or
    answer."``; with ``final`` (no call left) it ends with :data:`FINAL_NOTE` instead."""
    tail = FINAL_NOTE if final else f"Call crop with 0 <= start < end <= {duration:.2f}, or answer."
    return f"Error: {request.error}. {tail}"


def window_text(window: SampledVideo, final: bool = False) -> str:
    """The text of a tool turn with a window: ``"Frames 4.00-9.50 s of the video (16 frames at 2.91 fps):"`` — the
    window's absolute span (Qwen2.5-VL's positional time starts at its first frame, so the text carries where it
    is), then :data:`FINAL_NOTE` when no call is left. The frames follow the text."""
    start, end = window.window
    text = f"Frames {start:.2f}-{end:.2f} s of the video ({window.num_frames} frames at {window.sampled_fps:.2f} fps):"
    return f"{FINAL_NOTE} {text}" if final else text


def offer_text(protocol: str, max_turns: int) -> str:
    """The sentence appended to the user's instruction offering the tool (``[K]`` filled with ``max_turns``)."""
    return (TEXT_PROTOCOL if protocol == TEXT else NATIVE_PROTOCOL).replace("[K]", str(max_turns))


def first_messages(instruction_text: str, video_first: bool, protocol: str, max_turns: int) -> list[dict]:
    """The first user turn: the template's instruction plus :func:`offer_text`, and the whole clip (before or after
    the text, as the template puts it). Text before the clip ends with a newline: Qwen3-VL's ``released`` layout
    writes the first ``<t seconds>`` right after it, and the offer's final "." would tokenize with its "<" as one
    token (".<"), which vLLM, expanding the video's tokens on their own, would not reproduce."""
    offer = offer_text(protocol, max_turns) + ("" if video_first else "\n")
    parts = [{"type": "text", "text": instruction_text + offer}, {"type": "video"}]
    return [{"role": "user", "content": parts[::-1] if video_first else parts}]


def tool_message(protocol: str, text: str, with_video: bool) -> dict:
    """A tool turn: role ``tool`` (native) or ``user`` (text), its ``text`` then the window's video placeholder when
    ``with_video`` (an error turn has none)."""
    content = [{"type": "text", "text": text}] + ([{"type": "video"}] if with_video else [])
    return {"role": "tool" if protocol == NATIVE else "user", "content": content}


def render(processor, messages: list[dict], protocol: str, generation_prompt: bool) -> str:
    """The chat-templated text of ``messages`` (``tools=[CROP_TOOL]`` for the native protocol)."""
    kwargs = {"tools": [CROP_TOOL]} if protocol == NATIVE else {}
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs)


def turn_suffix(processor, messages: list[dict], tool: dict, protocol: str) -> str:
    """The text that follows a model turn ending in its end-of-turn token (``<|im_end|>``, sampled as EOS): the
    template's rendering of ``messages + [tool]`` with the generation prompt, minus that of ``messages`` (ending with
    the model's turn), starting from the newline after ``<|im_end|>``. The model's sampled ids plus these tokens are
    then exactly the chat template's conversation.

    Raises:
        RuntimeError: the template does not render the longer conversation as an extension of the shorter one.
    """
    before = render(processor, messages, protocol, generation_prompt=False)
    after = render(processor, messages + [tool], protocol, generation_prompt=True)
    end = "<|im_end|>\n"
    if not after.startswith(before) or not before.endswith(end):
        raise RuntimeError("the chat template does not extend a conversation turn by turn")
    return "\n" + after[len(before):]


class CropEnvironment:
    """Samples a requested window under the whole clip's budget.

    Args:
        settings: the run's video settings (the family's pixel factor applied).
        spend: what the window spends the clip's budget on (:func:`grounding_rl.data.video.window_settings`;
            ``fps``, the default, or ``resolution``).
    """

    def __init__(self, settings: VideoSettings, spend: str = "fps"):
        self.settings, self.spend = settings, spend

    def __call__(self, clip: SampledVideo, window: tuple[float, float]) -> tuple[SampledVideo | None, str | None]:
        """The window ``(start, end)`` seconds of ``clip``'s video sampled by seeking under the clip's budget
        (:func:`grounding_rl.data.video.sample_window`, ``window_settings``; timestamps stay absolute seconds):
        ``(window clip, None)``, or ``(None, why)`` when it cannot be sampled (``WindowError``, ``VideoLoadError``,
        ``ValueError``). The zoom's pass 2 samples its window here too."""
        from grounding_rl.data.video import VideoLoadError, WindowError, sample_window, window_settings

        try:
            settings = window_settings(self.settings, clip.sampling(), window, self.spend)
            return sample_window(clip.path, window[0], window[1], settings), None
        except (WindowError, VideoLoadError, ValueError) as err:
            return None, str(err)
