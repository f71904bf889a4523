"""Read a model's answer: one ``(start, end)`` interval in seconds, from the answers that models actually write.

Where the interval is read: the last complete ``<answer>…</answer>`` block when there is one; otherwise (an untagged
answer such as TimeLens's ``The event happens in 3.0 - 7.5 seconds.``) the whole text with every ``<think>…</think>``
block removed (an unclosed ``<think>`` hides everything after it, and an ``<answer>`` without its closing tag gives
None: a cut-off answer is never guessed at). Numbers inside ``<think>`` are never read.

Grammar (a scan into tokens, then a search for intervals; case-insensitive, whitespace and other punctuation free)::

    time      := clock | number [ unit ]
    number    := digits [ "." digits* ] | "." digits            "17.8." is 17.8 then a full stop
    clock     := digits ":" ss [ ":" ss ] [ "." digits ]          mm:ss or hh:mm:ss, ss in 00..59 (00:12, 1:02:03.5)
    unit      := "s" | "sec" | "secs" | "second" | "seconds" | "秒"
    joiner    := "to" | "until" | "till" | "through" | "and" | "到" | "至" | "-" | "–" | "—" | "~" | "～" | "," | "，"
    interval  := time joiner time                               e.g. "3 to 7 seconds", "between 3 and 7", "[3, 7]",
                                                                "from 00:03 to 00:07", "3秒到7秒", "3.0 - 7.5 seconds."
    labelled  := start-word … time   and   end-word … time      "start: 3, end: 7", "starts at 3s and ends at 7s"
    start-word := "start" | "starts" | "starting" | "begin" | "begins" | "beginning" | "开始"
    end-word  := "end" | "ends" | "ending" | "finish" | "finishes" | "结束"   (up to 3 filler words such as "time",
                                                                "at", "is", "about" and ":" between word and time)

Words around the interval ("about", "from", "between", "The event happens in") are ignored. The reading is the one
interval found; the pair is returned as written (a reversed pair too: the reward policy,
``grounding_rl.reward.rewards.query_iou``, scores it 0). None — never a guess — when:

* no interval, or a single number ("at 5 seconds");
* two different intervals ("1 to 2 and 3", "5 to 6 to 7", decimal commas "12,5 to 17,8"), or labels that disagree
  with the interval;
* a negative number ("-5 to 10", "5 to -10": a dash not preceded by a time is a sign), a non-finite one (a 400-digit
  number is ``inf``), or a malformed clock ("00:75");
* a time in another unit anywhere ("5 to 6 minutes", "2 min", "frames", "ms", "分钟").

The scan is one pass of a regular expression whose alternatives each consume a run of one character class, and the
search is one pass over the tokens, so the time is linear in the text's length on any input.
"""
from __future__ import annotations

import math
import re
from fractions import Fraction

_TOKEN_RE = re.compile(
    r"(?P<num>\d+(?::\d+)*(?:\.\d*)?|\.\d+)"  # a number or a clock
    r"|(?P<word>[a-zA-Z]+|[^\W\d_])"  # a Latin word, or one other letter (a CJK character is a word)
    r"|(?P<dash>[-–—~～−])"
    r"|(?P<comma>[,，])"
    r"|(?P<space>\s+)"
    r"|(?P<other>.)",
    re.DOTALL,
)
_UNITS = {"s", "sec", "secs", "second", "seconds", "秒"}
_FOREIGN_UNITS = {"m", "min", "mins", "minute", "minutes", "h", "hr", "hrs", "hour", "hours", "ms", "msec",
                  "millisecond", "milliseconds", "frame", "frames", "分", "钟", "小", "毫", "帧"}
_JOINER_WORDS = {"to", "until", "till", "through", "thru", "and", "到", "至"}
_START_WORDS = {"start", "starts", "starting", "begin", "begins", "beginning", "开", "始"}
_END_WORDS = {"end", "ends", "ending", "finish", "finishes", "结", "束"}
_FILLERS = {"time", "at", "is", "about", "around", "approximately", "roughly", "from", "of", "the", "timestamp",
            "point", "in", "于", "在", "间", "时"}
_MAX_FILLERS = 3

_TIME, _JOIN, _UNIT, _FOREIGN, _START, _END, _FILL, _BREAK = range(8)
# a word's kind: the first set that holds it (else _BREAK)
_WORD_KINDS = ((_UNIT, _UNITS), (_FOREIGN, _FOREIGN_UNITS), (_JOIN, _JOINER_WORDS), (_START, _START_WORDS),
               (_END, _END_WORDS), (_FILL, _FILLERS))


def _clock_seconds(text: str, number=float):
    """``"01:02:03.5"`` → 3723.5; ``"00:12"`` → 12.0 (``number``: float, or Fraction for the exact value). None for
    more than three fields, an inner field that is not two digits, or a minutes/seconds field of 60 or more."""
    *head, last = text.split(":")
    if len(head) > 2 or any(len(f) != 2 for f in head[1:]) or len(last.split(".")[0]) != 2:
        return None
    seconds = number(last)
    if seconds >= 60 or any(float(f) >= 60 for f in head[1:]):
        return None
    total = number(0)
    for field in head:
        total = total * 60 + number(field)
    return total * 60 + seconds


def _tokens(text: str, exact: bool = False) -> list[tuple[int, object]]:
    """``[(kind, value)]``: times carry their seconds (None when malformed or not finite as a float; a Fraction of the
    written decimals when ``exact``), spaces dropped."""
    out: list[tuple[int, object]] = []
    for match in _TOKEN_RE.finditer(text):
        kind = match.lastgroup
        value = match.group()
        if kind == "num":
            seconds = _clock_seconds(value) if ":" in value else float(value)
            if seconds is not None and math.isfinite(seconds) and exact:
                seconds = _clock_seconds(value, Fraction) if ":" in value else Fraction(value)
            out.append((_TIME, seconds if seconds is not None and math.isfinite(seconds) else None))
        elif kind == "word":
            word = value.lower()
            out.append((next((kind for kind, words in _WORD_KINDS if word in words), _BREAK), word))
        elif kind == "dash":
            attached = match.end() < len(text) and (text[match.end()].isdigit() or text[match.end()] == ".")
            out.append((_JOIN, "sign" if attached else value))
        elif kind == "comma":
            out.append((_JOIN, value))
        elif kind == "other" and value in ":：":
            out.append((_FILL, value))
        elif kind == "other" and value not in ".。!！\"'“”「」*`()[]（）【】<>/":
            out.append((_BREAK, value))
    return out


def _read(text: str, exact: bool = False) -> tuple | None:
    tokens = _tokens(text, exact)
    pairs: set[tuple[float, float]] = set()
    starts: set[float] = set()
    ends: set[float] = set()
    n = len(tokens)
    for i, (kind, value) in enumerate(tokens):
        if kind == _FOREIGN and i > 0 and tokens[i - 1][0] == _TIME:
            return None
        if kind != _TIME:
            continue
        if value is None:
            return None
        previous = tokens[i - 1] if i > 0 else (_BREAK, None)
        if previous == (_JOIN, "sign") and (i < 2 or tokens[i - 2][0] not in (_TIME, _UNIT)):
            return None  # a sign: "-5 to 10", "5 to -10" (a dash written against the number, after no time)
        j = i + 1
        if j < n and tokens[j][0] == _UNIT:
            j += 1
        if j + 1 < n and tokens[j][0] == _JOIN and tokens[j + 1][0] == _TIME:
            second = tokens[j + 1][1]
            if second is None:
                return None
            pairs.add((value, second))
        # labelled: walk back over at most _MAX_FILLERS fillers to a start/end word
        k, fillers = i - 1, 0
        while k >= 0 and tokens[k][0] == _FILL and fillers < _MAX_FILLERS:
            k, fillers = k - 1, fillers + 1
        if k >= 0 and tokens[k][0] == _START:
            starts.add(value)
        elif k >= 0 and tokens[k][0] == _END:
            ends.add(value)
    if len(starts) > 1 or len(ends) > 1:
        return None
    if starts and ends:
        pairs.add((starts.pop(), ends.pop()))
    elif starts or ends:
        if len(pairs) == 1:
            (s, e), = pairs
            if (starts and starts != {s}) or (ends and ends != {e}):
                return None
    if len(pairs) != 1:
        return None
    return pairs.pop()


def _answer_region(text: str) -> str | None:
    """The last complete answer block; else the text without think blocks; None for a dangling ``<answer>``."""
    close = text.rfind("</answer>")
    if close >= 0:
        open_ = text.rfind("<answer>", 0, close)
        if open_ >= 0:
            return text[open_ + len("<answer>"):close]
    parts, position = [], 0
    while True:
        start = text.find("<think>", position)
        if start < 0:
            parts.append(text[position:])
            break
        parts.append(text[position:start])
        end = text.find("</think>", start)
        if end < 0:
            break  # an unclosed think block hides the rest
        position = end + len("</think>")
    rest = "".join(parts)
    if "<answer>" in rest:
        return None
    return rest


def parse_answer(text: str | None, exact: bool = False) -> tuple | None:
    """Parse a completion into ``(start, end)`` seconds under the module's grammar (lenient in form, strict about
    ambiguity). Examples: ``"<answer>12.54 to 17.83</answer>"``, ``"<answer>5.0s to 11.6s</answer>"``,
    ``"<answer>00:12 to 00:17</answer>"`` → (12.0, 17.0), ``"<answer>[12.54, 17.83]</answer>"``,
    ``"The event happens in 3.0 - 7.5 seconds."`` → (3.0, 7.5), ``"<answer>between 3 and 7.</answer>"`` → (3.0, 7.0),
    ``"<answer>1 to 2 and 3</answer>"`` → None. Linear time in ``len(text)``. Never raises on a string; non-string
    input (e.g. None) gives None. ``exact=True``: the same reading, the two times as :class:`fractions.Fraction` of
    the decimals as written (``"11.6"`` → 58/5; what the ``standard`` scoring compares).
    """
    if not isinstance(text, str):
        return None
    region = _answer_region(text)
    return None if region is None else _read(region, exact)


def extract_think(text: str | None) -> str | None:
    """The reasoning inside the last complete ``<think>…</think>`` block, stripped; None when there is none."""
    if not isinstance(text, str):
        return None
    close = text.rfind("</think>")
    open_ = text.rfind("<think>", 0, close) if close >= 0 else -1
    return text[open_ + len("<think>"):close].strip() if open_ >= 0 else None


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


# ------------------------------------------------------------------------------------------------ several spans (sets)
_JSON_NUMBER = r"\s*(\d+(?:\.\d+)?)\s*"
_JSON_PAIR = r"\[" + _JSON_NUMBER + "," + _JSON_NUMBER + r"\]"
# One JSON array of [start, end] pairs. A match attempt that starts at "[[" cannot run past the next "[[" (after a
# pair only "," + "[" + number or "]" continue it), so finditer is linear in the text's length.
_JSON_SPANS_RE = re.compile(r"\[\s*" + _JSON_PAIR + r"(?:\s*,\s*" + _JSON_PAIR + r")*\s*\]")
_PAIR_IN_ARRAY_RE = re.compile(_JSON_PAIR)
_RANGE_JOINERS = {"to", "until", "till", "through", "thru", "到", "至", "-", "–", "—", "~", "～", "−", "sign"}
_SEPARATORS = {"and", ",", "，"}


def json_spans(text: str) -> list[tuple[float, float]] | None:
    """The pairs of the one JSON array of ``[start, end]`` pairs in ``text`` (non-negative plain decimals),
    in written order; None when there is none, when two different arrays appear, or a value is not finite."""
    found = {m.group() for m in _JSON_SPANS_RE.finditer(text)}
    if len({re.sub(r"\s+", "", f) for f in found}) != 1:
        return None
    pairs = [(float(a), float(b)) for a, b in _PAIR_IN_ARRAY_RE.findall(found.pop())]
    return pairs if all(math.isfinite(t) for pair in pairs for t in pair) else None


def _read_many(tokens: list[tuple[int, object]]) -> list[tuple[float, float]] | None:
    """Several intervals written one after another: chains ``t J t [S t J t …]`` with J a range joiner ("to", "-")
    and S a separator ("and", ","); a chain of two times is one interval with any joiner (as :func:`_read`).
    None for any chain of odd length or with joiners out of place, a labelled time, or a bad number."""
    pairs: list[tuple[float, float]] = []
    n, i = len(tokens), 0
    while i < n:
        kind, value = tokens[i]
        if kind in (_START, _END) or (kind == _FOREIGN and i > 0 and tokens[i - 1][0] == _TIME):
            return None
        if kind != _TIME:
            i += 1
            continue
        if value is None:
            return None
        previous = tokens[i - 1] if i > 0 else (_BREAK, None)
        if previous == (_JOIN, "sign") and (i < 2 or tokens[i - 2][0] not in (_TIME, _UNIT)):
            return None
        times, joiners = [float(value)], []
        j = i + 1
        while True:
            if j < n and tokens[j][0] == _UNIT:
                j += 1
            if j + 1 < n and tokens[j][0] == _JOIN and tokens[j + 1][0] == _TIME:
                if tokens[j + 1][1] is None:
                    return None
                joiners.append(tokens[j][1])
                times.append(float(tokens[j + 1][1]))
                j += 2
            else:
                break
        if len(times) % 2 and len(times) > 1:
            return None
        if len(times) > 2 and not (all(joiners[k] in _RANGE_JOINERS for k in range(0, len(joiners), 2))
                                   and all(joiners[k] in _SEPARATORS for k in range(1, len(joiners), 2))):
            return None
        pairs += [(times[k], times[k + 1]) for k in range(0, len(times) - 1, 2)]
        i = j
    return pairs or None


def parse_spans(text: str | None) -> list[tuple[float, float]] | None:
    """Parse a completion into a set of ``(start, end)`` intervals in seconds, in written order, as written (a repeated
    interval stays repeated: the set rewards merge it away, the ``qvhighlights`` scoring counts it as moment_detr does;
    reversed pairs kept as written: the reward policy scores them).

    Read in the answer region of :func:`parse_answer`: (1) a single interval under the module grammar, exactly as
    :func:`parse_answer` reads it (so whatever it reads gives ``[parse_answer(text)]``); else (2) one JSON array of
    pairs, ``[[0, 3.5], [10, 12]]``, bare or inside ``<answer>`` (TimeLens2's answer), with no other number outside
    it; else (3) several intervals, ``"0 to 3.5 and 10 to 12"``, ``"0 - 3.5, 10 - 12 seconds"``. None — never a guess —
    for two different arrays, numbers beside the array, a chain such as ``"1 to 2 and 3"`` or ``"1 to 2 to 3 to 4"``,
    labels ("start: 3") beside several intervals, and every refusal of the single grammar. Linear time.
    """
    if not isinstance(text, str):
        return None
    region = _answer_region(text)
    if region is None:
        return None
    single = _read(region)
    if single is not None:
        return [single]
    if _JSON_SPANS_RE.search(region):
        spans = json_spans(region)
        rest = _JSON_SPANS_RE.sub(" ", region)
        if spans is None or any(kind == _TIME for kind, _ in _tokens(rest)):
            return None
        return spans
    return _read_many(_tokens(region))
