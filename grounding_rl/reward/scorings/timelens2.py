"""``timelens2_vlmevalkit``: MCG-NJU/TimeLens2 @a5ce450, ``evaluation/vlmeval/dataset/timelens.py``
(``TimeLensBase.evaluate``, ``extract_time``, ``iou``), with ``reason=False`` (its default; ``<answer>`` tags are
read only with ``reason=True``).

* Parser: TimeLens's (:func:`~grounding_rl.reward.scorings.timelens.timelens_pairs`); the first pair.
* No pair → IoU 0, counted. Reversed → 0. IoU by the hull formula, zero hull → 0.
* A missing prediction (NaN in their table: no text here) is excluded (score −1), as is a ground truth that is not a
  list; no keying, duplicates are separate rows.
* mIoU = ``round(mean over the scored rows, 4)`` (pandas: numpy's pairwise sum / count); R1@m =
  ``round(count(IoU ≥ m) / total rows, 4)`` — over **all** rows, excluded ones included, where mIoU is over the
  scored. Both reported × 100. n = the scored rows; ``total`` = all rows.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from grounding_rl.reward.scorings.registry import THRESHOLDS, Scoring, annotation, register
from grounding_rl.reward.scorings.lmms_eval import guarded_iou
from grounding_rl.reward.scorings.timelens import timelens_pairs


def score(records: Sequence[Mapping]) -> dict:
    """TimeLens2's VLMEvalKit metrics of ``records`` (see the module docstring)."""
    scored, failures = [], 0
    for r in records:
        if not isinstance(r.get("answer"), str):
            continue  # NaN prediction: score −1, excluded
        pairs = timelens_pairs(str(r["answer"]))
        failures += not pairs
        scored.append(guarded_iou(pairs[0], annotation(r)) if pairs else 0.0)
    total = len(records)
    values = np.asarray(scored, dtype=np.float64)
    miou = round(float(values.sum() / values.size), 4) if values.size else 0
    out: dict = {"n": len(scored), "total": total, "mIoU": 100 * float(miou)}
    for m in THRESHOLDS:
        out[f"R1@{m}"] = 100 * (round(int((values >= m).sum()) / total, 4) if total > 0 else 0.0)
    out["parse_failure_rate"] = 100 * failures / len(scored) if scored else 0.0
    return out


register(Scoring("timelens2_vlmevalkit", "MCG-NJU/TimeLens2 @a5ce450, evaluation/vlmeval/dataset/timelens.py "
                 "(TimeLensBase.evaluate, reason=False)", score))
