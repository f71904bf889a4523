"""The one generation path: GRPO rollouts, ``eval`` and ``infer`` all end in :func:`generate`.

:func:`generate` takes the prompt tensors that :func:`grounding_rl.prompts.preprocessing.build_inputs` makes (the keys
of :data:`~grounding_rl.prompts.preprocessing.MODEL_INPUT_KEYS`, the very tensors the policy and reference forwards
receive afterwards) and a :class:`SamplingParams`; greedy decoding (:meth:`SamplingParams.greedy`) neutralises the
checkpoint's sampling defaults in :meth:`SamplingParams.generate_kwargs`, the only place that builds ``generate``
keyword arguments. With ``video_index`` in the inputs, ``pixel_values_videos`` holds the U distinct clips only and row
i uses clip ``video_index[i]``: each clip is encoded once and the prefix its rows share (the whole prompt for the G rows
of a GRPO group; system text, video and shared instruction for several queries on one clip with a video-first prompt)
is prefilled once (:mod:`grounding_rl.rollout.shared`).

The trainer sees only :class:`RolloutEngine` (``generate(model, inputs, params) -> completion ids``), so another engine
can replace :class:`HFGenerateEngine` without touching the trainer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from grounding_rl.family import DEFAULT_VIDEO_LAYOUT
from grounding_rl.models.tokens import completion_token_ids
from grounding_rl.prompts.preprocessing import CLIPS, MODEL_INPUT_KEYS, VIDEO_INDEX, build_inputs
from grounding_rl.rollout.shared import generate_shared


@dataclass(frozen=True)
class SamplingParams:
    """How completions are decoded (the config's TRL-named knobs).

    Attributes:
        max_new_tokens: ``max_completion_length``.
        temperature, top_p, top_k, repetition_penalty: as in ``transformers.GenerationConfig`` (top_k 0 = off).
        do_sample: False = greedy (the other knobs are then ignored).
        synced_gpus: transformers' ``generate(synced_gpus=…)``; None = its default (on under ZeRO-3 with several
            processes: every step waits for all ranks, so they must call ``generate`` equally often). False lets
            ranks decode alone, e.g. evaluation shards of different sizes with the parameters gathered.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    do_sample: bool = True
    synced_gpus: bool | None = None

    @classmethod
    def greedy(cls, max_new_tokens: int, synced_gpus: bool | None = None) -> "SamplingParams":
        """Pure greedy decoding, as ``eval`` and ``infer`` use it."""
        return cls(max_new_tokens=max_new_tokens, do_sample=False, synced_gpus=synced_gpus)

    def generate_kwargs(self) -> dict:
        """Keyword arguments for ``model.generate``.

        Every sampling knob is given explicitly, so a checkpoint's ``generation_config.json`` cannot change the
        decoding (Qwen2.5-VL ships ``do_sample: true``, ``temperature: 1e-6``, ``top_k: 1`` and ``repetition_penalty:
        1.05``): greedy sets them to None / 1.0, sampling to the configured values.
        """
        synced = {} if self.synced_gpus is None else {"synced_gpus": self.synced_gpus}
        if not self.do_sample:
            return dict(max_new_tokens=self.max_new_tokens, do_sample=False, temperature=None, top_p=None,
                        top_k=None, min_p=None, repetition_penalty=1.0, **synced)
        return dict(max_new_tokens=self.max_new_tokens, do_sample=True, temperature=self.temperature,
                    top_p=self.top_p, top_k=self.top_k or None, min_p=None,
                    repetition_penalty=self.repetition_penalty, **synced)


@torch.no_grad()
def generate(model, inputs: dict, params: SamplingParams, pad_token_id: int | None = None) -> torch.LongTensor:
    """Decode one completion per prompt row.

    Args:
        model: an unwrapped Qwen-VL generation model (inside TRL's ``unwrap_model_for_generation`` during training).
        inputs: prompt tensors (:data:`MODEL_INPUT_KEYS`), left-padded, B rows; optionally ``video_index`` (B,), in
            which case ``pixel_values_videos`` holds only the distinct clips (see the module docstring).
        params: decoding settings.
        pad_token_id: passed to ``generate`` when given (else the model's generation config decides).

    Returns:
        (B, C) completion token ids, C ≤ ``params.max_new_tokens``; rows that stop early are padded (their mask comes
        from :func:`completion_mask`).
    """
    kwargs = {k: inputs[k] for k in MODEL_INPUT_KEYS + ("mm_encoder_outputs",) if k in inputs}
    prompt_length = kwargs["input_ids"].shape[1]
    decoding = params.generate_kwargs()
    if pad_token_id is not None:
        decoding["pad_token_id"] = pad_token_id
    video_index = inputs.get(VIDEO_INDEX)
    if video_index is None:
        out = model.generate(**kwargs, use_cache=True, **decoding)
    else:
        out, prompt_length = generate_shared(model, kwargs, video_index, **decoding)
    return out[:, prompt_length:]


def generate_answers(model, processor, queries: list[str], videos: list, template: str,
                     params: SamplingParams, engine: "RolloutEngine | None" = None,
                     video_layout: str = DEFAULT_VIDEO_LAYOUT) -> list[str]:
    """The B decoded completions (special tokens removed) of B (query, clip) rows, the one pass of ``eval`` and
    ``infer`` (:func:`grounding_rl.rollout.greedy.answer_batch`): each row's prompt from ``template`` and
    ``video_layout`` (:func:`build_inputs`), decoded with ``params`` by ``model`` (eval mode) or another
    :class:`RolloutEngine` (``--engine vllm``, from the same prompt tensors and clips; ``model`` then unused). Rows
    that pass the same :class:`~grounding_rl.data.video.SampledVideo` object share one vision encoding and the
    prefill of their common prefix (several queries about one clip)."""
    if not queries:
        return []
    if engine is not None:
        inputs = dict(build_inputs(processor, queries, videos, template, video_layout=video_layout))
        inputs[CLIPS] = list(videos)
        new_tokens = engine.generate(None, inputs, params)
        return processor.batch_decode(new_tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    inputs = build_inputs(processor, queries, videos, template, share_videos=True,
                          video_layout=video_layout).to(model.device)
    pad = completion_token_ids(processor.tokenizer, getattr(model, "generation_config", None)).pad
    if int(inputs[VIDEO_INDEX].max()) + 1 == len(queries):  # every clip distinct: nothing to share
        inputs.pop(VIDEO_INDEX)
    new_tokens = generate(model, dict(inputs), params, pad_token_id=pad)
    return processor.batch_decode(new_tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)


class RolloutEngine(Protocol):
    """Anything that turns prompt tensors into sampled completion ids (see :func:`generate` for the arguments).

    ``logps_need_correcting``: True for an engine whose sampling distribution can differ from the trained model's
    (TRL: vLLM with importance-sampling correction); the trainer then always stores π_old log-probs. Such an engine
    sets ``sampling_logps`` ((B, C), its own log-probs of the tokens it returned) after each ``generate``, and may
    read ``inputs["clips"]`` (each row's decoded clip) to process the frames itself
    (:class:`grounding_rl.rollout.vllm.VLLMEngine`).
    """

    logps_need_correcting: bool

    def generate(self, model, inputs: dict, params: SamplingParams) -> torch.LongTensor:
        ...


class HFGenerateEngine:
    """Sampling with ``model.generate`` (transformers) through :func:`generate`, unwrapping DDP/DeepSpeed with TRL's
    ``unwrap_model_for_generation`` (which gathers ZeRO-3 parameters when ``gather_deepspeed3_params``, and turns
    gradient checkpointing off for the duration).

    Args:
        accelerator: the trainer's ``accelerate.Accelerator``.
        gather_deepspeed3_params: TRL's ``ds3_gather_for_generation``.
        gradient_checkpointing_kwargs: the config's, passed through so checkpointing is restored identically.
    """

    logps_need_correcting = False  # the trained model itself samples

    def __init__(self, accelerator, gather_deepspeed3_params: bool = True, gradient_checkpointing_kwargs=None):
        self.accelerator = accelerator
        self.gather_deepspeed3_params = gather_deepspeed3_params
        self.gradient_checkpointing_kwargs = gradient_checkpointing_kwargs

    def generate(self, model, inputs: dict, params: SamplingParams) -> torch.LongTensor:
        from trl.models import unwrap_model_for_generation

        with unwrap_model_for_generation(
            model,
            self.accelerator,
            gather_deepspeed3_params=self.gather_deepspeed3_params,
            gradient_checkpointing_kwargs=self.gradient_checkpointing_kwargs,
        ) as unwrapped:
            return generate(unwrapped, inputs, params)


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


def cut_at_tokens(completion_ids: torch.LongTensor, stop_ids, pad_token_id: int) -> tuple[torch.LongTensor,
                                                                                           torch.Tensor]:
    """Cut each completion before its first token among ``stop_ids`` (e.g. a sampled vision placeholder, which no
    forward can take: :func:`grounding_rl.models.vision.placeholder_token_ids`), without changing any kept token.

    Args:
        completion_ids: (B, C) sampled ids.
        stop_ids: ids to cut at.
        pad_token_id: written from the cut to the end of the row.

    Returns:
        ``(ids, keep)``: (B, C) ids with the cut positions padded, and (B, C) int mask, 1 before each row's cut (all 1
        for a row without one). Multiply the completion mask by ``keep``; a cut row never reached EOS, so it counts as
        truncated. E.g. stop 9, pad 0: [[5, 9, 6]] → ids [[5, 0, 0]], keep [[1, 0, 0]].
    """
    if not len(stop_ids):
        return completion_ids, torch.ones_like(completion_ids, dtype=torch.int)
    hit = torch.isin(completion_ids, torch.as_tensor(list(stop_ids), device=completion_ids.device))
    keep = (hit.int().cumsum(dim=1) == 0).int()
    return torch.where(keep.bool(), completion_ids, torch.full_like(completion_ids, pad_token_id)), keep
