"""GRPO rewards for answers that are interval sets (TimeLens2's reward family), registered by name in
:data:`grounding_rl.reward.rewards.REWARD_FUNCS`.

Each has TRL's reward signature ``fn(completions, **columns) -> list[float]``. The ground truth of completion ``i`` is
TimeLens2's ``anno["span"]``, the windows as annotated: ``columns["raw_spans"][i]`` when validation merged or
clamped them (:class:`grounding_rl.data.samples.Sample`), else ``columns["spans"][i]`` (a list of ``[start, end]``
seconds), else the one span ``(start[i], end[i])``. The prediction is
:func:`grounding_rl.prompts.parsing.parse_spans` of the completion, as written: not clamped into the video (TimeLens2
clamps nothing; our single-span ``iou`` reward does). Both as TimeLens2 @a5ce450 ``grpo/timelens/rewards/funcs.py``
``score_completion`` computes them (tests/test_set_rewards.py, tests/fixtures/timelens2_rewards*.json).

Policy (shared by every set reward): an answer is *usable* when it parses and no pair is reversed. An unusable answer
scores 0.0 in every interval reward (TimeLens2 gives 0 when nothing parses; it swaps a reversed pair where we, as
``iou`` does, score it 0), and −1.0 in ``parse_penalty``.

Names: ``set_iou``; ``twass`` (β 3) and ``twass<β>`` as TimeLens2 spells it (``twass1``, ``twass0.5``); ``r2twass``
and ``r2twass<β>``; ``ngiou``; ``length_ratio_penalty``; ``parse_penalty``. TimeLens2's own ``tiou`` is ``set_iou``
here (our ``tiou`` is Time-R1's timestamp-aware IoU): :func:`translate_timelens2_spec` maps its spec strings.
"""
from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence

from grounding_rl.reward import intervals
from grounding_rl.reward.iou import clamp_interval
from grounding_rl.prompts.parsing import completion_text, parse_spans

_BETA_NAME = re.compile(r"^(twass|r2twass)(\d+(?:\.\d+)?)?$")


def gt_spans(columns: dict, i: int) -> list[tuple[float, float]]:
    """The ground-truth spans of completion ``i`` as annotated: the ``raw_spans`` column's entry when there is one,
    else the ``spans`` column's, else ``[(start, end)]``. Raises ValueError when none is there."""
    for name in ("raw_spans", "spans"):
        spans = columns.get(name)
        if spans is not None and spans[i] is not None:
            return [(float(s), float(e)) for s, e in spans[i]]
    for key in ("start", "end"):
        if key not in columns:
            raise ValueError(f"reward needs a 'spans' or a {key!r} column (seconds), got columns {sorted(columns)}")
    return [(float(columns["start"][i]), float(columns["end"][i]))]


def usable_spans(pred: Sequence[Sequence[float]] | None, duration: float) -> list[tuple[float, float]] | None:
    """``pred`` clamped into [0, duration], or None when it is None, empty, non-finite or has a reversed pair."""
    if not pred or any(not (math.isfinite(s) and math.isfinite(e)) or s > e for s, e in pred):
        return None
    return [clamp_interval(span, duration) for span in pred]


def _per_completion(completions, columns, score: Callable, unusable: float = 0.0) -> list[float]:
    out = []
    for i, completion in enumerate(completions):
        try:
            pred = parse_spans(completion_text(completion))
            if pred is not None and any(not (math.isfinite(s) and math.isfinite(e)) or s > e for s, e in pred):
                pred = None
            out.append(unusable if pred is None else float(score(pred, gt_spans(columns, i))))
        except (ValueError, TypeError) as err:
            raise ValueError(f"reward: sample {i}: {err}") from err
    return out


def set_iou_reward(completions, **columns) -> list[float]:
    """IoU of the merged predicted set with the GT windows as annotated, in [0, 1] (:func:`intervals.set_iou`,
    TimeLens2's ``iou_overlap_ratio``); on one span each inside the video it equals the ``iou`` reward exactly.
    TimeLens2 calls this ``tiou``."""
    return _per_completion(completions, columns, intervals.set_iou)


def twass_reward(completions, beta: float = 3.0, **columns) -> list[float]:
    """exp(−β·W₁/|merge(GT)|) (:func:`intervals.twass`), β 3; ``twass1`` etc. fix β."""
    return _per_completion(completions, columns, functools.partial(intervals.twass, beta=beta))


def r2twass_reward(completions, beta: float = 3.0, **columns) -> list[float]:
    """exp(−β·W₂/|merge(pred ∪ GT)|) (:func:`intervals.r2twass`), β 3; ``r2twass1`` etc. fix β."""
    return _per_completion(completions, columns, functools.partial(intervals.r2twass, beta=beta))


def ngiou_reward(completions, **columns) -> list[float]:
    """MUSEG's local-matching normalised GIoU in [0, 1] (:func:`intervals.ngiou`)."""
    return _per_completion(completions, columns, intervals.ngiou)


def length_ratio_penalty_reward(completions, **columns) -> list[float]:
    """−|log10((|pred| + 1e-6)/(|GT| + 1e-6))| ≤ 0 (:func:`intervals.length_ratio_penalty`); 0.0 for an unusable
    answer, as in TimeLens2 (pair it with ``parse_penalty``)."""
    return _per_completion(completions, columns, intervals.length_ratio_penalty)


def parse_penalty_reward(completions, **columns) -> list[float]:
    """0.0 for a usable answer (it parses, no reversed pair), −1.0 otherwise (TimeLens2's ``parse_penalty``)."""
    return _per_completion(completions, columns, lambda pred, gt: 0.0, unusable=-1.0)


SET_REWARDS: dict[str, Callable[..., list[float]]] = {
    "set_iou": set_iou_reward,
    "twass": twass_reward,
    "r2twass": r2twass_reward,
    "ngiou": ngiou_reward,
    "length_ratio_penalty": length_ratio_penalty_reward,
    "parse_penalty": parse_penalty_reward,
}


@functools.cache
def beta_reward(name: str) -> Callable[..., list[float]] | None:
    """The reward for a TimeLens2 ``twass<β>`` / ``r2twass<β>`` name (``twass1`` → β 1), one function per name; None
    for any other name."""
    match = _BETA_NAME.match(name)
    if match is None or match.group(2) is None:
        return None
    base = twass_reward if match.group(1) == "twass" else r2twass_reward
    beta = float(match.group(2))

    def reward(completions, **columns):
        return base(completions, beta=beta, **columns)

    reward.__name__ = name
    reward.__doc__ = f"{base.__doc__.splitlines()[0]} with β = {beta:g}."
    return reward


# TimeLens2's reward names (grpo/timelens/rewards/funcs.py) → ours, where they differ.
TIMELENS2_NAMES = {"tiou": "set_iou"}


def translate_timelens2_spec(spec: str) -> tuple[list[str], list[float]]:
    """TimeLens2's reward spec string ``"name[:weight],…"`` (e.g. ``"tiou,twass1:0.5,parse_penalty:0.2"``) as our
    ``reward_funcs`` and ``reward_weights`` (weight 1.0 when none is given); its ``tiou`` becomes ``set_iou``.

    Raises ValueError naming the token for an empty spec, a non-numeric weight, or a TimeLens2 reward we do not have
    (``format``, ``parse``, ``tgiou``, ``tdirac``, … are not translated: ours check other things or are absent).
    """
    names, weights = [], []
    for token in spec.split(","):
        token = token.strip()
        if not token:
            continue
        name, _, weight = token.partition(":")
        name = TIMELENS2_NAMES.get(name.strip(), name.strip())
        if name not in SET_REWARDS and beta_reward(name) is None:
            raise ValueError(f"TimeLens2 reward spec {spec!r}: {token!r} has no counterpart here; known: "
                             f"tiou (→ set_iou), {', '.join(n for n in SET_REWARDS if n != 'set_iou')}, twass<β>, "
                             "r2twass<β>")
        try:
            weights.append(float(weight) if weight else 1.0)
        except ValueError:
            raise ValueError(f"TimeLens2 reward spec {spec!r}: weight of {token!r} is not a number") from None
        names.append(name)
    if not names:
        raise ValueError(f"TimeLens2 reward spec {spec!r} names no reward")
    return names, weights


def is_timelens2_spec(entry: str) -> bool:
    """Whether a ``reward_funcs`` entry is a TimeLens2 spec string: it has a comma, or is ``name:weight`` with a
    numeric weight (``module:function`` and ``file.py:function`` never end in a number)."""
    if "," in entry:
        return True
    _, sep, tail = entry.rpartition(":")
    return bool(sep) and re.fullmatch(r"\s*\d+(?:\.\d*)?\s*", tail) is not None
