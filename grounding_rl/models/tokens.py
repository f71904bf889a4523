"""The token ids every generation path needs: which ids end a completion and which id pads one.

One rule for training rollouts (HF generate and vLLM), evaluation and inference: a completion ends at any of the
model's ``generation_config.eos_token_id`` (Qwen2.5-VL and Qwen3-VL Instruct list ``<|im_end|>`` and
``<|endoftext|>``), else at the tokenizer's EOS; rows are padded with the tokenizer's pad token, else the first EOS id
(TRL's ``GRPOTrainer.__init__`` takes the same ids).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CompletionTokenIds:
    """Attributes:
        eos: ids that end a completion (at least one).
        pad: the id that fills a row after it stopped.
    """

    eos: tuple[int, ...]
    pad: int


def completion_token_ids(tokenizer, generation_config=None) -> CompletionTokenIds:
    """The EOS ids and the pad id of a model (see the module docstring).

    Args:
        tokenizer: the processor's tokenizer.
        generation_config: the model's ``transformers.GenerationConfig`` (``model.generation_config``, or
            ``GenerationConfig.from_pretrained``), or None.

    Raises:
        ValueError: neither the generation config nor the tokenizer names an EOS id.
    """
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the model names no EOS token (generation_config.json and the tokenizer have none)")
    eos = (eos,) if isinstance(eos, int) else tuple(int(i) for i in eos)
    pad = tokenizer.pad_token_id
    return CompletionTokenIds(eos=eos, pad=eos[0] if pad is None else int(pad))


def saved_generation_config(model_path):
    """The ``GenerationConfig`` saved in a checkpoint folder, or None when it has none."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(str(model_path))
    except OSError:
        return None
