"""Scorings of interval sets, by name (the functions are :mod:`grounding_rl.reward.set_metrics`):

* ``set`` — TimeLens-Bench's multi-span reading: R1@m and mIoU by set IoU of the predicted set against every span an
  entry lists (``spans_all``, else ``spans``, else ``(start, end)``), with temporal ``precision`` and ``recall``;
  every query counts.
* ``qvhighlights`` — QVHighlights' moment-retrieval metric (Lei et al., NeurIPS 2021; jayleicn/moment_detr
  ``standalone_eval/eval.py``): R1@0.5/0.7 of the first window and mAP@0.5, mAP@0.75, mAP over IoU 0.5:0.05:0.95.
"""
from __future__ import annotations

from grounding_rl.reward.scorings.registry import Scoring, register
from grounding_rl.reward.set_metrics import qvhighlights_metrics, set_metrics

register(Scoring("set", "grounding_rl.reward.set_metrics.set_metrics (set IoU against TimeLens-Bench's every span, "
                 "spans_all; MCG-NJU/TimeLens2 reward/intervals semantics)", set_metrics))
register(Scoring("qvhighlights", "jayleicn/moment_detr standalone_eval/eval.py (R1@0.5/0.7 full range, mAP "
                 "0.5:0.05:0.95): annotated windows, unclamped predictions, ranked by score, else written order",
                 qvhighlights_metrics))
