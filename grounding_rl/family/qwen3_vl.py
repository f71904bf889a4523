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

Video layout (``video_layout``, :data:`grounding_rl.family.VIDEO_LAYOUTS`). The chat template writes one
``<|vision_start|><|video_pad|><|vision_end|>`` per clip. transformers 4.57's ``Qwen3VLProcessor.__call__`` — the
version Qwen released the model with — replaces that whole triple by the G groups
``<t seconds><|vision_start|><|video_pad|>×n<|vision_end|>``, and so do vLLM's Qwen3-VL processing
(``vllm/model_executor/models/qwen3_vl.py``, ``get_video_repl``) and TimeLens's code: ``released``, the default.
transformers ≥ 5.10 replaces only the ``<|video_pad|>``, which leaves the template's pair around the groups:
``<|vision_start|><t seconds><|vision_start|>…<|vision_end|>…<|vision_end|>`` (``transformers5``). For ``released`` the
prompt reaches the processor with a bare ``<|video_pad|>``, which transformers 4.57 (its "vllm may input video token
directly" branch) and 5.x alike replace by the groups alone; the ids are checked after the call
(:meth:`Qwen3VLFamily.check_video_layout`), so another transformers version cannot change the layout unnoticed. The
3D position ids follow either layout: ``get_rope_index`` numbers every run of video tokens (``mm_token_type_ids`` 2) as
one frame and every other token as text.

``get_video_features`` returns the merged features per clip (``pooler_output``) and the DeepStack features (one tuple
per DeepStack vision block, 8/16/24 of the 8B's 27, added to the hidden states of the LLM's first layers); a clip
encoded once must hand both to each of its rows.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from grounding_rl.data.video import SampledVideo
from grounding_rl.family.base import (DEFAULT_VIDEO_LAYOUT, RELEASED, TRANSFORMERS5, Family, _video_span,
                                      checked_video_layout)

TICKS_PER_SECOND = 1_000_000  # frames_indices are presentation times in microseconds
VISION_START, VIDEO_PAD, VISION_END = "<|vision_start|>", "<|video_pad|>", "<|vision_end|>"  # the chat template's
TIMESTAMP = re.compile(r"<\d+(\.\d+)? seconds>")  # the processor's textual timestamp of a temporal group


@dataclass(frozen=True)
class Qwen3VLFamily(Family):
    def video_metadata(self, video: SampledVideo):
        """``frames_indices`` = true presentation times in µs, ``fps`` = 1e6: the processor's timestamps are then the
        frames' true times (mean of each temporal pair)."""
        from transformers.video_utils import VideoMetadata

        ticks = [round(t * TICKS_PER_SECOND) for t in video.timestamps]
        return VideoMetadata(total_num_frames=video.num_frames, fps=float(TICKS_PER_SECOND), frames_indices=ticks,
                             duration=video.duration)

    def time_text_tokens(self, timestamps) -> int:
        """Text tokens of the ``<t seconds>`` the processor writes before each temporal pair (t the mean of the
        pair's times, one decimal): ``len(f"{t:.1f}") + 3`` each, as Qwen3-VL's tokenizer splits digits one by one
        (``<``, the digits, ``.``, the decimal, `` seconds``, ``>``: ``<3.5 seconds>`` is 6 tokens, ``<3412.5
        seconds>`` 9; checked against the Qwen3-VL-8B-Instruct tokenizer). An hour in 512 frames (256 pairs) adds
        2,225 tokens to the video's merged tokens; the prompt-length check counts them (the processor's ids), and so
        does ``grounding-rl fits``."""
        times = list(timestamps)
        return sum(len(f"{(times[i] + times[i + 1]) / 2:.1f}") + 3 for i in range(0, len(times) - 1, 2))

    def video_prompt(self, processor, text: str, layout: str = DEFAULT_VIDEO_LAYOUT) -> str:
        """``released``: each ``<|vision_start|><|video_pad|><|vision_end|>`` of ``text`` becomes a bare
        ``<|video_pad|>`` (the processor writes the groups with nothing around them); ``transformers5``: unchanged.

        Raises:
            ValueError: unknown ``layout``.
        """
        if checked_video_layout(layout) == RELEASED:
            return text.replace(VISION_START + VIDEO_PAD + VISION_END, VIDEO_PAD)
        return text

    def check_video_layout(self, processor, input_ids, layout: str = DEFAULT_VIDEO_LAYOUT) -> None:
        """Check that each row of ``input_ids`` (B, L) holds its video in ``layout``: the token after the last group's
        ``<|vision_end|>`` is a second ``<|vision_end|>`` exactly for ``transformers5``.

        Raises:
            RuntimeError: the installed processor laid the video out otherwise (names the transformers version).
        """
        tokenizer = processor.tokenizer
        pad, end = tokenizer.convert_tokens_to_ids(VIDEO_PAD), tokenizer.convert_tokens_to_ids(VISION_END)
        for row in input_ids.tolist():
            last = max((i for i, t in enumerate(row) if t == pad), default=None)
            if last is None:
                continue
            outer = last + 2 < len(row) and row[last + 2] == end
            if outer != (checked_video_layout(layout) == TRANSFORMERS5):
                import transformers

                raise RuntimeError(f"transformers {transformers.__version__}'s {type(processor).__name__} wrote the "
                                   f"video {'inside' if outer else 'without'} an outer {VISION_START} … {VISION_END} "
                                   f"pair, not in video_layout {layout!r}")

    def collapse_video(self, ids: list[int], video_id: int, start_id: int, end_id: int, decode=None) -> list[int]:
        """:meth:`grounding_rl.family.base.Family.collapse_video` for Qwen3-VL: its G groups
        ``<t seconds><|vision_start|><|video_pad|>×n<|vision_end|>`` are found from the first group's timestamp
        (``decode`` turns ids into text) to the last group's ``<|vision_end|>`` and replaced whole by one
        ``<|video_pad|>``: in the ``released`` layout ``…text<|video_pad|>text…`` remains, in ``transformers5`` the
        chat template's ``<|vision_start|><|video_pad|><|vision_end|>``. vllm 0.32 writes the groups back itself
        (``Qwen3VLMultiModalProcessor._get_prompt_updates``), so the row returns in whichever layout it was built in.
        E.g. released [1, <t>, S, V, V, E, <t>, S, V, V, E, 2] → [1, V, 2].

        Raises:
            ValueError: the video tokens are not enclosed by the group tokens, or are interleaved with text that is not
                a ``<t seconds>`` timestamp (or no ``decode`` was given).
        """
        where = _video_span(ids, video_id, start_id, end_id)
        if where is None:
            return list(ids)
        first, last = where
        if decode is not None:
            for begin in range(first - 2, max(first - 18, -1), -1):
                if TIMESTAMP.fullmatch(decode(ids[begin:first - 1]).strip()):
                    return ids[:begin] + [video_id] + ids[last + 2:]
        raise ValueError("video tokens interleaved with text that is not a <t seconds> timestamp")

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
    display_name="Qwen3-VL",
    tool_protocol="native",
    foreign_samplers=("lmms_eval_qwen2_5_vl",),
)
