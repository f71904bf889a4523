"""Row-aligned GRPO batches with video: build the prompt tensors, select/slice rows, and the loss-forward inputs.

A batch is a flat dict. Row-aligned entries (first dimension B): ``prompt_ids``, ``prompt_mask``,
``mm_token_type_ids`` (B, P), ``video_grid_thw`` (B, 3), ``second_per_grid_ts`` (B,), ``completion_ids``,
``completion_mask`` (B, C), ``advantages`` (B,), ``old_logps``/``ref_logps`` (B, C) and per-row lists. The one
exception is ``pixel_values_videos`` (Σ_i t_i·h_i·w_i, 1176): row i owns ``prod(video_grid_thw[i])`` consecutive
patch rows. Scalars (``num_items_in_batch``) are shared by all rows.
"""
from __future__ import annotations

import torch

from grounding_rl.preprocessing import build_inputs

PIXELS = "pixel_values_videos"
GRID = "video_grid_thw"


def prompt_batch(processor, items: list[dict], template: str) -> dict:
    """Prompt tensors for items carrying a decoded ``"clip"``; each distinct ``index`` is processed once.

    Rows of the same index (a group's G copies) get identical tensors — the same pixels, grid,
    ``second_per_grid_ts`` and ``mm_token_type_ids`` — which is what generation and both forwards must see.

    Returns:
        Dict with ``prompt_ids``, ``prompt_mask``, ``mm_token_type_ids``, ``pixel_values_videos``,
        ``video_grid_thw``, ``second_per_grid_ts`` (CPU tensors), one row per item, left-padded.
    """
    order = list(dict.fromkeys(item["index"] for item in items))
    position = {index: i for i, index in enumerate(order)}
    by_index = {item["index"]: item for item in items}
    ordered = [by_index[index] for index in order]
    features = build_inputs(processor, [it["query"] for it in ordered], [it["clip"] for it in ordered], template)
    batch = {
        "prompt_ids": features["input_ids"],
        "prompt_mask": features["attention_mask"],
        "mm_token_type_ids": features["mm_token_type_ids"],
        PIXELS: features[PIXELS],
        GRID: features[GRID],
        "second_per_grid_ts": torch.as_tensor(features["second_per_grid_ts"], dtype=torch.float32),
    }
    return select_rows(batch, [position[item["index"]] for item in items])


def _patch_offsets(grid: torch.Tensor) -> list[int]:
    sizes = grid.prod(dim=-1).tolist()
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + int(size))
    return offsets


def select_rows(batch: dict, rows: list[int]) -> dict:
    """A new batch made of ``rows`` (in that order, repeats allowed), pixel patches following their rows."""
    num_rows = batch[GRID].shape[0]
    out = {}
    for key, value in batch.items():
        if key == PIXELS:
            offsets = _patch_offsets(batch[GRID])
            out[key] = torch.cat([value[offsets[r]:offsets[r + 1]] for r in rows])
        elif isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == num_rows:
            out[key] = value[torch.as_tensor(rows, dtype=torch.long, device=value.device)]
        elif isinstance(value, list) and len(value) == num_rows:
            out[key] = [value[r] for r in rows]
        else:
            out[key] = value
    return out


def split_rows(batch: dict, chunks: int) -> list[dict]:
    """Split into ``chunks`` consecutive equal parts (TRL's ``split_tensor_dict``, video-aware).

    Raises:
        ValueError: the number of rows is not divisible by ``chunks``.
    """
    num_rows = batch[GRID].shape[0]
    if num_rows % chunks:
        raise ValueError(f"cannot split {num_rows} rows into {chunks} equal parts")
    size = num_rows // chunks
    return [select_rows(batch, list(range(i * size, (i + 1) * size))) for i in range(chunks)]


def generation_inputs(batch: dict) -> dict:
    """The prompt tensors under the model's argument names (for ``generate``)."""
    return {
        "input_ids": batch["prompt_ids"],
        "attention_mask": batch["prompt_mask"],
        "mm_token_type_ids": batch["mm_token_type_ids"],
        PIXELS: batch[PIXELS],
        GRID: batch[GRID],
        "second_per_grid_ts": batch["second_per_grid_ts"],
    }


def forward_inputs(batch: dict) -> dict:
    """Model inputs for the policy/reference forward over prompt + completion.

    ``input_ids`` = [prompt_ids, completion_ids]; ``attention_mask`` = [prompt_mask, completion_mask];
    ``mm_token_type_ids`` extended with zeros (completion tokens are text); the video tensors unchanged.
    """
    completion_ids, completion_mask = batch["completion_ids"], batch["completion_mask"]
    mm = batch["mm_token_type_ids"]
    return {
        "input_ids": torch.cat([batch["prompt_ids"], completion_ids], dim=1),
        "attention_mask": torch.cat([batch["prompt_mask"], completion_mask.to(batch["prompt_mask"].dtype)], dim=1),
        "mm_token_type_ids": torch.cat([mm, torch.zeros_like(completion_ids, dtype=mm.dtype)], dim=1),
        PIXELS: batch[PIXELS],
        GRID: batch[GRID],
        "second_per_grid_ts": batch["second_per_grid_ts"],
    }


def to_device(batch: dict, device) -> dict:
    """Move tensors to ``device`` (other values unchanged)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
