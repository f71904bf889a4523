"""Temporal IoU."""
import numpy as np
import pytest

from grounding_rl.reward.iou import clamp_interval, temporal_iou, temporal_iou_batch

GT = (15.0, 18.0)
SEED_PREDS = [(10.0, 12.0), (15.3, 18.5), (15.0, 18.0), (14.8, 18.2)]
SEED_IOUS = [0.0, 0.7714, 1.0, 0.8824]


def test_seed_example():
    assert [round(temporal_iou(p, GT), 4) for p in SEED_PREDS] == SEED_IOUS
    assert temporal_iou((15.3, 18.5), GT) == pytest.approx(2.7 / 3.5)


def test_batch_matches_scalar():
    ious = temporal_iou_batch(SEED_PREDS, [GT] * 4)
    assert ious.shape == (4,) and ious.dtype == np.float64
    np.testing.assert_allclose(ious, [0.0, 2.7 / 3.5, 1.0, 3.0 / 3.4])


def test_zero_union_and_zero_length():
    assert temporal_iou((5.0, 5.0), (5.0, 5.0)) == 1.0
    assert temporal_iou((5.0, 5.0), (6.0, 6.0)) == 0.0
    assert temporal_iou((5.0, 5.0), (4.0, 6.0)) == 0.0  # a point inside an interval: empty intersection
    np.testing.assert_array_equal(temporal_iou_batch([(5, 5), (5, 5), (0, 2)], [(5, 5), (6, 6), (1, 3)]),
                                  [1.0, 0.0, 1 / 3])
    assert temporal_iou_batch([], []).shape == (0,)


def test_touching_and_containment():
    assert temporal_iou((0.0, 1.0), (1.0, 2.0)) == 0.0
    assert temporal_iou((0.0, 10.0), (2.0, 4.0)) == pytest.approx(0.2)


def test_errors():
    with pytest.raises(ValueError, match="reversed"):
        temporal_iou((18.0, 15.0), GT)
    with pytest.raises(ValueError, match="pred row 1 is reversed"):
        temporal_iou_batch([(1, 2), (3, 2)], [(1, 2), (1, 2)])
    with pytest.raises(ValueError, match="same shape"):
        temporal_iou_batch([(1, 2)], [(1, 2), (1, 2)])
    with pytest.raises(ValueError, match="finite"):
        temporal_iou((float("nan"), 1.0), GT)


def test_clamp_interval():
    assert clamp_interval((-3.0, 50.0), 40.0) == (0.0, 40.0)
    assert clamp_interval((12.0, 5.0), 40.0) == (12.0, 5.0)  # order kept
    with pytest.raises(ValueError, match="duration"):
        clamp_interval((1.0, 2.0), 0.0)
