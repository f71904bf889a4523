"""Qwen2.5-VL: time reaches the model through the 3D RoPE (``second_per_grid_ts``, seconds per temporal patch).

Frames are multiples of 28 pixels (patch 14 × merge 2). The processor is told the *sampled* clip's rate — fps = the
effective sampled fps f, T frames, indices ``range(T)`` — so with ``do_sample_frames=False`` it computes
``second_per_grid_ts = temporal_patch_size / f`` (1.0 at 2 fps); without metadata transformers 5.24 assumes 24 fps
(0.083, wrong). ``get_video_features`` returns one feature tensor per clip (``pooler_output``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from grounding_rl.data.video import SampledVideo
from grounding_rl.family.base import Family


@dataclass(frozen=True)
class Qwen25VLFamily(Family):
    def video_metadata(self, video: SampledVideo):
        """fps = effective sampled fps, T frames, indices range(T): the processor's ``second_per_grid_ts`` is then
        2 / f seconds (``transformers`` ``Qwen2_5_VLProcessor``: ``temporal_patch_size / fps``)."""
        from transformers.video_utils import VideoMetadata

        t = video.num_frames
        return VideoMetadata(total_num_frames=t, fps=video.sampled_fps, frames_indices=list(range(t)),
                             duration=t / video.sampled_fps)

    def patch_vllm_model(self, model) -> bool:
        """Make vLLM's Qwen2.5-VL model (one with ``iter_mm_grid_thw``) place tokens by
        :func:`transformers_mrope_positions`, the rule of the policy and reference forwards; False (unchanged) for a
        model without ``iter_mm_grid_thw``."""
        if not hasattr(model, "iter_mm_grid_thw"):
            return False

        def get_mrope_input_positions(input_tokens, mm_features):
            return transformers_mrope_positions(list(model.iter_mm_grid_thw(mm_features)), len(input_tokens))

        model.get_mrope_input_positions = get_mrope_input_positions
        return True

    def select_features(self, features, rows: list[int]):
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        pooled = features.pooler_output
        return BaseModelOutputWithPooling(pooler_output=tuple(pooled[u] for u in rows))

    def tiny_config(self, vocab_size: int, token_ids: dict, like=None, hidden_size: int = 64, num_layers: int = 2,
                    num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 128,
                    vision_hidden_size: int = 32, vision_depth: int = 2, vision_heads: int = 2, tie_word_embeddings: bool = True):
        """A ``Qwen2_5_VLConfig`` with the real model's structure at tiny width and depth (``like``, the real config, is
        not needed: the structure is written out here).

        ``mrope_section`` keeps the real model's 1:1.5:1.5 split of the rotary half-dimension (16, 24, 24 of 64) scaled
        to ``head_dim / 2``. The vision tower keeps window attention with its last block global (like blocks
        7/15/23/31 of the real one), ``tokens_per_second`` 2 and temporal patch 2.

        Raises:
            ValueError: hidden_size not divisible by num_heads, or head_dim / 2 < 4.
        """
        from transformers import Qwen2_5_VLConfig

        if hidden_size % num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
        half = hidden_size // num_heads // 2
        if half < 4:
            raise ValueError(f"head_dim {hidden_size // num_heads} too small for 3D RoPE (need ≥ 8)")
        t = max(1, round(half * 16 / 64))
        h = (half - t) // 2
        mrope = [t, h, half - t - h]
        text = dict(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": mrope},
            rms_norm_eps=1e-6,
            tie_word_embeddings=tie_word_embeddings,
            bos_token_id=token_ids["bos_token_id"],
            eos_token_id=token_ids["eos_token_id"],
            pad_token_id=token_ids["pad_token_id"],
        )
        vision = dict(
            depth=vision_depth,
            hidden_size=vision_hidden_size,
            intermediate_size=vision_hidden_size * 2,
            num_heads=vision_heads,
            out_hidden_size=hidden_size,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=112,
            fullatt_block_indexes=[vision_depth - 1],
            tokens_per_second=2,
        )
        return Qwen2_5_VLConfig(
            text_config=text,
            vision_config=vision,
            tie_word_embeddings=tie_word_embeddings,
            **token_ids,
        )


QWEN2_5_VL = Qwen25VLFamily(
    name="qwen2_5_vl",
    model_types=("qwen2_5_vl",),
    processor_classes=("Qwen2_5_VLProcessor",),
    pixel_factor=28,
    time_encoding="3D RoPE time scale (second_per_grid_ts)",
    row_video_keys=("video_grid_thw", "second_per_grid_ts"),
    display_name="Qwen2.5-VL",
    positional_time=True,
    tool_protocol="text",
)


def transformers_mrope_positions(blocks: list[tuple], length: int) -> tuple[torch.Tensor, int]:
    """3D M-RoPE position ids of one prompt by transformers' rule (5.19–5.24 ``Qwen2_5_VLModel.get_rope_index``), which
    the policy and reference forwards use.

    Text runs count up from the current position; a vision block of (t, h, w) merged patches gets temporal ids
    ``floor(k · time_interval)`` (float32, as transformers) and spatial ids ``0…h−1``, ``0…w−1``, all offset by the
    current position, which then advances by ``max(h, w)``. vLLM 0.32's ``Qwen2_5_VLForConditionalGeneration.
    get_mrope_input_positions`` instead continues after the block's largest id, temporal included: for a clip whose
    temporal ids run past its spatial extent every later token — the rest of the prompt and the completion — would
    sit at other positions than in the forward.

    Args:
        blocks: ``(offset, t, h, w, time_interval)`` per vision block, by offset (vLLM's ``iter_mm_grid_thw``; sizes
            after the spatial merge; ``time_interval`` = ``second_per_grid_ts · tokens_per_second``, 1 for images).
        length: prompt length L.

    Returns:
        ``(positions (3, L) long, delta)``: ``delta`` = last position + 1 − L, so that completion token i (i ≥ L) sits at
        i + delta, as in the forward over prompt + completion. Example: 2 text tokens, a block (t 2, h 1, w 2, interval
        2.0), 1 text token → T [0 1 2 2 4 4 4], H [0 1 2 2 2 2 4], W [0 1 2 3 2 3 4], delta −2.
    """
    parts, position, done = [], 0, 0
    for offset, t, h, w, interval in blocks:
        text = offset - done
        parts.append(torch.arange(text).expand(3, -1) + position)
        position += text
        temporal = (torch.arange(t) * torch.tensor(interval, dtype=torch.float32)).long()
        grid_t, grid_h, grid_w = torch.meshgrid(temporal, torch.arange(h) + position, torch.arange(w) + position,
                                                indexing="ij")
        parts.append(torch.stack([grid_t + position, grid_h, grid_w]).reshape(3, -1))
        position += max(h, w)
        done = offset + t * h * w
    if done < length:
        parts.append(torch.arange(length - done).expand(3, -1) + position)
    positions = torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.long)
    delta = int(positions[0, -1]) + 1 - length if length else 0
    return positions, delta
