"""Work done once per clip instead of once per completion (issue 7).

GRPO scores G completions of the same (video, query) prompt. Done naively, every one of the G rows re-encodes the
video in the vision tower and re-prefills the long video prompt. Here:

* :func:`encode_videos` runs the vision tower once per clip and hands the same features to all G rows through
  transformers' ``mm_encoder_outputs`` (Qwen2.5-VL ``forward`` and ``generate`` accept it); gradients from the G rows
  flow into the one encoding.
* :func:`generate_grouped` prefills each clip's prompt once, repeats the KV cache G times, then samples the G
  continuations with HF ``generate``.

Both are exact: the same logits (fp32, up to summation order) and, for the same seed, the same sampled tokens as the
per-row computation.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPooling

TEXT_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids")
PER_ROW_KEYS = ("video_grid_thw", "second_per_grid_ts")


def _core(model):
    """The ``Qwen2_5_VLModel`` inside a (possibly PEFT- or DDP-wrapped) ``Qwen2_5_VLForConditionalGeneration``."""
    for attr in ("module", "base_model", "model"):
        while hasattr(model, attr) and not hasattr(model, "get_rope_index"):
            model = getattr(model, attr)
    return model


def encode_videos(model, pixel_values_videos: torch.Tensor, video_grid_thw: torch.Tensor, rows: list[int]) -> dict:
    """Encode each distinct clip once and give every row its clip's features.

    Args:
        model: a Qwen2.5-VL model (any wrapper exposing ``get_video_features``).
        pixel_values_videos: patches of the U distinct clips, concatenated (Σ patches, 1176).
        video_grid_thw: (U, 3) grid of each distinct clip.
        rows: for each of the B model rows, the index (0..U-1) of its clip.

    Returns:
        ``mm_encoder_outputs`` for the model call: ``{"video": BaseModelOutputWithPooling(pooler_output=tuple of B
        tensors (tokens_i, hidden))}``; pass it instead of ``pixel_values_videos`` (keep ``video_grid_thw`` per row for
        the 3D position ids).
    """
    features = model.get_video_features(pixel_values_videos, video_grid_thw, return_dict=True).pooler_output
    return {"video": BaseModelOutputWithPooling(pooler_output=tuple(features[i] for i in rows))}


@torch.no_grad()
def generate_grouped(model, inputs: dict, num_generations: int, prefill_once: bool = True, **generate_kwargs):
    """Sample ``num_generations`` completions for each of U distinct prompts.

    Args:
        model: the unwrapped generation model.
        inputs: processor outputs for the U distinct (video, query) prompts (``build_inputs``), left-padded.
        num_generations: G.
        prefill_once: True → encode the video and prefill the prompt once per clip, repeat the KV cache G times, then
            sample; False → HF's ``num_return_sequences`` (the video is still encoded once, but the prompt is
            prefilled G times).
        generate_kwargs: sampling settings for ``generate`` (``max_new_tokens``, ``do_sample``, ``temperature``...).

    Returns:
        (U·G, L + new) token ids, rows ordered clip 0 × G, clip 1 × G, … (the order of ``repeat_interleave``).
    """
    g = num_generations
    if not prefill_once:
        return model.generate(**inputs, num_return_sequences=g, **generate_kwargs)
    core = _core(model)
    head = {k: inputs[k][:, :-1] for k in TEXT_KEYS}
    out = model(
        **head,
        pixel_values_videos=inputs["pixel_values_videos"],
        video_grid_thw=inputs["video_grid_thw"],
        second_per_grid_ts=inputs["second_per_grid_ts"],
        cache=DynamicCache(config=model.config),
        use_cache=True,
        logits_to_keep=1,
    )
    cache = out.cache
    cache.batch_repeat_interleave(g)
    # generate() continues from a filled cache with position = text position + rope_deltas (the 3D RoPE offset that
    # the prefill stored per row); give each of the G copies its clip's offset.
    core.rope_deltas = core.rope_deltas.repeat_interleave(g, dim=0)
    expanded = {k: inputs[k].repeat_interleave(g, dim=0) for k in TEXT_KEYS + PER_ROW_KEYS}
    return model.generate(**expanded, cache=cache, **generate_kwargs)
