"""The model families the toolkit trains, and everything that differs between them, one module per family.

A family is chosen from the checkpoint's ``config.model_type`` (:func:`family_of`): ``qwen2_5_vl``
(:mod:`.qwen2_5_vl`) or ``qwen3_vl`` / ``qwen3_vl_moe`` (:mod:`.qwen3_vl`). A :class:`Family` says how frames are
sized (the pixel factor: patch size × spatial merge), how the sampled clip is described to the processor (its
``video_metadata``, hence how time reaches the model: Qwen2.5-VL's 3D-RoPE time scale ``second_per_grid_ts``, or
Qwen3-VL's textual timestamps ``<t seconds>``), which per-row video tensors the model needs, how the vision tower's
output is handed to each row when a clip is encoded once (Qwen3-VL: the DeepStack features too), how the video tokens
are laid out in the prompt (:data:`VIDEO_LAYOUTS`), and how a tiny random-weight model of the family is configured. The
rest of the package names no family.

This stage comes right after ``data`` in the import order (README, "Layout"), so preprocessing, models, rollout and
update can all use it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from grounding_rl.data.video import SampledVideo, VideoSettings

# How a prompt's video tokens are laid out, a named choice saved in grounding_config.json (``video_layout``):
# ``released`` is the layout of the processor each family was released with (Qwen3-VL: transformers 4.57), the one its
# published checkpoints were trained on; ``transformers5`` is transformers 5.x's Qwen3-VL processor's (one extra
# <|vision_start|> … <|vision_end|> pair around the clip). Qwen2.5-VL's processor has one layout in every version.
RELEASED, TRANSFORMERS5 = "released", "transformers5"
VIDEO_LAYOUTS = (RELEASED, TRANSFORMERS5)
DEFAULT_VIDEO_LAYOUT = RELEASED


@dataclass(frozen=True)
class Family:
    """What one model family needs from the rest of the package (subclassed once per family).

    Attributes:
        name: the family's name (its main ``model_type``).
        model_types: every ``config.model_type`` served by this family.
        processor_classes: class names of the processors of this family (to recognise a loaded processor).
        pixel_factor: frame height and width are multiples of this (patch size × spatial merge size).
        time_encoding: how sampling time reaches the model, in words (for logs and ``infer --print-prompt``).
        row_video_keys: per-row video tensors the processor returns and the model needs for its 3D position ids
            (besides ``pixel_values_videos``), in the model's argument names.
    """

    name: str
    model_types: tuple[str, ...]
    processor_classes: tuple[str, ...]
    pixel_factor: int
    time_encoding: str
    row_video_keys: tuple[str, ...]

    def video_settings(self, settings: VideoSettings) -> VideoSettings:
        """``settings`` with this family's pixel factor (frames sized for its vision tower)."""
        if settings.pixel_factor == self.pixel_factor:
            return settings
        return replace(settings, pixel_factor=self.pixel_factor)

    def video_metadata(self, video: SampledVideo):
        """The ``transformers.video_utils.VideoMetadata`` of a sampled clip for this family's processor."""
        raise NotImplementedError

    def time_text_tokens(self, timestamps) -> int:
        """Prompt text tokens this family adds to say when frames taken at ``timestamps`` (seconds, T of them) were
        taken: none here (the time scale is in the position ids), so the video's prompt is its merged tokens alone."""
        return 0

    def processor_kwargs(self) -> dict:
        """Keyword arguments of every processor call: frames are already sampled and sized by us
        (:func:`grounding_rl.data.video.sample_frames`), so the processor neither samples, resizes nor caps them."""
        return dict(do_sample_frames=False, do_resize=False, cap_pixels_per_frame=False)

    def video_prompt(self, processor, text: str, layout: str = DEFAULT_VIDEO_LAYOUT) -> str:
        """The chat-templated prompt ``text`` (one ``<|vision_start|><|video_pad|><|vision_end|>`` per clip) as it must
        reach this family's processor for its video tokens to come out in ``layout``. Unchanged here (one layout).

        Raises:
            ValueError: ``layout`` is not one of :data:`VIDEO_LAYOUTS`.
        """
        checked_video_layout(layout)
        return text

    def check_video_layout(self, processor, input_ids, layout: str = DEFAULT_VIDEO_LAYOUT) -> None:
        """Raise RuntimeError when the processor's ``input_ids`` (B, L) do not hold the video in ``layout`` (a
        transformers version that expands the placeholder another way). Nothing to check here (one layout)."""

    def select_features(self, features, rows: list[int]):
        """The vision tower's output for distinct clips (``get_video_features(..., return_dict=True)``, one entry per
        clip) rearranged to one entry per row: ``rows[i]`` is row i's clip. Returns what ``mm_encoder_outputs["video"]``
        takes."""
        raise NotImplementedError

    def tiny_config(self, vocab_size: int, token_ids: dict, like=None, **sizes):
        """A config of this family's architecture at tiny width and depth, for random-weight test models
        (:func:`grounding_rl.models.tiny.build_tiny_model`).

        Args:
            vocab_size: embedding rows (≥ the tokenizer's length).
            token_ids: ``bos_token_id``, ``eos_token_id``, ``pad_token_id``, ``vision_start_token_id``,
                ``vision_end_token_id``, ``image_token_id``, ``video_token_id``.
            like: the real model's config to shrink (its structure is kept), when the family needs it.
            sizes: hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size, vision_hidden_size,
                vision_depth, vision_heads (family defaults when absent).
        """
        raise NotImplementedError


def checked_video_layout(layout: str) -> str:
    """``layout`` itself when it is one of :data:`VIDEO_LAYOUTS`; ValueError (naming the known ones) otherwise."""
    if layout not in VIDEO_LAYOUTS:
        raise ValueError(f"unknown video_layout {layout!r}; known: {list(VIDEO_LAYOUTS)}")
    return layout


def families() -> tuple[Family, ...]:
    """Every supported family."""
    from grounding_rl.family.qwen2_5_vl import QWEN2_5_VL
    from grounding_rl.family.qwen3_vl import QWEN3_VL

    return (QWEN2_5_VL, QWEN3_VL)


def supported_model_types() -> list[str]:
    return sorted(t for f in families() for t in f.model_types)


def family_of(obj) -> Family:
    """The family of a model, a config, a processor or a ``model_type`` string.

    Models (also DDP/DeepSpeed/PEFT-wrapped) and configs are recognised by ``config.model_type``; a processor by its
    class (each family lists its processor classes).

    Raises:
        ValueError: the model type or processor class belongs to no supported family (names it and the supported
            ones).
    """
    if isinstance(obj, str):
        model_type = obj
    else:
        model_type = None
        seen = obj
        for _ in range(4):  # DDP / DeepSpeed engines hold the model in .module
            config = getattr(seen, "config", None)
            if config is not None and isinstance(getattr(config, "model_type", None), str):
                model_type = config.model_type
                break
            if isinstance(getattr(seen, "model_type", None), str) and not callable(seen):
                model_type = seen.model_type
                break
            if not hasattr(seen, "module"):
                break
            seen = seen.module
        if model_type is None:
            name = type(obj).__name__
            for family in families():
                if name in family.processor_classes:
                    return family
            raise ValueError(f"{name} is not a model, config or processor of a supported family "
                             f"({', '.join(supported_model_types())})")
    for family in families():
        if model_type in family.model_types:
            return family
    raise ValueError(f"model_type {model_type!r} is not supported; supported: {', '.join(supported_model_types())}")


def family_of_checkpoint(path) -> Family:
    """The family of a checkpoint folder or hub id, from its ``config.json`` (``AutoConfig``, remote code off).

    Raises:
        ValueError: unsupported ``model_type``; whatever ``AutoConfig.from_pretrained`` raises for a missing path.
    """
    from transformers import AutoConfig

    return family_of(AutoConfig.from_pretrained(str(path), trust_remote_code=False))
