"""The published evaluators' scorings agree exactly with the evaluators' own functions on a fixture of 336 answers
(tests/fixtures/published_scorings.json: the answers, annotations and the numbers their transcribed functions gave)."""
import json
from pathlib import Path

import pytest

from grounding_rl.reward.scorings import REGISTRY, get_scoring

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "published_scorings.json").read_text())
NAMES = ("timelens", "lmms_timelens", "lmms_charades_sta", "lmms_extremewhenbench", "timelens2_vlmevalkit",
         "timezero", "time_r1")


@pytest.mark.parametrize("name", NAMES)
def test_scoring_reproduces_its_evaluator_exactly(name):
    expected = FIXTURE["expected"][name]
    got = get_scoring(name).score(FIXTURE["queries"])
    assert {k: got[k] for k in expected} == expected  # bit-exact, floats included
    assert "@" in REGISTRY[name].source  # repository @ commit, file


def _one(gt, text, **extra):
    return [{"qid": "a", "video": "v", "query": "q", "start": gt[0], "end": gt[1], "duration": 60.0, "answer": text,
             **extra}]


@pytest.mark.parametrize("name", NAMES)
def test_float_ties_miss_as_in_the_evaluators(name):
    """GT (11.6, 14.6) against (11.6, 17.6): IoU 1/2 in real numbers, 0.49999999999999983 in floats: every evaluator
    misses R1@0.5 (our ``standard`` counts it)."""
    text = {"timezero": "11.6 to 17.6", "time_r1": "11.6 to 17.6"}.get(name, "The event happens in 11.6 - 17.6 seconds.")
    m = get_scoring(name).score(_one((11.6, 14.6), text))
    assert (m["n"], m["R1@0.3"], m["R1@0.5"]) == (1, 100.0, 0.0)


def test_the_rules_that_differ():
    reversed_ = _one((2.0, 6.0), "6.0 to 2.0")
    assert get_scoring("timelens").score(reversed_)["mIoU"] == 0.0  # reversed → 0
    assert get_scoring("lmms_extremewhenbench").score(reversed_)["mIoU"] == 100.0  # swapped
    assert get_scoring("lmms_charades_sta").score(_one((2.0, 6.0), "6.0 - 2.0"))["mIoU"] == 100.0  # swapped
    two = _one((2.0, 6.0), "0.0 to 1.0, then 2.0 to 6.0")
    assert get_scoring("timelens").score(two)["mIoU"] == 0.0  # the first pair
    assert get_scoring("timezero").score(two)["mIoU"] == 100.0  # the last
    exact = _one((1.0, 2.0), "1.0 to 1.5")  # IoU 0.5 exactly in floats: ≥ counts, Time-R1's > does not
    assert get_scoring("timezero").score(exact)["R1@0.5"] == 100.0
    assert get_scoring("time_r1").score(exact)["R1@0.5"] == 0.0
    missing = _one((1.0, 2.0), None) + [{**_one((3.0, 4.0), "3.0 to 4.0")[0], "qid": "b", "query": "r"}]
    assert [get_scoring(n).score(missing)["n"] for n in NAMES] == [2, 1, 2, 2, 1, 1, 1]
    duplicates = _one((1.0, 2.0), "1.0 to 2.0") + [{**_one((1.0, 2.0), "5 to 6")[0], "qid": "b"}]
    assert get_scoring("timelens").score(duplicates)["n"] == 1  # same video>>>query>>>span: one entry, the last
    assert get_scoring("timezero").score(duplicates)["n"] == 2
    with pytest.raises(ValueError, match="unknown scoring 'nope'"):
        get_scoring("nope")
