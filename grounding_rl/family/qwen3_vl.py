"""Qwen3-VL (dense ``qwen3_vl`` and ``qwen3_vl_moe``): time reaches the model as text, ``<t seconds>`` before each
temporal pair of frames.

Frames are multiples of 32 pixels (patch 16 × merge 2). The processor (transformers 5.24
``Qwen3VLProcessor.replace_video_token`` / ``_calculate_timestamps``) writes, before the tokens of temporal group g,
``<{(t_2g + t_2g+1) / 2:.1f} seconds>`` with t_k = ``frames_indices[k] / fps`` of the ``video_metadata`` it is given.
Given pre-sampled frames with no metadata it falls back to 24 fps, and given indices ``range(T)`` it prints nominal
times — both wrong (QwenLM/Qwen3-VL PR 2117). Here ``frames_indices`` are the sampled frames' true presentation times
(:attr:`grounding_rl.data.video.SampledVideo.timestamps`) in whole microseconds and ``fps`` is 1e6 ticks per second,
so every printed time is the mean true time of its pair. The 3D RoPE carries no time (each frame is its own temporal
position group), so no ``second_per_grid_ts``.

``get_video_features`` returns the merged features per clip (``pooler_output``) and the DeepStack features (one tuple
per DeepStack vision block, 8/16/24 of the 8B's 27, added to the hidden states of the LLM's first layers); a clip
encoded once must hand both to each of its rows.
"""
from __future__ import annotations

from dataclasses import dataclass

from grounding_rl.data.video import SampledVideo
from grounding_rl.family import Family

TICKS_PER_SECOND = 1_000_000  # frames_indices are presentation times in microseconds


@dataclass(frozen=True)
class Qwen3VLFamily(Family):
    def video_metadata(self, video: SampledVideo):
        """``frames_indices`` = true presentation times in µs, ``fps`` = 1e6: the processor's timestamps are then the
        frames' true times (mean of each temporal pair)."""
        from transformers.video_utils import VideoMetadata

        ticks = [round(t * TICKS_PER_SECOND) for t in video.timestamps]
        return VideoMetadata(total_num_frames=video.num_frames, fps=float(TICKS_PER_SECOND), frames_indices=ticks,
                             duration=video.duration)

    def select_features(self, features, rows: list[int]):
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

        return BaseModelOutputWithDeepstackFeatures(
            pooler_output=tuple(features.pooler_output[u] for u in rows),
            deepstack_features=[tuple(layer[u] for u in rows) for layer in features.deepstack_features],
        )

    def tiny_config(self, vocab_size: int, token_ids: dict, like=None, hidden_size: int = 64, num_layers: int = 3,
                    num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 128,
                    vision_hidden_size: int = 32, vision_depth: int = 4, vision_heads: int = 2,
                    tie_word_embeddings: bool = True):
        """The real config ``like`` (a ``Qwen3VLConfig`` or ``Qwen3VLMoeConfig``) at tiny width and depth.

        Kept: the interleaved 3D RoPE with the real split of the rotary half-dimension (T 24 : H 20 : W 20 of 64,
        scaled to ``head_dim / 2``: H and W ``floor(half · 20 / 64)``, T the rest), patch 16, merge 2, temporal patch
        2, the vision tower's learned position table, and the DeepStack mergers: as many as the real model has
        (8B: vision blocks 8, 16, 24 of 27), at the blocks ``floor((i + 1) · depth / real_depth) − 1`` of the tiny
        tower, feeding the first LLM layers. For MoE: 4 experts, 2 per token, expert width ``intermediate_size / 2``.

        Raises:
            ValueError: ``like`` missing; hidden_size not divisible by num_heads; head_dim / 2 < 4; a tiny tower too
                shallow for distinct DeepStack blocks, or fewer LLM layers than DeepStack features.
        """
        if like is None:
            raise ValueError("a tiny Qwen3-VL is shrunk from the real config: pass like= (its config.json folder)")
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
        head_dim = hidden_size // num_heads
        half = head_dim // 2
        if half < 4:
            raise ValueError(f"head_dim {head_dim} too small for 3D RoPE (need ≥ 8)")
        hw = half * 20 // 64
        real_vision = like.vision_config
        deepstack = [(i + 1) * vision_depth // real_vision.depth - 1 for i in real_vision.deepstack_visual_indexes]
        if len(set(deepstack)) != len(deepstack) or min(deepstack) < 0:
            raise ValueError(f"vision_depth {vision_depth} is too shallow for {len(deepstack)} distinct DeepStack "
                             f"blocks (got {deepstack})")
        if num_layers < len(deepstack):
            raise ValueError(f"num_layers {num_layers} < {len(deepstack)} DeepStack features")
        text = like.text_config.to_dict()
        rope = dict(text.get("rope_parameters") or {})
        rope["mrope_section"] = [half - 2 * hw, hw, hw]
        text.update(
            vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size, head_dim=head_dim,
            num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
            max_position_embeddings=32768, rope_parameters=rope, tie_word_embeddings=tie_word_embeddings,
            bos_token_id=token_ids["bos_token_id"], eos_token_id=token_ids["eos_token_id"],
            pad_token_id=token_ids["pad_token_id"], dtype="float32",
        )
        if hasattr(like.text_config, "num_experts"):  # qwen3_vl_moe (stored as num_local_experts in 5.24)
            text.pop("num_experts", None)
            text.update(num_local_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=max(8, intermediate_size // 2),
                        decoder_sparse_step=1, mlp_only_layers=[])
        text.pop("rope_scaling", None)
        vision = real_vision.to_dict()
        vision.update(depth=vision_depth, hidden_size=vision_hidden_size, intermediate_size=vision_hidden_size * 2,
                      num_heads=vision_heads, out_hidden_size=hidden_size, deepstack_visual_indexes=deepstack)
        return type(like)(
            text_config=text,
            vision_config=vision,
            tie_word_embeddings=tie_word_embeddings,
            **{k: v for k, v in token_ids.items() if k not in ("bos_token_id", "eos_token_id", "pad_token_id")},
        )


QWEN3_VL = Qwen3VLFamily(
    name="qwen3_vl",
    model_types=("qwen3_vl", "qwen3_vl_moe"),
    processor_classes=("Qwen3VLProcessor",),
    pixel_factor=32,
    time_encoding="textual timestamps <t seconds> before each temporal pair",
    row_video_keys=("video_grid_thw",),
)
