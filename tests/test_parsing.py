"""Answer parser."""
import pytest

from grounding_rl.reward.parsing import completion_text, extract_think, parse_answer


def wrap(answer: str) -> str:
    return f"<think>the event is near 1 to 2</think><answer>{answer}</answer>"


@pytest.mark.parametrize("answer, expected", [
    # answers that must parse
    ("12.54 to 17.83", (12.54, 17.83)),
    ("5.0s to 11.6s", (5.0, 11.6)),
    ("00:12 to 00:17", (12.0, 17.0)),
    ("12.54 - 17.83", (12.54, 17.83)),
    ("[12.54, 17.83]", (12.54, 17.83)),
    ("12.54  to  17.83", (12.54, 17.83)),
    # the rest of the grammar
    ("5.0 s to 11.6 s", (5.0, 11.6)),
    ("5 sec and 7 seconds", (5.0, 7.0)),
    ("3 SECONDS TO 4 Secs", (3.0, 4.0)),
    ("(1.5 ~ 2.5)", (1.5, 2.5)),
    ("1.5–2.5", (1.5, 2.5)),
    ("1.5-2.5", (1.5, 2.5)),
    ("01:02:03.5 to 1:02:10", (3723.5, 3730.0)),
    ("01:05.25 to 01:07", (65.25, 67.0)),
    ("\n 12.54 to 17.83 \n", (12.54, 17.83)),
    ("17.8 to 12.5", (17.8, 12.5)),  # reversed pairs are returned as written
])
def test_parses(answer, expected):
    assert parse_answer(wrap(answer)) == pytest.approx(expected)


@pytest.mark.parametrize("answer", [
    "", "12.54", "5 to 6 to 7", "about 5 or 6", "-5 to 10", "5 to -10", "12,5 to 17,8", "[1, 2)", "1 to 2]",
    "00:75 to 01:00", "1:60:00 to 2:00:00", "5sto10", "five to ten", "5 minutes to 6 minutes", "1 to 2 and 3",
])
def test_rejects_ambiguous(answer):
    assert parse_answer(wrap(answer)) is None


def test_reads_only_last_answer_block_never_think():
    assert parse_answer("<think>answer is 1 to 2</think>") is None
    assert parse_answer("12.54 to 17.83") is None
    assert parse_answer("<answer>1 to 2</answer> then <answer>3 to 4</answer>") == (3.0, 4.0)
    assert parse_answer("<answer>1 to 2</answer><answer>3 to 4") == (1.0, 2.0)  # only complete blocks
    assert parse_answer(None) is None


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
