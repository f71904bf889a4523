"""The preprocessing settings that ``grounding-rl eval`` and ``grounding-rl infer`` share.

A checkpoint is evaluated with the preprocessing and prompt it was trained with: the settings come
from, in order of precedence, command-line overrides, the checkpoint's ``grounding_config.json``, a benchmark's paper
protocol (``evaluation/*.yaml``, only when one is given), and the built-in defaults. :func:`resolve_config` returns the
settings and a sentence saying where they came from, which both commands print.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from grounding_rl.data.video import VideoSettings
from grounding_rl.errors import check_number
from grounding_rl.family import VIDEO_LAYOUTS
from grounding_rl.prompts.preprocessing import CONFIG_NAME, GroundingConfig

# Greedy decoding budget for real checkpoints: TimeZero-style answers ("<think>…</think><answer>a to b</answer>") fit
# comfortably; raise it for long reasoning (Time-R1 evaluates with 1024).
DEFAULT_MAX_NEW_TOKENS = 256

# Command-line names of the VideoSettings fields that may be overridden.
VIDEO_OVERRIDES = ("fps", "min_pixels", "max_pixels", "total_pixels", "min_frames", "max_frames", "sampler",
                   "total_tokens", "min_tokens", "budget_lowers_fps", "cover_tail")
# A budget or floor given one way on the command line replaces the saved one given the other way.
_REPLACES = {"total_tokens": "total_pixels", "total_pixels": "total_tokens", "min_tokens": "min_pixels",
             "min_pixels": "min_tokens"}


def video_overrides(args) -> dict:
    """The :data:`VIDEO_OVERRIDES` given by the flags of :func:`add_preprocessing_overrides` (absent ones None):
    the keyword arguments of :func:`resolve_config`."""
    return {name: getattr(args, "video_sampler" if name == "sampler" else name, None) for name in VIDEO_OVERRIDES}


def resolve_config(model_dir: str | Path, *, prompt_template: str | None = None, fallback: GroundingConfig | None = None,
                   fallback_name: str = "benchmark protocol", video_layout: str | None = None,
                   **video_overrides) -> tuple[GroundingConfig, str]:
    """The preprocessing and prompt to evaluate ``model_dir`` with, and where they came from.

    Precedence: non-None keyword overrides > ``model_dir/grounding_config.json`` > ``fallback`` > defaults
    (:class:`GroundingConfig()`). A ``grounding_config.json`` without ``video_layout`` (written before it existed) and
    a checkpoint without the file (a published one) get the default ``released`` layout.

    Args:
        model_dir: checkpoint folder (a hub id or a folder without ``grounding_config.json`` has no saved config).
        prompt_template: override of the template name (None = keep).
        fallback: settings used when the checkpoint has no config (e.g. a benchmark's paper protocol).
        fallback_name: how to name ``fallback`` in the returned description.
        video_layout: override of the video layout (None = keep).
        video_overrides: any of :data:`VIDEO_OVERRIDES`; None values are ignored.

    Returns:
        (config, description), e.g. ``(cfg, "grounding_config.json of ckpt/ (overridden: fps)")``.

    Raises:
        ValueError: unknown override name, unknown template or video layout, or an invalid ``grounding_config.json``
            (names the file).
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
        defaults = VideoSettings()
        cleared = {other: getattr(defaults, other) for name, other in _REPLACES.items()
                   if name in changed and other not in changed}
        config = dataclasses.replace(config, video=dataclasses.replace(config.video, **cleared, **changed))
    if prompt_template is not None:
        config = dataclasses.replace(config, prompt_template=prompt_template)  # __post_init__ validates the name
        changed["prompt_template"] = prompt_template
    if video_layout is not None:
        config = dataclasses.replace(config, video_layout=video_layout)  # __post_init__ validates the name
        changed["video_layout"] = video_layout
    if changed:
        source += f"; overridden on the command line: {', '.join(sorted(changed))}"
    family = _family(model_dir)
    if family is not None:  # frames sized for the checkpoint's vision tower
        config = dataclasses.replace(config, video=family.video_settings(config.video))
    return config, source


def _family(model_dir):
    """The checkpoint's model family, or None when it has no readable ``config.json`` here (the model load reports
    that). A folder whose ``config.json`` names an unsupported ``model_type`` raises ValueError."""
    from grounding_rl.family import family_of_checkpoint

    if Path(model_dir).is_dir():
        return family_of_checkpoint(model_dir) if (Path(model_dir) / "config.json").is_file() else None
    try:  # a hub id: its cached config, if any
        return family_of_checkpoint(model_dir)
    except (OSError, ValueError):
        return None


def add_preprocessing_overrides(parser) -> None:
    """The command-line overrides of the saved preprocessing shared by ``eval`` and ``infer`` (None = keep)."""
    parser.add_argument("--prompt-template", default=None, help="override the prompt template")
    parser.add_argument("--video-layout", default=None, choices=list(VIDEO_LAYOUTS),
                        help="override the video layout (Qwen3-VL: 'released', the per-frame blocks alone as "
                        "transformers 4.57 wrote them; 'transformers5', inside one more <|vision_start|> … "
                        "<|vision_end|> pair)")
    parser.add_argument("--fps", type=float, default=None, help="override frames per second")
    parser.add_argument("--min-pixels", type=int, default=None, help="override the minimum pixels per frame")
    parser.add_argument("--max-pixels", type=int, default=None, help="override the maximum pixels per frame")
    parser.add_argument("--total-pixels", type=int, default=None, help="override the pixel budget per clip")
    parser.add_argument("--max-frames", type=int, default=None, help="override the maximum number of frames")
    parser.add_argument("--total-tokens", type=int, default=None,
                        help="override the budget in merged video tokens a clip (replaces a saved total_pixels)")
    parser.add_argument("--min-tokens", type=int, default=None,
                        help="override the per-frame floor in merged tokens (replaces a saved min_pixels)")
    parser.add_argument("--budget-lowers-fps", action=argparse.BooleanOptionalAction, default=None,
                        help="take fewer frames when the budget cannot hold them above the floor")
    parser.add_argument("--cover-tail", action=argparse.BooleanOptionalAction, default=None,
                        help="frames on the scale T / duration, covering the clip to its end")
    parser.add_argument("--video-sampler", default=None, choices=["exact", "qwen_vl_utils"],
                        help="override the frame sampler (qwen_vl_utils: fetch_video's frames and fps, as TimeZero, "
                        "Time-R1 and VideoChat-R1 checkpoints were evaluated)")


def check_video_flags(args) -> None:
    """The frame-sampling overrides of :func:`add_preprocessing_overrides` that were given are > 0.

    Raises:
        UserError: one line naming the flag, e.g. ``--fps must be > 0 (got 0.0)``.
    """
    for name in ("fps", "min_pixels", "max_pixels", "total_pixels", "max_frames", "total_tokens", "min_tokens"):
        check_number("--" + name.replace("_", "-"), getattr(args, name, None), above=0)


def check_generation_length(flag: str, max_new_tokens: int, model: str) -> None:
    """``1 ≤ max_new_tokens ≤`` the model's context (:func:`grounding_rl.models.loading.context_length`, read from
    ``config.json`` before the weights load), so a model that never writes EOS stops within its context.

    Raises:
        UserError: one line naming ``flag``, the bound and where it comes from.
    """
    from grounding_rl.models.loading import context_length

    check_number(flag, max_new_tokens, minimum=1)
    tokens, source = context_length(model)
    check_number(flag, max_new_tokens, maximum=tokens, bound=source)


def describe_config(config: GroundingConfig) -> str:
    """One line: template and video settings, for logs and reports."""
    v = config.video
    return (f"prompt_template={config.prompt_template} video_layout={config.video_layout} fps={v.fps} "
            f"min_pixels={v.floor_pixels} max_pixels={v.max_pixels} total_pixels={v.budget_pixels} "
            + (f"(tokens {v.min_tokens}..{v.total_tokens}) " if v.min_tokens or v.total_tokens else "")
            + f"frames=[{v.min_frames}, {v.max_frames}] sampler={v.sampler} pixel_factor={v.pixel_factor}"
            + (" budget_lowers_fps" if v.budget_lowers_fps else "") + (" cover_tail" if v.cover_tail else ""))
