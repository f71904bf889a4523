"""What a model family is (:class:`Family`) and the named video layouts, shared by every family module
(:mod:`grounding_rl.family.qwen2_5_vl`, :mod:`grounding_rl.family.qwen3_vl`); :mod:`grounding_rl.family` chooses the
family of a model."""
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
        display_name: the family's name in messages (``Qwen2.5-VL``).
        positional_time: time is in the position ids (3D RoPE) rather than written as text: a window's time then
            starts at its first frame unless its positions are shifted (the zoom's ``time``, :meth:`zoom_time`); with
            textual timestamps only ``video`` time is possible.
        tool_protocol: how the crop tool is offered (:mod:`grounding_rl.rollout.tools`): ``native`` (the chat
            template's tools and tool role) or ``text`` (a sentence in the instruction, the window as a user turn).
        foreign_samplers: video samplers that imitate another family's evaluation backend, refused for this one.
    """

    name: str
    model_types: tuple[str, ...]
    processor_classes: tuple[str, ...]
    pixel_factor: int
    time_encoding: str
    row_video_keys: tuple[str, ...]
    display_name: str = ""
    positional_time: bool = False
    tool_protocol: str = "text"
    foreign_samplers: tuple[str, ...] = ()

    def zoom_time(self, time: str | None = None) -> str:
        """Where a zoom's pass-2 time starts (``--zoom-time``): ``time``, or when None this family's default —
        ``window`` with positional time (every clip it was trained on starts at position 0), else ``video`` (the
        window's frames carry their true timestamps)."""
        return time or ("window" if self.positional_time else "video")

    def window_answer_shift(self, time: str | None = None) -> bool:
        """Whether an answer on a window is in the window's time, to be shifted by its first frame's time to reach
        the video's: positional time with :meth:`zoom_time` ``window``."""
        return self.positional_time and self.zoom_time(time) == "window"

    def window_position_shift(self, time: str | None = None) -> bool:
        """Whether a window's temporal position ids must be shifted to where it sits in the video (positional time
        with :meth:`zoom_time` ``video``; transformers' ``get_rope_index`` only)."""
        return self.positional_time and self.zoom_time(time) == "video"

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

    def collapse_video(self, ids: list[int], video_id: int, start_id: int, end_id: int, decode=None) -> list[int]:
        """The prompt ids vLLM is given for one row: the video's tokens collapsed to one ``<|video_pad|>``, which vLLM
        expands itself, keeping the tokens around it (given expanded ids it would expand the first ``<|video_pad|>``
        again). Here (Qwen2.5-VL) the expansion is one run of ``<|video_pad|>`` between ``<|vision_start|>`` and
        ``<|vision_end|>``, which stay: [1, S, V, V, V, E, 2] → [1, S, V, E, 2].

        Args:
            ids: one row's expanded prompt ids (no padding).
            video_id, start_id, end_id: ``<|video_pad|>``, ``<|vision_start|>``, ``<|vision_end|>``.
            decode: ids → text (used by families whose expansion holds text, e.g. Qwen3-VL's timestamps).

        Returns:
            The ids with the video collapsed (unchanged without video tokens).

        Raises:
            ValueError: the video tokens are not laid out as this family's processor writes them.
        """
        where = _video_span(ids, video_id, start_id, end_id)
        if where is None:
            return list(ids)
        first, last = where
        if all(t == video_id for t in ids[first:last + 1]):
            return ids[:first + 1] + ids[last + 1:]
        raise ValueError("video tokens interleaved with text: not a Qwen2.5-VL expansion")

    def patch_vllm_model(self, model) -> bool:
        """Make a vLLM model of this family place tokens as the transformers forward does, if it does not already;
        True when something was changed. Nothing here."""
        return False

    def select_features(self, features, rows: list[int]):
        """The vision tower's output for distinct clips (``get_video_features(..., return_dict=True)``, one entry per
        clip) rearranged to one entry per row: ``rows[i]`` is row i's clip. Returns what ``mm_encoder_outputs["video"]``
        takes."""
        raise NotImplementedError

    def tiny_config(self, vocab_size: int, token_ids: dict, like=None, **sizes):
        """A config of this family's architecture at tiny width and depth, for random-weight test models
        (:func:`grounding_rl.dev.tiny.build_tiny_model`).

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


def _video_span(ids: list[int], video_id: int, start_id: int, end_id: int) -> tuple[int, int] | None:
    """``(first, last)`` positions of the video tokens of one row, None without any.

    Raises:
        ValueError: they are not enclosed by ``<|vision_start|>`` … ``<|vision_end|>``.
    """
    where = [i for i, t in enumerate(ids) if t == video_id]
    if not where:
        return None
    first, last = where[0], where[-1]
    if first == 0 or last + 1 >= len(ids) or ids[first - 1] != start_id or ids[last + 1] != end_id:
        raise ValueError("video tokens not enclosed by <|vision_start|> … <|vision_end|>")
    return first, last
