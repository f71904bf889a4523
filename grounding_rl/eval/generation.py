"""Model loading, preprocessing settings and greedy generation shared by ``grounding-rl eval`` and ``grounding-rl infer``.

A checkpoint is evaluated with the preprocessing and prompt it was trained with (issue 6, point 1): the settings come
from, in order of precedence, command-line overrides, the checkpoint's ``grounding_config.json``, a benchmark's paper
protocol (``evaluation/*.yaml``, only when one is given), and the built-in defaults. :func:`resolve_config` returns the
settings and a sentence saying where they came from, which both commands print.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from grounding_rl.data.video import SampledVideo
from grounding_rl.preprocessing import CONFIG_NAME, GroundingConfig, build_inputs

# Greedy decoding budget for real checkpoints: TimeZero-style answers ("<think>…</think><answer>a to b</answer>") fit
# comfortably; raise it for long reasoning (Time-R1 evaluates with 1024).
DEFAULT_MAX_NEW_TOKENS = 256

# Command-line names of the VideoSettings fields that may be overridden.
VIDEO_OVERRIDES = ("fps", "min_pixels", "max_pixels", "total_pixels", "min_frames", "max_frames")


def resolve_config(model_dir: str | Path, *, prompt_template: str | None = None, fallback: GroundingConfig | None = None,
                   fallback_name: str = "benchmark protocol", **video_overrides) -> tuple[GroundingConfig, str]:
    """The preprocessing and prompt to evaluate ``model_dir`` with, and where they came from.

    Precedence: non-None keyword overrides > ``model_dir/grounding_config.json`` > ``fallback`` > defaults
    (:class:`GroundingConfig()`).

    Args:
        model_dir: checkpoint folder (a hub id or a folder without ``grounding_config.json`` has no saved config).
        prompt_template: override of the template name (None = keep).
        fallback: settings used when the checkpoint has no config (e.g. a benchmark's paper protocol).
        fallback_name: how to name ``fallback`` in the returned description.
        video_overrides: any of :data:`VIDEO_OVERRIDES`; None values are ignored.

    Returns:
        (config, description), e.g. ``(cfg, "grounding_config.json of ckpt/ (overridden: fps)")``.

    Raises:
        ValueError: unknown override name, unknown template, or an invalid ``grounding_config.json`` (names the file).
    """
    unknown = set(video_overrides) - set(VIDEO_OVERRIDES)
    if unknown:
        raise ValueError(f"unknown video setting(s) {sorted(unknown)}; known: {list(VIDEO_OVERRIDES)}")
    saved = GroundingConfig.load(model_dir) if Path(model_dir).is_dir() else None
    if saved is not None:
        config, source = saved, f"{CONFIG_NAME} of {model_dir}"
    elif fallback is not None:
        config, source = fallback, f"{fallback_name} ({model_dir} has no {CONFIG_NAME})"
    else:
        config, source = GroundingConfig(), f"built-in defaults ({model_dir} has no {CONFIG_NAME})"
    changed = {k: v for k, v in video_overrides.items() if v is not None}
    if changed:
        config = dataclasses.replace(config, video=dataclasses.replace(config.video, **changed))
    if prompt_template is not None:
        config = dataclasses.replace(config, prompt_template=prompt_template)  # __post_init__ validates the name
        changed["prompt_template"] = prompt_template
    if changed:
        source += f"; overridden on the command line: {', '.join(sorted(changed))}"
    return config, source


def add_preprocessing_overrides(parser) -> None:
    """The command-line overrides of the saved preprocessing shared by ``eval`` and ``infer`` (None = keep)."""
    parser.add_argument("--prompt-template", default=None, help="override the prompt template")
    parser.add_argument("--fps", type=float, default=None, help="override frames per second")
    parser.add_argument("--min-pixels", type=int, default=None, help="override the minimum pixels per frame")
    parser.add_argument("--max-pixels", type=int, default=None, help="override the maximum pixels per frame")
    parser.add_argument("--total-pixels", type=int, default=None, help="override the pixel budget per clip")
    parser.add_argument("--max-frames", type=int, default=None, help="override the maximum number of frames")


def describe_config(config: GroundingConfig) -> str:
    """One line: template and video settings, for logs and reports."""
    v = config.video
    return (f"prompt_template={config.prompt_template} fps={v.fps} min_pixels={v.min_pixels} "
            f"max_pixels={v.max_pixels} total_pixels={v.total_pixels} frames=[{v.min_frames}, {v.max_frames}]")


def default_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on a CUDA device that supports it, else float32 (CPU generation in bfloat16 is slow and lossy)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def load_model(model_dir: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype = "auto",
               attn_implementation: str | None = None):
    """Load a Qwen2.5-VL checkpoint and its processor for inference (``trust_remote_code`` off, eval mode).

    Args:
        model_dir: folder or hub id readable by ``AutoModelForImageTextToText.from_pretrained``.
        device: where to put the model.
        dtype: ``"auto"`` (:func:`default_dtype`), a torch dtype, or its name (``"bfloat16"``, ``"float32"``).
        attn_implementation: e.g. ``"sdpa"`` or ``"flash_attention_2"``; None = the transformers default.

    Returns:
        (model, processor).
    """
    from grounding_rl.models.loading import load_policy, load_processor

    device = torch.device(device)
    if dtype == "auto":
        dtype = default_dtype(device)
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    model = load_policy(str(model_dir), dtype=dtype, attn_implementation=attn_implementation).to(device).eval()
    processor = load_processor(str(model_dir))
    return model, processor


@torch.inference_mode()
def generate_answers(model, processor, queries: list[str], videos: list[SampledVideo], template: str = "default",
                     max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> list[str]:
    """Greedy, batched generation with the KV cache on: one decoded completion per (query, clip) row.

    Pure greedy whatever the checkpoint's ``generation_config.json`` says (Qwen2.5-VL ships ``do_sample: true``,
    ``temperature: 1e-6`` and ``repetition_penalty: 1.05``): sampling is off and the repetition penalty is 1.

    Inputs are built only by :func:`grounding_rl.preprocessing.build_inputs` (all of its tensors, including
    ``mm_token_type_ids`` and ``second_per_grid_ts``, go to ``generate``), so eval and infer see exactly the training
    preprocessing. Special tokens are removed from the decoded text.

    Args:
        model: a Qwen2.5-VL ``...ForConditionalGeneration`` in eval mode.
        processor: its processor.
        queries: B sentences.
        videos: B sampled clips (same order).
        template: prompt template name.
        max_new_tokens: generation budget per row.

    Returns:
        B strings.
    """
    if not queries:
        return []
    inputs = build_inputs(processor, queries, videos, template).to(model.device)
    tokenizer = processor.tokenizer
    output = model.generate(
        **inputs,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        temperature=None,  # the checkpoint's generation_config may carry sampling defaults; greedy ignores them
        top_p=None,
        top_k=None,
        repetition_penalty=1.0,  # Qwen2.5-VL checkpoints ship 1.05; pure greedy is reproducible across checkpoints
        use_cache=True,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )
    new_tokens = output[:, inputs["input_ids"].shape[1]:]
    return processor.batch_decode(new_tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)

