"""Temporal IoU."""
import pytest

from grounding_rl.reward.iou import clamp_interval, temporal_iou

GT = (15.0, 18.0)
SEED_PREDS = [(10.0, 12.0), (15.3, 18.5), (15.0, 18.0), (14.8, 18.2)]
SEED_IOUS = [0.0, 0.7714, 1.0, 0.8824]


def test_seed_example():
    assert [round(temporal_iou(p, GT), 4) for p in SEED_PREDS] == SEED_IOUS
    assert temporal_iou((15.3, 18.5), GT) == pytest.approx(2.7 / 3.5)


def test_zero_union_and_zero_length():
    assert temporal_iou((5.0, 5.0), (5.0, 5.0)) == 1.0
    assert temporal_iou((5.0, 5.0), (6.0, 6.0)) == 0.0
    assert temporal_iou((5.0, 5.0), (4.0, 6.0)) == 0.0  # a point inside an interval: empty intersection
    assert temporal_iou((0.0, 2.0), (1.0, 3.0)) == pytest.approx(1 / 3)


def test_touching_and_containment():
    assert temporal_iou((0.0, 1.0), (1.0, 2.0)) == 0.0
    assert temporal_iou((0.0, 10.0), (2.0, 4.0)) == pytest.approx(0.2)


def test_errors():
    with pytest.raises(ValueError, match="reversed"):
        temporal_iou((18.0, 15.0), GT)
    with pytest.raises(ValueError, match="finite"):
        temporal_iou((float("nan"), 1.0), GT)


def test_clamp_interval():
    assert clamp_interval((-3.0, 50.0), 40.0) == (0.0, 40.0)
    assert clamp_interval((12.0, 5.0), 40.0) == (12.0, 5.0)  # order kept
    with pytest.raises(ValueError, match="duration"):
        clamp_interval((1.0, 2.0), 0.0)
