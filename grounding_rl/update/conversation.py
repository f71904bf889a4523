"""GRPO over whole conversations: the loss batch of multi-turn trajectories, its forward, and what a rollout logs.

A completion is a trajectory of model and tool turns (:mod:`grounding_rl.rollout.conversation`). Its loss batch has
the row layout of a single-turn batch — ``prompt_ids`` / ``prompt_mask`` (B, P) left-padded, ``completion_ids``
(B, C) right-padded — with ``completion_mask`` = the *model* tokens only (TRL 1.16's ``completion_mask * tool_mask``:
log-probs, KL, the loss and ``num_items_in_batch`` count model tokens), while every real token, tool tokens
included, is attended (``conversation_attention``). The videos of row b — its clip, then each window in order — are
the per-row list ``conversation_videos[b]``; rows are selected and split like any batch
(:func:`grounding_rl.update.batching.select_rows`). The advantage stays one per row: per trajectory.

The forward (:func:`conversation_logps`) is one pass over prompt + completion with every video of the row, the same
token ids and video tensors that generated each turn (:func:`grounding_rl.rollout.conversation.conversation_inputs`),
so π_θ, π_old and π_ref see the same multi-turn inputs; each distinct clip or window of the batch goes through the
vision tower once per forward (:func:`distinct_videos`; generation, once per rollout:
:class:`grounding_rl.models.vision.VideoFeatureCache`).
"""
from __future__ import annotations

import torch

from grounding_rl.prompts.preprocessing import GRID, PIXELS
from grounding_rl.reward.window import window_coverage
from grounding_rl.rollout.conversation import Trajectory
from grounding_rl.update.batching import completion_outputs

CONVERSATION = "conversation_videos"  # the key that marks a conversation batch: per row, its videos in token order
ATTENTION = "conversation_attention"  # (B, C): 1 at every real completion token, model or tool


def conversation_batch(trajectories: list[Trajectory], pad_token_id: int) -> dict:
    """The loss batch of finished trajectories (CPU tensors; module docstring for the keys).

    ``mm_token_type_ids`` is (B, P + C) over prompt + completion (2 at every video token, windows included).
    """
    prompts = [t.prompt_ids for t in trajectories]
    width_p = max(len(p) for p in prompts)
    width_c = max(1, max(len(t.completion_ids) for t in trajectories))

    def left(values, width, fill):
        return [[fill] * (width - len(v)) + list(v) for v in values]

    def right(values, width, fill):
        return [list(v) + [fill] * (width - len(v)) for v in values]

    mm = [l + r for l, r in zip(left([t.prompt_mm for t in trajectories], width_p, 0),
                                right([t.completion_mm for t in trajectories], width_c, 0))]
    return {
        "prompt_ids": torch.tensor(left(prompts, width_p, pad_token_id), dtype=torch.long),
        "prompt_mask": torch.tensor(left([[1] * len(p) for p in prompts], width_p, 0), dtype=torch.long),
        "completion_ids": torch.tensor(right([t.completion_ids for t in trajectories], width_c, pad_token_id),
                                       dtype=torch.long),
        "completion_mask": torch.tensor(right([t.tool_mask for t in trajectories], width_c, 0), dtype=torch.int),
        ATTENTION: torch.tensor(right([[1] * len(t.completion_ids) for t in trajectories], width_c, 0),
                                dtype=torch.long),
        "mm_token_type_ids": torch.tensor(mm, dtype=torch.long),
        CONVERSATION: [list(t.videos) for t in trajectories],
    }


def forward_inputs(batch: dict) -> dict:
    """Model inputs over prompt + completion of a conversation batch: ``input_ids``, ``attention_mask`` (prompt mask,
    then ``conversation_attention``), ``mm_token_type_ids``, and every row's videos concatenated row by row in token
    order (``pixel_values_videos``, ``video_grid_thw`` (V, 3), Qwen2.5-VL's ``second_per_grid_ts`` (V,))."""
    device = batch["prompt_ids"].device
    videos = [video for row in batch[CONVERSATION] for video in row]
    inputs = {
        "input_ids": torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
        "attention_mask": torch.cat([batch["prompt_mask"], batch[ATTENTION].to(batch["prompt_mask"].dtype)], dim=1),
        "mm_token_type_ids": batch["mm_token_type_ids"],
        PIXELS: torch.cat([v[PIXELS] for v in videos]).to(device),
        GRID: torch.stack([torch.as_tensor(v[GRID]) for v in videos]).to(device),
    }
    if "second_per_grid_ts" in videos[0]:
        inputs["second_per_grid_ts"] = torch.stack([torch.as_tensor(v["second_per_grid_ts"]) for v in videos]
                                                   ).to(device)
    return inputs


def distinct_videos(batch: dict) -> tuple[list[dict], list[int]]:
    """The distinct videos of a conversation batch (by ``key``: a group's G rows share their clip, and rows that
    requested the same window share it) in order of first use, and for each video of each row, row by row in token
    order, the index of its distinct video."""
    first: dict = {}
    distinct, index = [], []
    for row in batch[CONVERSATION]:
        for video in row:
            if video["key"] not in first:
                first[video["key"]] = len(distinct)
                distinct.append(video)
            index.append(first[video["key"]])
    return distinct, index


def conversation_logps(model, batch: dict, temperature: float = 1.0, return_logits: bool = False):
    """log π(o_t | everything before t) for every completion token of a conversation batch
    (:func:`conversation_batch`, on the model's device), in one forward: the arguments and results of
    :func:`grounding_rl.update.logprobs.completion_logps`, meaningful where ``completion_mask`` is 1 (model tokens;
    tool and padding positions are masked by the caller)."""
    from grounding_rl.models.vision import encode_videos
    length = batch["completion_ids"].size(1)
    inputs = forward_inputs(batch)
    distinct, index = distinct_videos(batch)
    if len(distinct) < len(index):  # each distinct clip or window through the vision tower once
        device = inputs[PIXELS].device
        inputs.pop(PIXELS)
        inputs["mm_encoder_outputs"] = encode_videos(
            model, torch.cat([v[PIXELS] for v in distinct]).to(device),
            torch.stack([torch.as_tensor(v[GRID]) for v in distinct]).to(device), index)
    outputs = model(**inputs, logits_to_keep=length + 1, use_cache=False)
    return completion_outputs(model, outputs.logits[:, :-1, :], batch["completion_ids"], temperature, return_logits)


METRIC_SUMS = ("trajectories", "turns", "calls", "failures", "coverage_sum", "windows", "context_forced")


def metric_sums(trajectories: list[Trajectory], gts: list[tuple[float, float]]) -> list[float]:
    """The sums behind :func:`conversation_metrics`, in :data:`METRIC_SUMS` order, to be summed over processes
    before dividing (so that a run's metrics weigh every trajectory alike)."""
    covered = [window_coverage(t.windows[-1], gt) for t, gt in zip(trajectories, gts) if t.windows]
    return [float(len(trajectories)), float(sum(len(t.turns) for t in trajectories)),
            float(sum(t.calls for t in trajectories)), float(sum(t.failures for t in trajectories)),
            float(sum(covered)), float(len(covered)), float(sum(t.context_forced for t in trajectories))]


def metrics_from_sums(sums) -> dict[str, float]:
    """:func:`conversation_metrics` from (summed) :func:`metric_sums`."""
    n, turns, calls, failures, coverage, windows, forced = (float(v) for v in sums)
    return {"turns/mean": turns / max(n, 1.0),
            "tools/call_frequency": calls / max(n, 1.0),
            "tools/failure_frequency": failures / calls if calls else 0.0,
            "zoom/coverage": coverage / windows if windows else float("nan"),
            "tools/context_forced": forced / max(n, 1.0)}


def conversation_metrics(trajectories: list[Trajectory], gts: list[tuple[float, float]]) -> dict[str, float]:
    """What a multi-turn rollout logs (over the given rows; the trainer sums :func:`metric_sums` over processes).

    ``turns/mean``: model turns per trajectory; ``tools/call_frequency``: crop requests per trajectory (TRL 1.16:
    calls / completions); ``tools/failure_frequency``: refused requests / requests (0 without any, TRL's rule);
    ``zoom/coverage``: mean share of the ground truth inside the last sampled window
    (:func:`grounding_rl.reward.window.window_coverage`), over trajectories that sampled one (NaN if none did);
    ``tools/context_forced``: share of trajectories whose context filled up (a forced answer).

    E.g. two trajectories, one answering at once, one cropping (4, 12) then answering, gt (5, 9) and (10, 14):
    turns/mean 1.5, call_frequency 0.5, failure_frequency 0, coverage 0.5.
    """
    return metrics_from_sums(metric_sums(trajectories, gts))
