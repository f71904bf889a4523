"""Read a model's answer: the ``(start, end)`` interval inside ``<answer>…</answer>``, in seconds.

Grammar of the answer block (whitespace around every token is free; units and words are case-insensitive)::

    answer   := [ "[" | "(" ] time joiner time [ "]" | ")" ]     brackets must match when present
    time     := clock | number [ unit ]
    number   := digits [ "." digits* ] | "." digits               no sign: "-" is always a joiner
    clock    := digits ":" ss [ ":" ss ] [ "." digits ]           mm:ss or hh:mm:ss, ss in 00..59
    unit     := "s" | "sec" | "secs" | "second" | "seconds"
    joiner   := "to" | "and" | "-" | "–" | "—" | "~" | ","

Anything else (one or three numbers, a negative number, "about 5 or 6", decimal commas such as "12,5 to 17,8", an
empty block) is ambiguous and gives None rather than a guess. A reversed pair is returned as written; the reward
policy (``grounding_rl.reward.rewards.query_iou``) scores it 0.
"""
from __future__ import annotations

import re

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)

_TIME = r"""
    (?: (?P<{n}_clock> \d+ (?: : \d{{2}} ){{1,2}} (?: \. \d+ )? )
      | (?P<{n}_num> \d+ (?: \. \d* )? | \. \d+ ) (?: \s* (?: seconds? | secs? | s ) (?![a-z]) )?
    )"""
_JOINER = r"(?: (?<![a-z]) (?: to | and ) (?![a-z]) | - | – | — | ~ | , )"
_RANGE_RE = re.compile(
    rf"""\s* (?P<open> [\[(] )? \s* {_TIME.format(n='a')} \s* {_JOINER} \s* {_TIME.format(n='b')} \s*
        (?P<close> [\])] )? \s*""",
    re.IGNORECASE | re.VERBOSE,
)
_BRACKETS = {None: None, "[": "]", "(": ")"}


def _clock_seconds(text: str) -> float | None:
    """``"01:02:03.5"`` → 3723.5; ``"00:12"`` → 12.0. None when a minutes/seconds field is 60 or more."""
    *head, last = text.split(":")
    seconds = float(last)
    if seconds >= 60 or any(int(f) >= 60 for f in head[1:]):
        return None
    total = 0.0
    for field in head:
        total = total * 60 + int(field)
    return total * 60 + seconds


def _time(match: re.Match, name: str) -> float | None:
    clock = match.group(f"{name}_clock")
    return _clock_seconds(clock) if clock is not None else float(match.group(f"{name}_num"))


def parse_answer(text: str | None) -> tuple[float, float] | None:
    """Parse the last ``<answer>…</answer>`` block of ``text`` into ``(start, end)`` seconds.

    Only the last complete answer block is read (never the ``<think>`` text); no block → None. The block must match
    the grammar in this module's docstring exactly, else None. Examples: ``"12.54 to 17.83"``, ``"5.0s to 11.6s"``,
    ``"00:12 to 00:17"`` → (12.0, 17.0), ``"12.54 - 17.83"``, ``"[12.54, 17.83]"``. The pair is returned as written,
    reversed or not. Never raises on a string; non-string input (e.g. None) gives None.
    """
    if not isinstance(text, str):
        return None
    blocks = _ANSWER_RE.findall(text)
    if not blocks:
        return None
    match = _RANGE_RE.fullmatch(blocks[-1])
    if match is None or _BRACKETS[match.group("open")] != match.group("close"):
        return None
    start, end = _time(match, "a"), _time(match, "b")
    if start is None or end is None:
        return None
    return start, end


def extract_think(text: str | None) -> str | None:
    """The reasoning inside the last complete ``<think>…</think>`` block, stripped; None when there is none."""
    if not isinstance(text, str):
        return None
    blocks = _THINK_RE.findall(text)
    return blocks[-1].strip() if blocks else None


def completion_text(completion) -> str:
    """The text of one completion as TRL passes it to reward functions.

    TRL gives a plain string for standard prompts and a list of messages (``[{"role": "assistant", "content": ...}]``)
    for conversational ones; ``content`` may itself be a list of parts (``{"type": "text", "text": ...}``). The texts
    of all messages are concatenated. Raises TypeError for anything else.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)):
        parts = []
        for message in completion:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts += [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            elif content is not None:
                raise TypeError(f"completion message content must be str or list of parts, got {type(content)}")
        return "".join(parts)
    raise TypeError(f"completion must be a string or a list of messages, got {type(completion).__name__}")
