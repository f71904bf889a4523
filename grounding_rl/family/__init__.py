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

from grounding_rl.family.base import (DEFAULT_VIDEO_LAYOUT, RELEASED, TRANSFORMERS5, VIDEO_LAYOUTS, Family,
                                      checked_video_layout)
from grounding_rl.family.qwen2_5_vl import QWEN2_5_VL
from grounding_rl.family.qwen3_vl import QWEN3_VL

__all__ = ["DEFAULT_VIDEO_LAYOUT", "RELEASED", "TRANSFORMERS5", "VIDEO_LAYOUTS", "Family", "checked_video_layout",
           "families", "family_of", "family_of_checkpoint", "supported_model_types"]


def families() -> tuple[Family, ...]:
    """Every supported family."""
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
