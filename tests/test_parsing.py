"""Answer parser: the answers models write, read or refused, in linear time."""
import pytest

from grounding_rl.prompts.parsing import completion_text, extract_think, parse_answer


def wrap(answer: str) -> str:
    return f"<think>the event is near 1 to 2</think><answer>{answer}</answer>"


# (completion, expected reading). Tagged answers go inside <answer> after a <think> that mentions another interval.
TAGGED = [
    # the templates' own format and its usual variants
    ("12.54 to 17.83", (12.54, 17.83)),
    ("12.54  to  17.83", (12.54, 17.83)),
    ("\n 12.54 to 17.83 \n", (12.54, 17.83)),
    ("12.5 to 17.8.", (12.5, 17.8)),  # trailing full stop
    ("3 to 7 seconds.", (3.0, 7.0)),
    ("3 to 7 seconds。", (3.0, 7.0)),
    ("from 3 to 7 seconds", (3.0, 7.0)),
    ("From 3.2 to 7.9 seconds.", (3.2, 7.9)),
    ("between 3 and 7", (3.0, 7.0)),
    ("Between 3.0 and 7.5 seconds", (3.0, 7.5)),
    ("about 3.0 to 7.5", (3.0, 7.5)),
    ("approximately 3.0 to 7.5 seconds", (3.0, 7.5)),
    ("around 3 to 7", (3.0, 7.0)),
    ("start: 3, end: 7", (3.0, 7.0)),
    ("Start time: 3.2s, End time: 7.5s", (3.2, 7.5)),
    ("start 3 end 7", (3.0, 7.0)),
    ("The event starts at 3.0 seconds and ends at 7.5 seconds.", (3.0, 7.5)),
    ("It begins at 3 and finishes at 7.", (3.0, 7.0)),
    ("3 until 7", (3.0, 7.0)),
    ("3 till 7", (3.0, 7.0)),
    ("3 through 7", (3.0, 7.0)),
    ("5.0s to 11.6s", (5.0, 11.6)),
    ("5.0 s to 11.6 s", (5.0, 11.6)),
    ("5 sec and 7 seconds", (5.0, 7.0)),
    ("3 SECONDS TO 4 Secs", (3.0, 4.0)),
    ("12.54 - 17.83", (12.54, 17.83)),
    ("1.5-2.5", (1.5, 2.5)),
    ("1.5–2.5", (1.5, 2.5)),
    ("1.5 — 2.5", (1.5, 2.5)),
    ("(1.5 ~ 2.5)", (1.5, 2.5)),
    ("1.5～2.5", (1.5, 2.5)),
    ("[12.54, 17.83]", (12.54, 17.83)),
    ("[1, 2)", (1.0, 2.0)),
    ("(3.5, 9)", (3.5, 9.0)),
    ("00:12 to 00:17", (12.0, 17.0)),
    ("01:05.25 to 01:07", (65.25, 67.0)),
    ("00:03.5 - 00:07.0", (3.5, 7.0)),
    ("01:02:03.5 to 1:02:10", (3723.5, 3730.0)),
    ("00:00:03 to 00:00:07", (3.0, 7.0)),
    ("from 00:01:05 until 00:01:30", (65.0, 90.0)),
    ("3秒到7秒", (3.0, 7.0)),
    ("从3.5秒至7秒", (3.5, 7.0)),
    ("开始时间：3秒，结束时间：7秒", (3.0, 7.0)),
    (".5 to 2", (0.5, 2.0)),
    ("3. to 7.", (3.0, 7.0)),
    ("17.8 to 12.5", (17.8, 12.5)),  # reversed pairs are returned as written (the reward scores them 0)
    ("3 to 7 (3 to 7)", (3.0, 7.0)),  # the same interval twice is one reading
    ("- 3 to 7", (3.0, 7.0)),  # a bullet, not a sign
    ("**3.0 to 7.5**", (3.0, 7.5)),
    ("\"3.0 to 7.5\"", (3.0, 7.5)),
    # refused: ambiguous, a single number, negative, non-finite, other units, malformed
    ("", None),
    ("12.54", None),
    ("at 5 seconds", None),
    ("5 to 6 to 7", None),
    ("1 to 2 and 3", None),
    ("1 to 2 or 3 to 4", None),
    ("about 5 or 6", None),
    ("12,5 to 17,8", None),  # decimal commas: ambiguous
    ("-5 to 10", None),
    ("5 to -10", None),
    ("[-1.5, 3]", None),
    ("1 to " + "9" * 400, None),  # inf
    ("5 minutes to 6 minutes", None),
    ("5 to 6 minutes", None),
    ("2 min 3 s to 2 min 9 s", None),
    ("frames 30 to 90", (30.0, 90.0)),  # a unit word before the numbers is not the numbers' unit
    ("30 to 90 frames", None),
    ("3分钟到5分钟", None),
    ("00:75 to 01:00", None),
    ("1:60:00 to 2:00:00", None),
    ("5sto10", None),
    ("five to ten", None),
    ("start: 3, end: 7, or 4 to 8", None),  # labels and an interval disagree
    ("starts at 3, starts at 4, ends at 8", None),
]

UNTAGGED = [
    ("The event happens in 3.0 - 7.5 seconds.", (3.0, 7.5)),  # TimeLens's answer format
    ("The event happens in 3 - 7.5 seconds", (3.0, 7.5)),
    ("12.54 to 17.83", (12.54, 17.83)),
    ("<think>maybe 1 to 2</think> The event happens from 3 to 7 seconds.", (3.0, 7.0)),
    ("<think>maybe 1 to 2</think>", None),  # numbers in <think> are never read
    ("<think>the answer is 3 to 7", None),  # an unclosed think hides the rest
    ("<think>a</think><answer>3 to 7", None),  # a cut-off answer block is not guessed at
    ("<answer>1 to 2</answer> then <answer>3 to 4</answer>", (3.0, 4.0)),  # the last complete block
    ("<answer>1 to 2</answer><answer>3 to 4", (1.0, 2.0)),
    ("<answer>3 to 7</answer><think>9 to 10</think>", (3.0, 7.0)),
]


@pytest.mark.parametrize("answer, expected", TAGGED)
def test_reads_tagged_answers(answer, expected):
    got = parse_answer(wrap(answer))
    assert got == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize("text, expected", UNTAGGED)
def test_reads_untagged_answers_and_never_think(text, expected):
    got = parse_answer(text)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_table_is_large():
    assert len(TAGGED) + len(UNTAGGED) >= 60


def test_non_strings():
    assert parse_answer(None) is None and parse_answer(12) is None


@pytest.mark.timeout(120)  # a hang guard only: the ratio below is the check
def test_linear_time_on_hostile_input():
    """Up to 200,000 characters of whitespace, digits and brackets inside and outside the tags, parsed in time linear
    in their length: t(2n) / t(n) < 3 (a backtracking regex took minutes)."""
    from conftest import assert_linear_time

    def run(n):
        texts = [
            "<answer>" + " " * n + "</answer>",
            "<answer>" + "1" * n + "</answer>",
            " " * n, "1" * n, "[(" * (n // 2), "1 " * (n // 2), "1." * (n // 2), "1:" * (n // 2),
            "<answer>" * (n // 8), "<think>" * (n // 7) + "</answer>", "<answer>" + "[1 - " * (n // 5) + "</answer>",
            "<think>" + " " * n + "</think>" + "1 to " * (n // 5),
        ]
        for text in texts:
            parse_answer(text)
            extract_think(text)

    assert_linear_time(run, 50_000, repeat=2)
    assert parse_answer("<answer>12.5 to " + "1" * 400 + "</answer>") is None  # (12.5, inf) is no reading


def test_extract_think():
    assert extract_think("<think> a </think><think>\n b \n</think><answer>1 to 2</answer>") == "b"
    assert extract_think("<answer>1 to 2</answer>") is None


def test_completion_text_plain_and_conversational():
    assert completion_text("x<answer>1 to 2</answer>") == "x<answer>1 to 2</answer>"
    assert completion_text([{"role": "assistant", "content": "abc"}]) == "abc"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "a"},
                                                              {"type": "text", "text": "b"}]}]) == "ab"
    with pytest.raises(TypeError):
        completion_text(3)
