"""What ``eval``, ``difficulty`` and ``infer`` generate with: the checkpoint in transformers (``--engine hf``), or a
vLLM engine on it (``--engine vllm``: the same frames, clip metadata and prompt ids; :mod:`grounding_rl.rollout.vllm`).
"""
from __future__ import annotations

import torch

from grounding_rl.models.loading import check_weight_files, load_for_inference, load_processor
from grounding_rl.models.tokens import completion_token_ids, saved_generation_config

ENGINES = ("hf", "vllm")


def vllm_engine_for_inference(model_path: str, processor, dtype: str = "auto", max_model_len: int = 32768,
                              max_videos: int = 1):
    """A :class:`grounding_rl.rollout.vllm.VLLMEngine` for greedy evaluation and inference, with the checkpoint's
    weights (``dtype`` ``auto``: bf16 on GPU, fp32 on CPU), ``max_videos`` per prompt (``--max-turns`` K: K + 1)."""
    from grounding_rl.rollout.vllm import VLLMEngine

    ids = completion_token_ids(processor.tokenizer, saved_generation_config(model_path))
    if dtype == "auto":
        dtype = "bfloat16" if torch.cuda.is_available() else "float32"
    return VLLMEngine(model_path, ids.eos, ids.pad, dtype=dtype, max_model_len=max_model_len,
                      logps_need_correcting=False, max_videos=max_videos)


def load_inference_engine(model_path: str, device, dtype: str = "auto", attn_implementation: str | None = None,
                          engine: str = "hf", max_videos: int = 1):
    """``(model, processor, engine)``: the HF model in eval mode and no engine, or (``engine="vllm"``) no HF model and
    a vLLM engine on the checkpoint, whose weight files are checked first (a missing shard or a truncated file: one
    line, as with the hf engine); ``max_videos``: the vLLM engine's videos per prompt (K + 1 with ``--max-turns K``).

    Raises:
        ValueError: ``engine`` is not one of :data:`ENGINES`.
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; known: {list(ENGINES)}")
    if engine == "hf":
        return (*load_for_inference(model_path, device, dtype, attn_implementation), None)
    check_weight_files(model_path)
    processor = load_processor(model_path)
    return None, processor, vllm_engine_for_inference(model_path, processor, dtype, max_videos=max_videos)
