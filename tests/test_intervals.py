"""Interval-set math (grounding_rl.reward.intervals): hand-computed cases, and agreement with TimeLens2's own reward
code on 300 random sets (tests/fixtures/timelens2_rewards.json, computed by running MCG-NJU/TimeLens2 @a5ce450's
``score_completion`` outside the project)."""
import json
import math
import random
from pathlib import Path

import pytest

from grounding_rl.reward import intervals as iv
from grounding_rl.reward.iou import temporal_iou

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "timelens2_rewards.json").read_text())


def test_merge_joins_overlapping_and_touching_spans():
    assert iv.merge_spans([(10, 12), (0, 3.5), (3, 4), (12, 13)]) == [(0.0, 4.0), (10.0, 13.0)]
    assert iv.merge_spans([]) == []
    with pytest.raises(ValueError, match="reversed"):
        iv.merge_spans([(3, 1)])


@pytest.mark.parametrize("pred, gt, w1", [
    ([(0, 1)], [(2, 3)], 2.0),                 # a shift by 2 s moves all the mass 2 s
    ([(0, 2)], [(0, 1)], 0.5),                 # ∫0..1 x/2 + ∫1..2 (1 - x/2)
    ([(0, 1), (2, 3)], [(1, 2)], 0.75),        # 1/4 + two triangles 1/8 + 1/8 + 1/4
    ([(0, 4)], [(1, 3)], 0.5),                 # symmetric spread: 2 · ∫0..1 x/4 + 2 · ∫1..2 (x-1)/4
    ([(5, 6), (0, 1)], [(0, 1), (5, 6)], 0.0),  # order does not matter
])
def test_w1_hand_computed(pred, gt, w1):
    assert iv.wasserstein1(pred, gt) == pytest.approx(w1, abs=1e-12)
    assert iv.wasserstein1(gt, pred) == pytest.approx(w1, abs=1e-12)


def test_w2_and_rewards_hand_computed():
    assert iv.wasserstein2([(0, 1)], [(2, 3)]) == pytest.approx(2.0)
    assert iv.wasserstein2([(0, 2)], [(0, 1)]) == pytest.approx(math.sqrt(1 / 3))       # ∫0..1 u² du
    assert iv.wasserstein2([(0, 1), (2, 3)], [(1, 2)]) == pytest.approx(math.sqrt(7 / 12))
    assert iv.twass([(0, 2)], [(0, 1)], beta=1.0) == pytest.approx(math.exp(-0.5))
    assert iv.twass([(0, 2)], [(0, 1)]) == pytest.approx(math.exp(-1.5))                # β 3 by default
    assert iv.r2twass([(0, 2)], [(0, 1)], beta=1.0) == pytest.approx(math.exp(-math.sqrt(1 / 3) / 2))
    assert iv.set_iou([(0, 2), (4, 6)], [(1, 5)]) == pytest.approx(1 / 3)
    assert iv.set_iou([(0, 2), (1, 3)], [(0, 3)]) == 1.0                               # the prediction is merged
    assert iv.ngiou([(0, 1)], [(0, 1), (2, 3)]) == 0.5
    assert iv.ngiou([(0, 1)], [(2, 3)]) == pytest.approx((1 - 1 / 3) / 2)
    assert iv.length_ratio_penalty([(0, 10)], [(0, 1)]) == pytest.approx(-1.0, abs=1e-6)
    assert iv.temporal_precision([(0, 4)], [(1, 2), (3, 5)]) == 0.5
    assert iv.temporal_recall([(0, 4)], [(1, 2), (3, 5)]) == pytest.approx(2 / 3)


def test_single_span_set_iou_equals_temporal_iou_bit_for_bit():
    rng = random.Random(0)
    for _ in range(2000):
        p = sorted(round(rng.uniform(0, 60), rng.choice([0, 1, 2])) for _ in range(2))
        g = sorted(round(rng.uniform(0, 60), rng.choice([0, 1, 2])) for _ in range(2))
        assert iv.set_iou([p], [g]) == temporal_iou(p, g)


_OURS = {
    "tiou": iv.set_iou,
    "twass": iv.twass,
    "twass1": lambda p, g: iv.twass(p, g, beta=1.0),
    "twass0.5": lambda p, g: iv.twass(p, g, beta=0.5),
    "r2twass": iv.r2twass,
    "r2twass1": lambda p, g: iv.r2twass(p, g, beta=1.0),
    "ngiou": iv.ngiou,
    "length_ratio_penalty": iv.length_ratio_penalty,
    "parse_penalty": lambda p, g: 0.0,
}


def test_agrees_with_timelens2_on_random_sets():
    cases = FIXTURE["cases"]
    assert len(cases) == 300 and sum(len(c["gt"]) > 1 for c in cases) > 100
    worst = {}
    for case in cases:
        for spec, expected in case["expected"].items():
            got = _OURS[spec](case["pred"], case["gt"])
            worst[spec] = max(worst.get(spec, 0.0), abs(got - expected))
    assert set(worst) == set(FIXTURE["specs"])
    assert max(worst.values()) < 1e-6, worst


def test_one_zero_length_rule_for_iou_precision_and_recall():
    """An empty answer at the point of an empty (clamped) ground truth scores 1 under ``standard``, ``clamped`` and
    ``set`` and in ``set``'s precision and recall; an empty answer elsewhere, or a long one around an empty ground
    truth, scores 0 in the ratio whose denominator is empty."""
    from fractions import Fraction

    from grounding_rl.reward.metrics import clamped_iou, standard_iou
    from grounding_rl.reward.set_metrics import set_metrics, set_scores

    assert set_scores([(30.0, 30.0)], [(30.0, 30.0)], 30.0) == (1.0, 1.0, 1.0)
    assert set_scores([(12.0, 12.0)], [(30.0, 30.0)], 30.0) == (0.0, 0.0, 0.0)
    assert set_scores([(0.0, 30.0)], [(30.0, 30.0)], 30.0) == (0.0, 0.0, 0.0)       # recall of a point: not the point
    assert set_scores([(4.0, 4.0)], [(2.0, 6.0)], 30.0) == (0.0, 0.0, 0.0)           # precision of a point inside G
    assert standard_iou((30.0, 30.0), (30.0, 30.0)) == clamped_iou((31, 40), (30.0, 30.0), 30.0) == Fraction(1)
    records = [{"start": 30.0, "end": 30.0, "duration": 30.0, "spans": [[30.0, 30.0]], "pred_spans": [[30.0, 30.0]]},
               {"start": 1.0, "end": 3.0, "duration": 30.0, "spans": [[1.0, 3.0]], "pred_spans": [[2.0, 3.0]]}]
    out = set_metrics(records)
    assert out["mIoU"] == 75.0 and out["precision"] == 100.0 and out["recall"] == 75.0
