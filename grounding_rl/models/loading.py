"""Load the policy, the reference model and the processor of a Qwen2.5-VL checkpoint (``trust_remote_code`` off).

Under DeepSpeed ZeRO-3 the ``TrainingArguments`` must exist before these calls (they register the DeepSpeed config
that makes ``from_pretrained`` load the weights partitioned); :mod:`grounding_rl.update.train` parses them first.
"""
from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

_DTYPES = {"auto": "auto", "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, None: None}


def _dtype(name):
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(k for k in _DTYPES if k)}, got {name!r}")
    return _DTYPES[name]


def load_processor(path: str, revision: str | None = None):
    """``AutoProcessor.from_pretrained(path)`` with remote code disabled."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path, revision=revision, trust_remote_code=False)


def load_policy(path: str, dtype: str | None = None, attn_implementation: str | None = None,
                revision: str | None = None):
    """The trainable policy: ``AutoModelForImageTextToText.from_pretrained`` (Qwen2.5-VL), remote code disabled.

    Args:
        path: local folder or hub id (offline runs need a local folder).
        dtype: ``"bfloat16"``, ``"float16"``, ``"float32"``, ``"auto"`` or None (transformers' default: the
            checkpoint's dtype).
        attn_implementation: e.g. ``"sdpa"``, ``"flash_attention_2"``; None = library default.
        revision: hub revision.
    """
    from transformers import AutoModelForImageTextToText

    kwargs = {"trust_remote_code": False, "revision": revision}
    if dtype is not None:
        kwargs["dtype"] = _dtype(dtype)
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    return AutoModelForImageTextToText.from_pretrained(path, **kwargs)


def load_reference(path: str, dtype: str | None = None, attn_implementation: str | None = None,
                   revision: str | None = None):
    """A frozen copy of the starting policy for the KL term: same loader, eval mode, no gradients."""
    model = load_policy(path, dtype=dtype, attn_implementation=attn_implementation, revision=revision)
    model.eval()
    model.requires_grad_(False)
    return model


def vision_tower(model):
    """The vision encoder module of a (possibly PEFT-wrapped) Qwen2.5-VL model.

    Raises:
        AttributeError: the model has no ``visual`` module.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for candidate in (getattr(base, "model", None), base):
        visual = getattr(candidate, "visual", None)
        if isinstance(visual, torch.nn.Module):
            return visual
    raise AttributeError(f"{type(base).__name__} has no vision tower ('visual')")


def freeze_vision_tower(model) -> int:
    """Stop gradients into the vision encoder (including its patch merger). Returns the number of frozen parameters."""
    visual = vision_tower(model)
    visual.requires_grad_(False)
    n = sum(p.numel() for p in visual.parameters())
    logger.info("froze the vision tower: %d parameters", n)
    return n
