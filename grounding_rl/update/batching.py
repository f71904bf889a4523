"""Row-aligned GRPO batches with video: build the prompt tensors, select/slice rows, and the loss-forward inputs.

A batch is a flat dict. Row-aligned entries (first dimension B): ``prompt_ids``, ``prompt_mask``,
``mm_token_type_ids`` (B, P), the family's per-row video tensors (``video_grid_thw`` (B, 3); Qwen2.5-VL's
``second_per_grid_ts`` (B,)), ``completion_ids``, ``completion_mask`` (B, C), ``advantages`` (B,),
``old_logps``/``ref_logps`` (B, C) and per-row lists. The one exception is ``pixel_values_videos`` (Σ_i t_i·h_i·w_i,
3·2·patch²): row i owns ``prod(video_grid_thw[i])`` consecutive patch rows. Scalars (``num_items_in_batch``) are
shared by all rows.

Shared videos (``share_video_encoding``): the batch also holds ``video_index`` (B,) long — the distinct clip
each row uses — and ``pixel_values_videos`` then holds the patches of the U distinct clips only, clip u owning
``prod(video_grid_thw[r])`` consecutive patch rows for any row r with ``video_index[r] == u``. Every clip is used by
at least one row; :func:`select_rows` / :func:`split_rows` keep only the clips their rows use, renumbered in order of
first use. Generation and both forwards then run the vision tower once per distinct clip
(:mod:`grounding_rl.rollout.shared`).
"""
from __future__ import annotations

import torch

from grounding_rl.family import DEFAULT_VIDEO_LAYOUT
from grounding_rl.models.vision import first_rows
from grounding_rl.prompts.preprocessing import (CLIPS, GRID, MODEL_INPUT_KEYS, PER_ROW_VIDEO_KEYS, PIXELS, VIDEO_INDEX,
                                             build_inputs, split_patches)


def prompt_batch(processor, items: list[dict], template: str, share_videos: bool = False,
                 video_layout: str = DEFAULT_VIDEO_LAYOUT) -> dict:
    """Prompt tensors for items carrying a decoded ``"clip"``; each distinct clip (:func:`clip_key`: ``index`` and
    window) is processed once.

    Rows of the same index (a group's G copies) get identical tensors — the same token ids (with Qwen3-VL's
    textual timestamps), pixels, grid, ``mm_token_type_ids`` (and Qwen2.5-VL's ``second_per_grid_ts``) — which is
    what generation and both forwards must see.

    Args:
        processor: the model's processor (its family decides the preprocessing).
        items: collated items (``index``, ``query``, ``clip``).
        template: prompt template name (an item's own ``prompt_template`` wins).
        share_videos: keep one copy of each distinct clip's patches and a ``video_index`` (see the module
            docstring) instead of one copy per row.
        video_layout: how the video tokens sit in the prompt (:data:`grounding_rl.family.VIDEO_LAYOUTS`).

    Returns:
        Dict with ``prompt_ids``, ``prompt_mask``, ``mm_token_type_ids``, ``pixel_values_videos`` and the
        family's per-row video tensors (CPU tensors), one row per item, left-padded; plus ``video_index`` when
        ``share_videos``.
    """
    order = list(dict.fromkeys(clip_key(item) for item in items))
    position = {key: i for i, key in enumerate(order)}
    by_key = {clip_key(item): item for item in items}
    ordered = [by_key[key] for key in order]
    features = build_inputs(processor, [it["query"] for it in ordered], [it["clip"] for it in ordered],
                            [it.get("prompt_template") or template for it in ordered], video_layout=video_layout)
    batch = {
        "prompt_ids": features["input_ids"],
        "prompt_mask": features["attention_mask"],
        "mm_token_type_ids": features["mm_token_type_ids"],
        PIXELS: features[PIXELS],
        **{key: torch.as_tensor(features[key]) for key in PER_ROW_VIDEO_KEYS if key in features},
    }
    if share_videos:
        batch[VIDEO_INDEX] = torch.arange(len(ordered))
    return select_rows(batch, [position[clip_key(item)] for item in items])


def clip_key(item: dict) -> tuple:
    """What makes two rows' prompts identical: the sample ``index`` and the part of its video the clip is (a two-pass
    zoom's pass-2 row shares its index with pass 1 but sees a window; ``SampledVideo.window``, None for the whole)."""
    window = getattr(item.get("clip"), "window", None)
    return (item["index"], None if window is None else tuple(window))


def clip_grid(batch: dict) -> torch.Tensor:
    """(U, 3) grid of each distinct clip of a shared-video batch (from the first row using it).

    Raises:
        KeyError: the batch has no ``video_index``.
        ValueError: a distinct clip is used by no row.
    """
    first = first_rows(batch[VIDEO_INDEX])
    return batch[GRID][torch.as_tensor(first, dtype=torch.long, device=batch[GRID].device)]


def row_count(batch: dict) -> int:
    """B: the rows of a batch (one clip grid per row; a conversation batch, whose rows hold several videos in a per-row
    list, has no batch-level grid and counts its ``completion_ids``)."""
    return batch[GRID].shape[0] if GRID in batch else batch["completion_ids"].shape[0]


def select_rows(batch: dict, rows: list[int]) -> dict:
    """A new batch made of ``rows`` (in that order, repeats allowed), pixel patches following their rows.

    Per-row pixels: row r's patches are copied once per selection of r. Shared videos (``video_index``): only the
    distinct clips the selected rows use are kept, once each, renumbered in order of first use.
    """
    num_rows = row_count(batch)
    out = {}
    if VIDEO_INDEX in batch:
        index = batch[VIDEO_INDEX]
        clips = split_patches(batch[PIXELS], clip_grid(batch))
        picked = index[torch.as_tensor(rows, dtype=torch.long, device=index.device)].tolist()
        used = list(dict.fromkeys(picked))
        renumber = {clip: i for i, clip in enumerate(used)}
        out[VIDEO_INDEX] = torch.tensor([renumber[c] for c in picked], dtype=index.dtype, device=index.device)
        out[PIXELS] = torch.cat([clips[u] for u in used])
    for key, value in batch.items():
        if key in out:
            continue
        if key == PIXELS and GRID in batch:
            per_row = split_patches(value, batch[GRID])
            out[key] = torch.cat([per_row[r] for r in rows])
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
    num_rows = row_count(batch)
    if num_rows % chunks:
        raise ValueError(f"cannot split {num_rows} rows into {chunks} equal parts")
    size = num_rows // chunks
    return [select_rows(batch, list(range(i * size, (i + 1) * size))) for i in range(chunks)]


def generation_inputs(batch: dict, items: list[dict] | None = None) -> dict:
    """The prompt tensors under the model's argument names (for ``generate``), plus ``video_index`` for a
    shared-video batch (the rollout engine must then encode/prefill per distinct clip), plus ``clips`` (the decoded
    :class:`~grounding_rl.data.video.SampledVideo` of each row, for an engine that processes frames itself, vLLM)
    when the batch's ``items`` (row order, as :func:`prompt_batch` got them) are given."""
    names = {"input_ids": "prompt_ids", "attention_mask": "prompt_mask"}  # the batch's names for the prompt's
    inputs = {key: batch[names.get(key, key)] for key in MODEL_INPUT_KEYS if names.get(key, key) in batch}
    if VIDEO_INDEX in batch:
        inputs[VIDEO_INDEX] = batch[VIDEO_INDEX]
    if items is not None:
        inputs[CLIPS] = [item["clip"] for item in items]
    return inputs


def forward_inputs(batch: dict) -> dict:
    """Model inputs for the policy/reference forward over prompt + completion.

    ``input_ids`` = [prompt_ids, completion_ids]; ``attention_mask`` = [prompt_mask, completion_mask];
    ``mm_token_type_ids`` extended with zeros (completion tokens are text); the video tensors unchanged (with
    ``video_index`` for a shared-video batch: :func:`grounding_rl.update.logprobs.completion_logps` turns it and the
    distinct clips' pixels into ``mm_encoder_outputs``).
    """
    completion_ids, completion_mask = batch["completion_ids"], batch["completion_mask"]
    mm = batch["mm_token_type_ids"]
    inputs = generation_inputs(batch)
    inputs.update(
        input_ids=torch.cat([batch["prompt_ids"], completion_ids], dim=1),
        attention_mask=torch.cat([batch["prompt_mask"], completion_mask.to(batch["prompt_mask"].dtype)], dim=1),
        mm_token_type_ids=torch.cat([mm, torch.zeros_like(completion_ids, dtype=mm.dtype)], dim=1),
    )
    return inputs


def to_device(batch: dict, device) -> dict:
    """Move tensors to ``device`` (other values unchanged)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def config_prompt_batch(processor, items: list[dict], config, device) -> dict:
    """:func:`prompt_batch` of ``items`` with a training ``config``'s ``prompt_template``, ``share_video_encoding``
    and ``video_layout``, on ``device``."""
    return to_device(prompt_batch(processor, items, config.prompt_template, share_videos=config.share_video_encoding,
                                  video_layout=config.video_layout), device)


OWN_LOGITS_DTYPE = "own_logits_dtype"  # set on the LM head by grounding_rl.update.logprobs.float32_head


def completion_outputs(model, logits: torch.Tensor, completion_ids: torch.Tensor, temperature: float,
                       return_logits: bool):
    """The log-probs (and logits) a completion forward returns, from its (B, C, V) completion logits.

    Args:
        model: the model the forward ran (possibly wrapped).
        logits: (B, C, V) logits, position t predicting completion token t: the model's own, or, with
            ``return_logits``, float32 ones from its head under :func:`grounding_rl.update.logprobs.float32_head`.
        completion_ids: (B, C) token ids.
        temperature: the log-probs' logits are divided by it, as in sampling.
        return_logits: also return ``logits`` as given: float32 and *not* divided by the temperature (the divergences
            of :mod:`grounding_rl.update.divergence` apply it in float32). The log-probs then come from the logits
            rounded to the dtype the model's own head would have returned in that forward (recorded by
            ``float32_head``: autocast's dtype, else the weights'), so they equal those of a forward without
            ``return_logits`` (π_old, π_ref) up to the order of the float32 sums.

    Returns:
        (B, C) log-probs (TRL's ``selective_log_softmax``), or ``(logps, logits)`` with ``return_logits``.
    """
    from trl.trainer.utils import selective_log_softmax

    rounded = logits
    if return_logits:
        from grounding_rl.models.vision import unwrap

        rounded = logits.to(getattr(unwrap(model).get_output_embeddings(), OWN_LOGITS_DTYPE))
    if temperature != 1.0:
        rounded = rounded / temperature
    logps = selective_log_softmax(rounded, completion_ids)
    return (logps, logits) if return_logits else logps
