"""Interval-set math for multi-span temporal grounding: merge, set IoU, exact 1-D Wasserstein distances, MUSEG's
normalised GIoU and the length-ratio penalty. Pure functions of spans in seconds; no parsing, no clamping.

A *span set* is a sequence of ``(start, end)`` pairs in seconds with ``start <= end``, in any order, possibly
overlapping. ``merge_spans`` turns it into the sorted, disjoint set of its union (touching spans joined), which is what
every measure here compares unless its docstring says otherwise.

Sources: TimeLens2 (arXiv 2607.17423; MCG-NJU/TimeLens2 ``grpo/timelens/rewards/metrics.py`` and ``funcs.py``) for
``set_iou``'s overlap sum, ``twass`` (exp(−β·W₁/|merge(GT)|)), ``r2twass`` (exp(−β·W₂/|merge(pred ∪ GT)|)) and the
length-ratio penalty; MUSEG (arXiv 2505.20715) for ``ngiou``. The formulas are ours, written from those definitions;
``tests/fixtures/timelens2_rewards.json`` holds numbers computed by TimeLens2's own code on random sets.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

Span = tuple[float, float]

LENGTH_RATIO_EPS = 1e-6  # TimeLens2 funcs.py LENGTH_RATIO_EPS


def _spans(spans: Sequence[Sequence[float]], name: str) -> list[Span]:
    out = []
    for span in spans:
        if len(span) != 2:
            raise ValueError(f"{name}: a span must be a (start, end) pair, got {span!r}")
        start, end = float(span[0]), float(span[1])
        if not (math.isfinite(start) and math.isfinite(end)):
            raise ValueError(f"{name}: span must be finite, got {span!r}")
        if start > end:
            raise ValueError(f"{name}: span is reversed (start > end): {span!r}")
        out.append((start, end))
    return out


def merge_spans(spans: Sequence[Sequence[float]]) -> list[Span]:
    """The union of ``spans`` as sorted, disjoint ``(start, end)`` pairs (seconds); spans that overlap or touch
    (next start ≤ current end) are joined, zero-length spans inside another vanish, lone zero-length spans stay.

    Example: [(10, 12), (0, 3.5), (3, 4), (12, 13)] → [(0, 4), (10, 13)]. Raises ValueError for a reversed or
    non-finite span.
    """
    merged: list[list[float]] = []
    for start, end in sorted(_spans(spans, "spans")):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def total_length(spans: Sequence[Sequence[float]]) -> float:
    """Sum of ``end - start`` over ``spans`` as given (not merged: overlaps count twice), seconds."""
    return float(sum(e - s for s, e in _spans(spans, "spans")))


def intersection_length(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> float:
    """|merge(a) ∩ merge(b)| in seconds (a two-pointer sweep over the merged sets, O(n log n))."""
    ma, mb = merge_spans(a), merge_spans(b)
    i = j = 0
    inter = 0.0
    while i < len(ma) and j < len(mb):
        inter += max(0.0, min(ma[i][1], mb[j][1]) - max(ma[i][0], mb[j][0]))
        if ma[i][1] < mb[j][1]:
            i += 1
        else:
            j += 1
    return inter


def set_iou(pred: Sequence[Sequence[float]], gt: Sequence[Sequence[float]]) -> float:
    """Temporal IoU of two span sets, TimeLens2's ``iou_overlap_ratio`` (MCG-NJU/TimeLens2 @a5ce450
    ``grpo/timelens/rewards/metrics.py``): P = merge(pred), the GT spans as given (not merged: spans that overlap each
    other count twice), inter = Σ over pairs |p ∩ g|, IoU = inter / (|P| + Σ|g| − inter), in [0, 1]. On a merged
    (disjoint) GT this is |P ∩ G| / |P ∪ G|; TimeLens2 adds 1e-16 to the denominator (agreement to 1e-12).

    For one span each it is computed with the same operations as :func:`grounding_rl.reward.iou.temporal_iou`, so the
    two agree bit for bit. Zero union: 1.0 when P equals the merged GT (the same points), else 0.0. An empty ``pred``
    gives 0.0. Examples: pred [(0, 2), (4, 6)], gt [(1, 5)] → 2 / 6 = 0.3333; pred [(10, 20)], gt [(0, 10), (5, 15)]
    → 5 / (10 + 20 − 5) = 0.2 (merged GT: 0.25).
    """
    p, g = merge_spans(pred), _spans(gt, "gt")
    if not p:
        return 0.0
    inter = sum(max(0.0, min(a[1], b[1]) - max(a[0], b[0])) for a in p for b in g)
    union = total_length(p) + total_length(g) - inter
    if len(p) == 1 and len(g) == 1:
        (ps, pe), (gs, ge) = p[0], g[0]
        union = (pe - ps) + (ge - gs) - inter
    if union <= 0.0:
        return 1.0 if p == merge_spans(g) else 0.0
    return min(1.0, inter / union)


def _same_points(pred: Sequence[Sequence[float]], gt: Sequence[Sequence[float]]) -> float:
    """The zero-length rule of the project's own scorings (``standard``, ``clamped``, ``set`` and its precision and
    recall): a ratio whose denominator has zero length is 1.0 when the two merged sets are the same points, else 0.0
    (an empty answer at the very point of an empty, clamped ground truth is right; anywhere else it is not)."""
    p = merge_spans(pred)
    return 1.0 if p and p == merge_spans(gt) else 0.0


def temporal_precision(pred: Sequence[Sequence[float]], gt: Sequence[Sequence[float]]) -> float:
    """|P ∩ G| / |P| (merged sets), in [0, 1]: the share of the predicted time that is relevant. When |P| = 0, the
    zero-length rule (:func:`_same_points`, as :func:`set_iou`'s zero union): 1.0 for P equal to the merged G, else
    0.0. Example: pred [(5, 5)], gt [(5, 5)] → 1.0; pred [(5, 5)], gt [(4, 6)] → 0.0."""
    p = merge_spans(pred)
    length = total_length(p)
    return _same_points(p, gt) if length <= 0.0 else min(1.0, intersection_length(p, gt) / length)


def temporal_recall(pred: Sequence[Sequence[float]], gt: Sequence[Sequence[float]]) -> float:
    """|P ∩ G| / |G| (merged sets), in [0, 1]: the share of the relevant time that is predicted. When |G| = 0, the
    zero-length rule (:func:`_same_points`): 1.0 for merged P equal to G, else 0.0. Example: pred [(5, 5)], gt
    [(5, 5)] → 1.0; pred [(0, 10)], gt [(5, 5)] → 0.0."""
    g = merge_spans(gt)
    length = total_length(g)
    return _same_points(pred, g) if length <= 0.0 else min(1.0, intersection_length(pred, g) / length)


def _cdf_values(spans: list[Span], xs: list[float]) -> list[float]:
    """CDF of the uniform distribution on the disjoint sorted ``spans`` at the sorted points ``xs`` (linear sweep)."""
    length = total_length(spans)
    out, acc, k = [], 0.0, 0
    for x in xs:
        while k < len(spans) and spans[k][1] <= x:
            acc += spans[k][1] - spans[k][0]
            k += 1
        inside = max(0.0, x - spans[k][0]) if k < len(spans) else 0.0
        out.append(min(1.0, (acc + inside) / length))
    return out


def wasserstein1(pred: Sequence[Sequence[float]], gt: Sequence[Sequence[float]]) -> float:
    """Exact W₁ (seconds) between the uniform distributions on merge(pred) and merge(gt).

    W₁ = ∫ |F_P(x) − F_G(x)| dx; both CDFs are piecewise linear with kinks at span ends, so on each piece the gap is
    linear and its absolute integral is closed-form (a trapezoid, or two triangles where the gap changes sign).
    Examples: [(0, 1)] vs [(2, 3)] → 2.0 (a shift); [(0, 2)] vs [(0, 1)] → 0.5; [(0, 1), (2, 3)] vs [(1, 2)] → 0.75.
    Raises ValueError when either set has zero total length.
    """
    p, g = merge_spans(pred), merge_spans(gt)
    if total_length(p) <= 0.0 or total_length(g) <= 0.0:
        raise ValueError(f"W1 needs two sets of positive length, got {pred!r} and {gt!r}")
    xs = sorted({x for span in p + g for x in span})
    gap = [a - b for a, b in zip(_cdf_values(p, xs), _cdf_values(g, xs))]
    w1 = 0.0
    for x0, x1, d0, d1 in zip(xs, xs[1:], gap, gap[1:]):
        width = x1 - x0
        if d0 * d1 < 0.0:
            w1 += (d0 * d0 + d1 * d1) / (abs(d0) + abs(d1)) * width / 2.0
        else:
            w1 += (abs(d0) + abs(d1)) * width / 2.0
    return w1


def _quantile_values(spans: list[Span], us: list[float]) -> list[float]:
    """Quantile function of the uniform distribution on ``spans`` at the sorted masses ``us`` in [0, 1]."""
    length = total_length(spans)
    out, acc, k = [], 0.0, 0
    for u in us:
        target = u * length
        while k < len(spans) - 1 and acc + (spans[k][1] - spans[k][0]) < target:
            acc += spans[k][1] - spans[k][0]
            k += 1
        out.append(min(spans[k][1], spans[k][0] + max(0.0, target - acc)))
    return out


def wasserstein2(pred: Sequence[Sequence[float]], gt: Sequence[Sequence[float]]) -> float:
    """Exact W₂ (seconds) between the uniform distributions on merge(pred) and merge(gt).

    W₂² = ∫₀¹ (Q_P(u) − Q_G(u))² du with Q the quantile functions, linear with slopes |P| and |G| between the mass
    breakpoints of either set; on a piece of width w whose gap is m at its middle the integral is
    w·m² + (|P| − |G|)²·w³/12.
    Example: [(0, 1)] vs [(2, 3)] → 2.0; [(0, 2)] vs [(0, 1)] → sqrt(1/3) = 0.5774. Raises ValueError for a
    zero-length set.
    """
    p, g = merge_spans(pred), merge_spans(gt)
    lp, lg = total_length(p), total_length(g)
    if lp <= 0.0 or lg <= 0.0:
        raise ValueError(f"W2 needs two sets of positive length, got {pred!r} and {gt!r}")
    masses = {0.0, 1.0}
    for spans, length in ((p, lp), (g, lg)):
        acc = 0.0
        for s, e in spans[:-1]:
            acc += e - s
            masses.add(min(1.0, acc / length))
    us = sorted(masses)
    mids = [(u0 + u1) / 2.0 for u0, u1 in zip(us, us[1:])]
    gap = [a - b for a, b in zip(_quantile_values(p, mids), _quantile_values(g, mids))]
    slope = lp - lg
    sq = sum((u1 - u0) * m * m + slope * slope * (u1 - u0) ** 3 / 12.0 for u0, u1, m in zip(us, us[1:], gap))
    return math.sqrt(max(0.0, sq))


def twass(pred: Sequence[Sequence[float]], gt: Sequence[Sequence[float]], beta: float = 3.0) -> float:
    """TimeLens2's Wasserstein reward exp(−β·W₁(P, G) / |merge(gt)|), in (0, 1]; 0.0 when ``pred`` has zero length.

    Normalised by the GT's merged length only, so a broad prediction cannot enlarge its own scale. Source:
    TimeLens2 ``temporal_wasserstein_reward`` (β 3 by default; ``twass1`` is β 1).
    Example: pred [(0, 2)], gt [(0, 1)], β 1 → exp(−0.5) = 0.6065.
    """
    if total_length(merge_spans(pred)) <= 0.0:
        return 0.0
    return math.exp(-beta * wasserstein1(pred, gt) / max(total_length(merge_spans(gt)), 1e-12))


def r2twass(pred: Sequence[Sequence[float]], gt: Sequence[Sequence[float]], beta: float = 3.0) -> float:
    """TimeLens2's W₂ reward exp(−β·W₂(P, G) / |merge(pred ∪ gt)|), in (0, 1]; 0.0 when ``pred`` has zero length.

    Source: TimeLens2 ``temporal_wasserstein2_reward``. Example: pred [(0, 2)], gt [(0, 1)], β 1 →
    exp(−sqrt(1/3) / 2) = 0.7493.
    """
    if total_length(merge_spans(pred)) <= 0.0:
        return 0.0
    union = total_length(merge_spans(list(pred) + list(gt)))
    return math.exp(-beta * wasserstein2(pred, gt) / union)


def giou(pred: Sequence[float], gt: Sequence[float]) -> float:
    """Generalised temporal IoU of two spans: IoU − (|C| − |U|)/|C|, C the hull, U the union; in [−1, 1].
    0.0 when the hull has zero length. Example: (0, 1) vs (2, 3) → 0 − (3 − 2)/3 = −1/3."""
    (ps, pe), (gs, ge) = _spans([pred, gt], "giou")
    hull = max(pe, ge) - min(ps, gs)
    if hull <= 0.0:
        return 0.0
    inter = max(0.0, min(pe, ge) - max(ps, gs))
    union = (pe - ps) + (ge - gs) - inter
    return max(-1.0, min(1.0, inter / hull - (hull - union) / hull))


def ngiou(pred: Sequence[Sequence[float]], gt: Sequence[Sequence[float]]) -> float:
    """MUSEG's local matching reward: spans of positive length sorted by (start, end), the k-th prediction paired
    with the k-th GT span, mean of (1 + GIoU)/2 over max(#pred, #gt) pairs (an unmatched span adds 0); in [0, 1].
    Not merged. Source: MUSEG (arXiv 2505.20715) as TimeLens2 ``funcs.py`` ``_r_ngiou`` implements it.
    Example: pred [(0, 1)], gt [(0, 1), (2, 3)] → (1 + 0) / 2 = 0.5.
    """
    p = sorted(s for s in _spans(pred, "pred") if s[0] < s[1])
    g = sorted(s for s in _spans(gt, "gt") if s[0] < s[1])
    count = max(len(p), len(g))
    if count == 0:
        return 0.0
    return sum(0.5 * (1.0 + giou(a, b)) for a, b in zip(p, g)) / count


def length_ratio_penalty(pred: Sequence[Sequence[float]], gt: Sequence[Sequence[float]],
                         eps: float = LENGTH_RATIO_EPS) -> float:
    """−|log10((|pred| + ε) / (|gt| + ε))| with |·| the sum of span lengths as given (not merged), ε 1e-6; ≤ 0.

    0 when the lengths match, −1 for a prediction ten times too long or short. Source: TimeLens2 ``funcs.py``
    ``_r_length_ratio_penalty``. Example: pred [(0, 10)], gt [(0, 1)] → −1.0 (to 1e-6).
    """
    return 0.0 - abs(math.log10((total_length(pred) + eps) / (total_length(gt) + eps)))
