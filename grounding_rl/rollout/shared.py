"""Generation that encodes, and prefills, each distinct clip once instead of once per row.

GRPO scores G completions of the same (video, query) prompt. Done naively, every one of the G rows re-encodes the
video in the vision tower and re-prefills the long video prompt. Here a batch keeps the patches of its U *distinct*
clips and a ``video_index`` (B,) telling which distinct clip each of its B rows uses (any mapping: a clip may have G
rows, fewer — when a group is split across ranks — or a different count than its neighbours):

* :func:`grounding_rl.models.vision.encode_videos` runs the vision tower once on the U clips and hands each row its
  clip's features through transformers' ``mm_encoder_outputs``;
* :func:`generate_shared` prefills each distinct prompt once (vision tower included), gathers the KV cache and the
  3D-RoPE offsets to the B rows (``DynamicCache.batch_select_indices`` with repeated indices), then samples with HF
  ``generate`` continuing from that cache.

Both are exact: the same logits (fp32, up to summation order) and, for the same seed, the same sampled tokens as the
per-row computation (``tests/test_sharing.py``).
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from grounding_rl.family import family_of
from grounding_rl.models.vision import core_model, encode_videos, first_rows, unwrap
from grounding_rl.prompts.preprocessing import TEXT_KEYS


@torch.no_grad()
def generate_shared(model, inputs: dict, video_index: torch.Tensor, prefill_once: bool = True, **generate_kwargs):
    """Sample one completion per row, encoding (and by default prefilling) each distinct prompt once.

    Rows that share a clip index must share the whole prompt (the trainer's rows of one dataset index do).

    Args:
        model: the unwrapped generation model (inside TRL's ``unwrap_model_for_generation``: ZeRO-3 parameters
            gathered or hooked, PEFT adapter active).
        inputs: ``input_ids``, ``attention_mask``, ``mm_token_type_ids`` (B, P) left-padded, the family's per-row
            video tensors (``video_grid_thw`` (B, 3); Qwen2.5-VL's ``second_per_grid_ts`` (B,)); ``pixel_values_videos``
            of the U distinct clips only.
        video_index: (B,) distinct-clip index of each row.
        prefill_once: True → prefill the U distinct prompts (all but their last token) once, gather the KV cache and
            ``rope_deltas`` to the B rows, then let ``generate`` continue; False → encode the video once
            (``mm_encoder_outputs``) but prefill all B rows inside ``generate``.
        generate_kwargs: sampling settings for ``generate`` (``max_new_tokens``, ``do_sample``, ``temperature``...).

    Returns:
        (B, P + new) token ids, as ``model.generate`` on the B per-row inputs would return them (the same tokens for
        the same RNG state; checked in ``tests/test_sharing.py``).
    """
    video_index = torch.as_tensor(video_index, dtype=torch.long, device=inputs["input_ids"].device)
    first = first_rows(video_index)
    row_keys = family_of(unwrap(model)).row_video_keys
    per_row = {k: torch.as_tensor(inputs[k], device=video_index.device) for k in TEXT_KEYS + row_keys}
    pixels, clip_grid = inputs["pixel_values_videos"], per_row["video_grid_thw"][first]
    if not prefill_once:
        encoded = encode_videos(model, pixels, clip_grid, video_index)
        return model.generate(**per_row, mm_encoder_outputs=encoded, **generate_kwargs)
    core = core_model(model)
    first_t = torch.as_tensor(first, device=video_index.device)
    head = {k: per_row[k][first_t, :-1] for k in TEXT_KEYS}
    out = model(
        **head,
        **{k: per_row[k][first_t] for k in row_keys},
        pixel_values_videos=pixels,
        cache=DynamicCache(config=unwrap(model).config),
        use_cache=True,
        logits_to_keep=1,
    )
    cache = out.cache
    cache.batch_select_indices(video_index)  # advanced indexing: repeats allowed, any order
    core.rope_deltas = _continuation_deltas(core, {k: v[first_t] for k, v in per_row.items()}, row_keys)[video_index]
    return model.generate(**per_row, cache=cache, **generate_kwargs)


def _continuation_deltas(core, prompts: dict, row_keys) -> torch.Tensor:
    """(U, 1) offset from the text position to the 3D RoPE position of each prompt's last token.

    ``generate`` continuing from a filled cache places new tokens at ``text position + rope_deltas``. The
    ``rope_deltas`` that a prefill stores (transformers 5.24 ``get_rope_index``: max position + 1 − length) are past the
    video's largest *temporal* id, while the 3D ids that ``get_rope_index`` gives the text after a video — and that
    ``generate`` without a cache, the policy and the reference forwards use — continue from the video's spatial
    extent. Whenever the temporal ids run past the text (long clips), the stored offset would shift the last prompt
    token and every completion token; this offset makes them continue exactly as in a full-prompt prefill. (For
    Qwen3-VL, whose frames are separate temporal groups, the two offsets agree; the same rule serves both families.)
    ``row_keys`` are the family's per-row video tensors (:attr:`grounding_rl.family.Family.row_video_keys`).
    """
    positions, _ = core.get_rope_index(
        prompts["input_ids"],
        mm_token_type_ids=prompts["mm_token_type_ids"],
        attention_mask=prompts["attention_mask"],
        **{k: prompts[k] for k in row_keys},
    )
    text_last = prompts["attention_mask"].long().sum(dim=-1) - 1  # generate's text position: cumsum(mask) − 1
    return (positions[0, :, -1] - text_last).unsqueeze(1)
