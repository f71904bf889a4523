"""What ``eval``, ``difficulty`` and ``infer`` generate with: the checkpoint in transformers (``--engine hf``), or a
vLLM engine on it (``--engine vllm``: the same frames, clip metadata and prompt ids; :mod:`grounding_rl.rollout.vllm`).
"""
from __future__ import annotations

import torch

from grounding_rl.errors import UserError
from grounding_rl.models.loading import check_weight_files, load_for_inference, load_processor
from grounding_rl.models.tokens import completion_token_ids, saved_generation_config

ENGINES = ("hf", "vllm")
DTYPES = ("auto", "bfloat16", "float16", "float32")  # what --dtype takes (auto: bf16 on GPU, fp32 on CPU)


def check_dtype(dtype: str, flag: str = "--dtype") -> None:
    """Raises UserError (one line naming ``flag``) unless ``dtype`` is one of :data:`DTYPES`."""
    if dtype not in DTYPES:
        raise UserError(f"{flag} {dtype!r} is not one of {', '.join(DTYPES)}")


def check_device(device: str | None, flag: str = "--device") -> None:
    """``device`` (None = the default) names a device this machine has, before a model loads.

    Raises:
        UserError: one line naming ``flag``: not a torch device name (``cpu``, ``cuda``, ``cuda:1``), CUDA asked for
            where ``torch.cuda.is_available()`` is false, or a CUDA index past ``torch.cuda.device_count()``.
    """
    if device is None:
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise UserError(f"{flag} {device!r} is not a device (cpu, cuda, cuda:1, …)") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"{flag} {device}: no CUDA GPU is available here (torch.cuda.is_available() is false); "
                            "use --device cpu or leave --device out")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise UserError(f"{flag} {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif parsed.type != "cpu":
        raise UserError(f"{flag} {device}: eval and infer run on cpu or cuda")


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
