"""GRPO reward functions for temporal grounding and their weighted sum.

Each reward has TRL's reward-function signature ``fn(completions, **columns) -> list[float]``: ``completions`` as TRL
passes them (strings or conversational message lists), ``columns`` the dataset columns as lists with one entry per
completion, of which ``start``, ``end`` (ground truth) and ``duration`` (all seconds) are used, and
``prompt_template`` by ``format``. The GRPO trainer passes what TRL 1.16's ``_calculate_rewards`` passes
(:func:`grounding_rl.update.rollout.reward_columns`): every dataset column, ``completion_ids``, ``trainer_state``,
``log_metric(name, value)`` and ``log_extra(column, values)``; the built-in rewards accept and ignore the ones they do
not use. A function must return one value (or None) per completion; another count stops training naming it.

Registry names: ``iou``, ``format``, ``tiou`` (Time-R1's), and the interval-set rewards of
:mod:`grounding_rl.reward.set_rewards` (``set_iou``, ``twass``/``twass<β>``, ``r2twass``/``r2twass<β>``, ``ngiou``,
``length_ratio_penalty``, ``parse_penalty``). Combine them with ``reward_weights`` as TRL does
(``GRPOConfig.reward_weights``; ``weighted_rewards`` reproduces the sum for tests and logs).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import torch

from grounding_rl.prompts.templates import (
    ANSWER_FORMATS, ANSWER_ONLY, JSON_SPANS, SET_FORMATS, THINK_ANSWER, THINK_JSON_SPANS, TIMELENS, get_template,
)
from grounding_rl.reward.iou import clamp_interval, temporal_iou
from grounding_rl.prompts.parsing import completion_text, json_spans, parse_answer
from grounding_rl.reward.set_rewards import SET_REWARDS, beta_reward
from grounding_rl.reward.window import WINDOW_REWARDS

# The strict answers each template's answer format asks for (grounding_rl.prompts.templates.ANSWER_FORMATS): plain
# seconds, "to" for the tagged templates ("12.54 to 17.83"), TimeLens's sentence for "timelens". Each pattern has one
# way to match any text, so fullmatch runs in linear time.
_SECONDS_TO_SECONDS = re.compile(r"\s*(\d+(?:\.\d+)?)\s+to\s+(\d+(?:\.\d+)?)\s*")
_TIMELENS_SENTENCE = re.compile(r"\s*The event happens in (\d+(?:\.\d+)?) - (\d+(?:\.\d+)?) seconds\.?\s*")
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def _think_answer(text: str) -> str | None:
    """The answer of ``<think>…</think>`` then ``<answer>…</answer>`` (whitespace around and between, no other tag of
    the four inside either block); None when the text is not exactly that."""
    text = text.strip()
    if not text.startswith("<think>"):
        return None
    close = text.find("</think>")
    if close < 0:
        return None
    think, rest = text[len("<think>"):close], text[close + len("</think>"):].lstrip()
    if not (rest.startswith("<answer>") and rest.endswith("</answer>")) or len(rest) < len("<answer></answer>"):
        return None
    answer = rest[len("<answer>"):-len("</answer>")]
    if any(tag in think or tag in answer for tag in _TAGS):
        return None
    return answer


def _answer_only(text: str) -> str | None:
    """The answer of a text that is exactly one ``<answer>…</answer>`` block (whitespace around it, none of the four
    tags inside); None otherwise, so a think block before or after the answer gives None."""
    text = text.strip()
    if not (text.startswith("<answer>") and text.endswith("</answer>")) or len(text) < len("<answer></answer>"):
        return None
    answer = text[len("<answer>"):-len("</answer>")]
    if any(tag in answer for tag in _TAGS):
        return None
    return answer


def strict_answer(text: str, answer_format: str = THINK_ANSWER) -> tuple[float, float] | None:
    """The interval of a completion written exactly in ``answer_format``, else None.

    ``think_answer``: ``<think>…</think><answer>S to E</answer>`` with S, E plain non-negative decimal seconds;
    ``answer_only``: ``<answer>S to E</answer>`` alone (thinking-free: any think block, even an empty one, gives
    None); ``timelens``: ``The event happens in S - E seconds`` (an optional full stop), untagged, nothing else.
    Non-finite values give None. Linear time. Raises ValueError for an unknown format.
    """
    if answer_format in (THINK_ANSWER, ANSWER_ONLY):
        answer = _think_answer(text) if answer_format == THINK_ANSWER else _answer_only(text)
        match = None if answer is None else _SECONDS_TO_SECONDS.fullmatch(answer)
    elif answer_format == TIMELENS:
        match = _TIMELENS_SENTENCE.fullmatch(text)
    else:
        raise ValueError(f"unknown answer format {answer_format!r}; known: {ANSWER_FORMATS}")
    if match is None:
        return None
    start, end = float(match.group(1)), float(match.group(2))
    return (start, end) if math.isfinite(start) and math.isfinite(end) else None


_JSON_SPANS_ONLY = re.compile(r"\s*\[\s*\[[^\[\]]*\](?:\s*,\s*\[[^\[\]]*\])*\s*\]\s*")


def strict_spans(text: str, answer_format: str = JSON_SPANS) -> list[tuple[float, float]] | None:
    """The interval set of a completion written exactly in a set answer format, else None.

    ``json_spans`` (TimeLens2): a JSON array of ``[start, end]`` pairs of non-negative numbers and nothing else,
    bare or as the whole of one ``<answer>…</answer>`` block (no think block); ``think_json_spans``:
    ``<think>…</think><answer>[[S, E], …]</answer>``. Whitespace around is free. Linear time. Raises ValueError for
    another format.
    """
    if answer_format == JSON_SPANS:
        answer = _answer_only(text)
        answer = text if answer is None and not any(tag in text for tag in _TAGS) else answer
    elif answer_format == THINK_JSON_SPANS:
        answer = _think_answer(text)
    else:
        raise ValueError(f"{answer_format!r} is not a set answer format; known: {SET_FORMATS}")
    if answer is None or _JSON_SPANS_ONLY.fullmatch(answer) is None:
        return None
    return json_spans(answer)


def query_iou(pred: Sequence[float] | None, gt: Sequence[float], duration: float) -> float:
    """IoU of one prediction under the ``iou`` reward's rule, shared by rewards, eval and metrics.

    ``pred`` is a parsed ``(start, end)`` in seconds or None. None or reversed (start > end) → 0.0; otherwise the
    prediction is clamped to [0, duration] and compared with ``gt`` by ``temporal_iou``. Raises ValueError for a
    non-positive duration or a reversed/non-finite ground truth.
    """
    if pred is None or not all(math.isfinite(float(t)) for t in pred) or pred[0] > pred[1]:
        return 0.0
    return temporal_iou(clamp_interval(pred, duration), gt)


def _columns(completions: Sequence, columns: dict) -> list[tuple[tuple[float, float], float]]:
    """``[((start, end), duration), …]`` per completion; ValueError when a column is missing or has another length."""
    for key in ("start", "end", "duration"):
        if key not in columns:
            raise ValueError(f"reward needs a {key!r} column (seconds), got columns {sorted(columns)}")
        if len(columns[key]) != len(completions):
            raise ValueError(f"column {key!r} has {len(columns[key])} values for {len(completions)} completions")
    return [((float(s), float(e)), float(d)) for s, e, d in zip(columns["start"], columns["end"], columns["duration"])]


def _per_sample(completions, columns, score: Callable[..., float]) -> list[float]:
    """``score(parsed_pred, gt, duration)`` per completion. The answer is the completion's, parsed, or, when the
    rollout gives the ``answer_span`` column, that column's value: the answer parsed and already in the video's
    seconds ([s, e], None when it does not parse; a two-pass zoom's pass-2 rows,
    :func:`grounding_rl.update.rollout.score`). Errors name the sample index."""
    out = []
    spans = columns.get("answer_span")
    for i, (completion, (gt, duration)) in enumerate(zip(completions, _columns(completions, columns))):
        try:
            pred = parse_answer(completion_text(completion)) if spans is None else spans[i]
            out.append(float(score(pred, gt, duration)))
        except (ValueError, TypeError) as err:
            raise ValueError(f"reward: sample {i}: {err}") from err
    return out


def iou_reward(completions, **columns) -> list[float]:
    """Temporal IoU in [0, 1] of the parsed answer with (start, end), prediction clamped to [0, duration].

    Unparseable or reversed answers get 0.0 (``query_iou``). The worked example, gt (15, 18): "10.00 to 12.00" → 0.0,
    "15.30 to 18.50" → 0.7714, "15.00 to 18.00" → 1.0, "14.80 to 18.20" → 0.8824.
    """
    return _per_sample(completions, columns, query_iou)


def format_reward(completions, prompt_template=None, **columns) -> list[float]:
    """1.0 when the completion is written exactly in its prompt template's answer format (:func:`strict_answer`),
    else 0.0: for the tagged templates ``<think>…</think><answer>12.54 to 17.83</answer>``, for the thinking-free
    ``default_no_think`` ``<answer>12.54 to 17.83</answer>`` alone (a think block present → 0), for ``timelens``
    ``The event happens in 12.54 - 17.83 seconds`` (a think block present → 0); for ``timelens2`` a JSON array of pairs
alone, bare or inside ``<answer>`` (:func:`strict_spans`), for ``default_multi`` that array inside the think/answer
form. Looser answers that the parser still
    reads for the IoU (``5.0s to 11.6s``, an untagged interval) get 0.

    ``prompt_template``: the column of template names (one per completion, or one name for all); None = ``default``.
    """
    if prompt_template is None or isinstance(prompt_template, str):
        prompt_template = [prompt_template or "default"] * len(completions)
    out = []
    for c, t in zip(completions, prompt_template, strict=True):
        answer_format = get_template(t).answer_format
        strict = strict_spans if answer_format in SET_FORMATS else strict_answer
        out.append(1.0 if strict(completion_text(c), answer_format) is not None else 0.0)
    return out


def _tiou(pred, gt, duration) -> float:
    iou = query_iou(pred, gt, duration)
    if iou == 0.0:
        return 0.0
    ps, pe = clamp_interval(pred, duration)
    value = iou * (1 - abs(ps - gt[0]) / duration) * (1 - abs(pe - gt[1]) / duration)
    return max(0.0, value)


def tiou_reward(completions, **columns) -> list[float]:
    """Time-R1's timestamp-aware IoU: IoU · (1 − |Δs|/D) · (1 − |Δe|/D), never below 0.

    IoU as in ``iou_reward`` (clamped prediction; unparseable or reversed → 0), Δs/Δe the clamped prediction's start
    and end minus the ground truth's, D the video duration. Source: "Time-R1: Post-Training Large Vision Language Model
    for Temporal Video Grounding" (arXiv:2503.13377), the timestamp-aware IoU reward.
    """
    return _per_sample(completions, columns, _tiou)


REWARD_FUNCS: dict[str, Callable[..., list[float]]] = {
    "iou": iou_reward,
    "format": format_reward,
    "tiou": tiou_reward,
    **SET_REWARDS,
    **WINDOW_REWARDS,
}


def register_reward(name: str, func: Callable[..., list[float]] | None = None):
    """Register a reward function under ``name`` so configs can list it in ``reward_funcs``.

    Use as ``register_reward("mine", fn)`` or as a decorator ``@register_reward("mine")``. The function has TRL's
    reward signature ``fn(completions, **columns) -> list[float | None]`` (see the module docstring).

    Raises:
        ValueError: ``name`` is empty, contains ``:``, or is already registered to another function.
    """
    def add(fn):
        if not name or ":" in name:
            raise ValueError(f"reward name must be non-empty and without ':', got {name!r}")
        if REWARD_FUNCS.get(name, fn) is not fn:
            raise ValueError(f"reward {name!r} is already registered to {REWARD_FUNCS[name].__module__}."
                             f"{getattr(REWARD_FUNCS[name], '__name__', '?')}")
        REWARD_FUNCS[name] = fn
        return fn

    return add if func is None else add(func)


def _load_user_function(spec: str) -> Callable[..., list[float]]:
    """``module:function`` or ``path/to/file.py:function`` → the function (imported the same way on every rank)."""
    import importlib
    import importlib.util
    from pathlib import Path

    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ValueError(f"reward {spec!r}: expected NAME, module:function or path/to/file.py:function")
    if target.endswith(".py"):
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"reward {spec!r}: no such file {path}")
        module_name = f"grounding_rl_user_rewards.{path.stem}_{abs(hash(str(path))) % 10**8}"
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as err:
            raise ValueError(f"reward {spec!r}: cannot import {target} ({err})") from err
    func = getattr(module, attr, None)
    if not callable(func):
        raise ValueError(f"reward {spec!r}: {target} has no function {attr!r}")
    return func


def get_reward_funcs(names: Sequence[str]) -> list[Callable[..., list[float]]]:
    """Reward functions for ``names``, in order. Each entry is a registered name (``iou``, ``format``, ``tiou``, the
    set rewards, ``twass<β>``/``r2twass<β>``, or one added with :func:`register_reward`), ``module:function``, or ``path/to/file.py:function`` (a relative path
    resolves against the working directory).

    Raises:
        ValueError: an unknown name, or a ``module:function`` / file that cannot be loaded (names the entry).
    """
    if isinstance(names, str):
        names = [names]
    out = []
    for name in names:
        if name in REWARD_FUNCS:
            out.append(REWARD_FUNCS[name])
        elif beta_reward(name) is not None:
            out.append(beta_reward(name))
        elif ":" in name:
            out.append(_load_user_function(name))
        else:
            raise ValueError(f"unknown reward function {name!r}; known: {sorted(REWARD_FUNCS)}, or give "
                             "module:function or path/to/file.py:function")
    return out


def reward_name(func, spec: str | None = None) -> str:
    """The name a reward is logged under (``rewards/<name>/mean``): its registry name, else ``spec`` or the function's
    own name."""
    for name, registered in REWARD_FUNCS.items():
        if func is registered:
            return name
    return spec or getattr(func, "__name__", type(func).__name__)


def weighted_rewards(rewards_per_func: torch.Tensor, weights: Sequence[float] | torch.Tensor | None = None
                     ) -> torch.Tensor:
    """Total reward per completion, as TRL 1.16's GRPOTrainer sums it: ``nansum_k(weights[k] · r[i, k])``.

    Args:
        rewards_per_func: (N, F) float tensor, one column per reward function (TRL's ``rewards_per_func``); NaN where
            a function skipped a completion (returned None).
        weights: F weights, or (N, F) one row per completion (a training set whose rows carry their own reward
            spec; 0 for a function not in a row's spec); None = 1.0 each (TRL's ``reward_weights=None``).

    Returns:
        (N,) tensor on the input's device; NaN for a completion that every function skipped (as in TRL).

    Raises:
        ValueError: the input is not 2-D or the number of weights differs from F.

    Example: IoU [0, 0.7714, 1, 0.8824] and format [1, 1, 1, 1] with weights [5, 1] → [1.0, 4.857, 6.0, 5.412].
    """
    rewards = torch.as_tensor(rewards_per_func, dtype=torch.float32)
    if rewards.ndim != 2:
        raise ValueError(f"rewards_per_func must have shape (num_completions, num_funcs), got {tuple(rewards.shape)}")
    w = (torch.ones(rewards.shape[1]) if weights is None
         else torch.as_tensor(weights, dtype=torch.float32)).to(rewards.device)
    if w.shape != (rewards.shape[1],) and w.shape != rewards.shape:
        raise ValueError(f"Number of reward weights ({w.numel()}) must match number of reward functions "
                         f"({rewards.shape[1]})")
    total = (rewards * w).nansum(dim=1)
    total[torch.isnan(rewards).all(dim=1)] = float("nan")
    return total
