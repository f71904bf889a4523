"""The rollout interface: sample G completions for a batch of video prompts (issue 4, point 3).

The trainer sees only :class:`RolloutEngine` — ``generate(model, inputs, params) -> completion ids`` — so a vLLM engine
can replace :class:`HFGenerateEngine` later without touching the trainer. Prompt tensors go to the engine unchanged:
``input_ids``, ``attention_mask``, ``mm_token_type_ids``, ``pixel_values_videos``, ``video_grid_thw`` and
``second_per_grid_ts`` are exactly those the policy and reference forwards receive afterwards.

With ``video_index`` in the inputs (issue 7), ``pixel_values_videos`` holds the U distinct clips only and row i uses
clip ``video_index[i]``: an engine must then encode (and may prefill) each distinct prompt once;
:class:`HFGenerateEngine` does both with :func:`grounding_rl.rollout.grouped.generate_shared`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from grounding_rl.rollout.grouped import generate_shared

MODEL_INPUT_KEYS = (
    "input_ids",
    "attention_mask",
    "mm_token_type_ids",
    "pixel_values_videos",
    "video_grid_thw",
    "second_per_grid_ts",
)


@dataclass(frozen=True)
class SamplingParams:
    """How completions are sampled (the config's TRL-named knobs).

    Attributes:
        max_new_tokens: ``max_completion_length``.
        temperature, top_p, top_k, repetition_penalty: as in ``transformers.GenerationConfig`` (top_k 0 = off).
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0


class RolloutEngine(Protocol):
    """Anything that turns prompt tensors into sampled completion ids."""

    def generate(self, model, inputs: dict, params: SamplingParams) -> torch.LongTensor:
        """Sample one completion per prompt row.

        Args:
            model: the (possibly wrapped) policy.
            inputs: prompt tensors (:data:`MODEL_INPUT_KEYS`), left-padded, B rows; optionally ``video_index`` (B,),
                in which case ``pixel_values_videos`` holds only the distinct clips (see the module docstring).
            params: sampling settings.

        Returns:
            (B, C) completion token ids, C ≤ ``params.max_new_tokens``; rows that stop early are padded (their
            mask comes from :func:`completion_mask`).
        """
        ...


class HFGenerateEngine:
    """Sampling with ``model.generate`` (transformers), unwrapping DDP/DeepSpeed with TRL's
    ``unwrap_model_for_generation`` (which gathers ZeRO-3 parameters when ``gather_deepspeed3_params``, and turns
    gradient checkpointing off for the duration). Shared-video inputs (``video_index``) go to
    :func:`grounding_rl.rollout.grouped.generate_shared`: one vision encoding and one prompt prefill per distinct clip.

    Args:
        accelerator: the trainer's ``accelerate.Accelerator``.
        gather_deepspeed3_params: TRL's ``ds3_gather_for_generation``.
        gradient_checkpointing_kwargs: the config's, passed through so checkpointing is restored identically.
    """

    def __init__(self, accelerator, gather_deepspeed3_params: bool = True, gradient_checkpointing_kwargs=None):
        self.accelerator = accelerator
        self.gather_deepspeed3_params = gather_deepspeed3_params
        self.gradient_checkpointing_kwargs = gradient_checkpointing_kwargs

    def generate(self, model, inputs: dict, params: SamplingParams) -> torch.LongTensor:
        from trl.models import unwrap_model_for_generation

        kwargs = {k: inputs[k] for k in MODEL_INPUT_KEYS if k in inputs}
        video_index = inputs.get("video_index")
        prompt_length = kwargs["input_ids"].shape[1]
        sampling = dict(
            do_sample=True,
            max_new_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k or None,
            repetition_penalty=params.repetition_penalty,
            min_p=None,
        )
        with (
            unwrap_model_for_generation(
                model,
                self.accelerator,
                gather_deepspeed3_params=self.gather_deepspeed3_params,
                gradient_checkpointing_kwargs=self.gradient_checkpointing_kwargs,
            ) as unwrapped,
            torch.no_grad(),
        ):
            if video_index is None:
                out = unwrapped.generate(**kwargs, **sampling)
            else:
                out = generate_shared(unwrapped, kwargs, video_index, **sampling)
        return out[:, prompt_length:]


def completion_mask(completion_ids: torch.LongTensor, eos_token_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask of the tokens up to and including the first EOS of each row, and which rows never stopped (TRL's rule).

    Args:
        completion_ids: (B, C).
        eos_token_ids: an id or a list of ids that end a completion (e.g. ``<|im_end|>`` and ``<|endoftext|>``).

    Returns:
        ``(mask, truncated)``: (B, C) int mask, (B,) bool — True where no EOS was produced within C tokens.
    """
    ids = [eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids)
    is_eos = torch.isin(completion_ids, torch.tensor(ids, device=completion_ids.device))
    length = completion_ids.size(1)
    first_eos = torch.full((completion_ids.size(0),), length, dtype=torch.long, device=completion_ids.device)
    has_eos = is_eos.any(dim=1)
    first_eos[has_eos] = is_eos.int().argmax(dim=1)[has_eos]
    positions = torch.arange(length, device=completion_ids.device).expand(completion_ids.size(0), -1)
    return (positions <= first_eos.unsqueeze(1)).int(), ~has_eos
