"""The policy and reference forwards with each group's prompt run once: one packed row per distinct prompt.

The G rows of a GRPO group share their prompt — video tokens included — token for token; only the completions differ.
Run row by row, the language model processes that prompt G times. Prefix Grouper (Liu et al., "Prefix Grouper:
Efficient GRPO Training through Shared-Prefix Forward", arXiv 2506.05433) computes the shared prefix once and lets each
completion attend to [prefix; itself]. Here that is a packed row per group::

    [ prompt (P, left-padded as in the batch) | completion of row 1 (C) | … | completion of row G (C) ]

with a 4-D attention mask (transformers takes a prepared 4-D mask as it is): prompt tokens attend causally to the
prompt; the tokens of completion g attend to the prompt and causally to completion g only, each key masked exactly as
the per-row ``attention_mask`` masks it. Position ids are the per-row 3-D RoPE ids (``get_rope_index`` on each row's
prompt + completion), copied into the packed layout, so every token sees exactly the keys, values and positions it
sees in its own row: outputs and gradients are those of the per-row forward up to floating-point summation order (the
prompt's gradient is the sum over the group's completions, as in the per-row path). The vision tower runs once per
group (``mm_encoder_outputs``), the LM head only on the positions that predict completion tokens.

Supported where the attention takes an arbitrary 4-D mask (``sdpa``: boolean; ``eager``: additive); elsewhere (e.g.
``flash_attention_2``) :func:`supports_prefix_sharing` is False and the caller falls back to the per-row forward.
"""
from __future__ import annotations

import torch

from grounding_rl.models.vision import encode_videos, rope_position_ids, unwrap
from grounding_rl.prompts.preprocessing import PIXELS, VIDEO_INDEX
from grounding_rl.update.batching import clip_grid, completion_outputs, forward_inputs

SUPPORTED_ATTENTION = ("sdpa", "eager")


def supports_prefix_sharing(model) -> tuple[bool, str]:
    """Whether :func:`packed_completion_logps` can run on ``model``, and why not when it cannot."""
    implementation = getattr(unwrap(model).config, "_attn_implementation", None)
    if implementation not in SUPPORTED_ATTENTION:
        return False, f"attention implementation {implementation!r} takes no 4-D mask (supported: {SUPPORTED_ATTENTION})"
    return True, ""


def group_rows(video_index: torch.Tensor) -> list[list[int]]:
    """Rows of each distinct prompt u = 0..U-1 (rows with the same ``video_index`` share the whole prompt), in row
    order. Raises ValueError when a clip index has no row."""
    index = video_index.tolist()
    groups: list[list[int]] = [[] for _ in range(max(index) + 1 if index else 0)]
    for row, clip in enumerate(index):
        groups[clip].append(row)
    if any(not rows for rows in groups):
        raise ValueError(f"video_index {index} leaves a clip without rows")
    return groups


def packed_layout(prompt_mask: torch.Tensor, completion_mask: torch.Tensor, groups: list[list[int]]):
    """The packed rows' key mask and the logit positions.

    Args:
        prompt_mask: (B, P) 1 for real prompt tokens (left padding 0).
        completion_mask: (B, C) 1 for completion tokens that attend and are attended.
        groups: rows of each packed row (:func:`group_rows`), at most ``G`` each.

    Returns:
        ``(allowed, logit_index)``: ``allowed`` (U, L, L) bool with L = P + G·C, True where query i may attend to key
        j (every query also sees itself, so padding rows never hold an empty softmax); ``logit_index`` (G·C,) the
        positions whose logits predict completion token t of slot g: P − 1 for t = 0, P + g·C + t − 1 otherwise.
    """
    num_rows, prompt_length = prompt_mask.shape
    length = completion_mask.shape[1]
    slots = max(len(rows) for rows in groups)
    total = prompt_length + slots * length
    device = prompt_mask.device
    causal_prompt = torch.ones(prompt_length, prompt_length, dtype=torch.bool, device=device).tril()
    causal_completion = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    allowed = torch.zeros(len(groups), total, total, dtype=torch.bool, device=device)
    for u, rows in enumerate(groups):
        keys = prompt_mask[rows[0]].bool()
        allowed[u, :prompt_length, :prompt_length] = causal_prompt & keys
        for g, row in enumerate(rows):
            start = prompt_length + g * length
            allowed[u, start:start + length, :prompt_length] = keys
            allowed[u, start:start + length, start:start + length] = causal_completion & completion_mask[row].bool()
    allowed |= torch.eye(total, dtype=torch.bool, device=device)
    offsets = prompt_length + torch.arange(slots, device=device).unsqueeze(1) * length + torch.arange(
        length, device=device) - 1
    offsets[:, 0] = prompt_length - 1
    return allowed, offsets.reshape(-1)


def packed_completion_logps(model, batch: dict, temperature: float = 1.0, return_logits: bool = False):
    """log π(o_t | prompt, video, o_<t) for each completion token, with each group's prompt run once: the arguments
    and results of :func:`grounding_rl.update.logprobs.completion_logps` (in the batch's row order, equal to its
    per-row forward up to summation order), for a shared-video ``batch`` (``video_index``) whose rows of one clip
    share the whole prompt, on a ``model`` whose attention takes a 4-D mask (:func:`supports_prefix_sharing`).

    Raises:
        KeyError: the batch has no ``video_index``.
    """
    completion_ids, completion_mask = batch["completion_ids"], batch["completion_mask"]
    prompt_ids, prompt_mask = batch["prompt_ids"], batch["prompt_mask"]
    groups = group_rows(batch[VIDEO_INDEX])
    prompt_length, length = prompt_ids.shape[1], completion_ids.shape[1]
    slots = max(len(rows) for rows in groups)
    inputs = forward_inputs(batch)
    positions = rope_position_ids(model, inputs)  # (3, B, P + C): each row's own 3-D positions
    allowed, logit_index = packed_layout(prompt_mask, completion_mask, groups)

    total = prompt_length + slots * length
    ids = torch.zeros(len(groups), total, dtype=prompt_ids.dtype, device=prompt_ids.device)  # unused slots: masked
    packed_positions = torch.zeros(positions.shape[0], len(groups), total, dtype=positions.dtype,
                                   device=positions.device)
    for u, rows in enumerate(groups):
        ids[u, :prompt_length] = prompt_ids[rows[0]]
        packed_positions[:, u, :prompt_length] = positions[:, rows[0], :prompt_length]
        for g, row in enumerate(rows):
            start = prompt_length + g * length
            ids[u, start:start + length] = completion_ids[row]
            packed_positions[:, u, start:start + length] = positions[:, row, prompt_length:]

    core = unwrap(model)
    if getattr(core.config, "_attn_implementation", None) == "eager":
        dtype = next(core.parameters()).dtype
        attention = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min)
    else:
        attention = allowed
    encoded = encode_videos(model, inputs[PIXELS], clip_grid(batch), list(range(len(groups))))
    outputs = model(input_ids=ids, attention_mask=attention.unsqueeze(1), position_ids=packed_positions,
                    mm_encoder_outputs=encoded, logits_to_keep=logit_index, use_cache=False)
    logits = outputs.logits.view(len(groups), slots, length, -1)  # (U, G, C, V)
    slot_of = {row: (u, g) for u, rows in enumerate(groups) for g, row in enumerate(rows)}
    u_index = torch.tensor([slot_of[r][0] for r in range(len(slot_of))], device=logits.device)
    g_index = torch.tensor([slot_of[r][1] for r in range(len(slot_of))], device=logits.device)
    logits = logits[u_index, g_index]  # (B, C, V) in row order
    return completion_outputs(model, logits, completion_ids, temperature, return_logits)
