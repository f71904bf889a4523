"""The preprocessing settings that ``grounding-rl eval`` and ``grounding-rl infer`` share.

A checkpoint is evaluated with the preprocessing and prompt it was trained with: the settings come
from, in order of precedence, command-line overrides, the checkpoint's ``grounding_config.json``, a benchmark's paper
protocol (``evaluation/*.yaml``, only when one is given), and the built-in defaults. :func:`resolve_config` returns the
settings and a sentence saying where they came from, which both commands print.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from grounding_rl.data.video import VideoSettings, setting_fields
from grounding_rl.errors import UserError, check_number
from grounding_rl.prompts.preprocessing import CONFIG_NAME, GroundingConfig, saved_settings

# Greedy decoding budget for real checkpoints: TimeZero-style answers ("<think>…</think><answer>a to b</answer>") fit
# comfortably; raise it for long reasoning (Time-R1 evaluates with 1024).
DEFAULT_MAX_NEW_TOKENS = 256

# A budget or floor given one way on the command line replaces the saved one given the other way.
_REPLACES = {"total_tokens": "total_pixels", "total_pixels": "total_tokens", "min_tokens": "min_pixels",
             "min_pixels": "min_tokens"}


def resolve_config(model_dir: str | Path, overrides: "PreprocessingOverrides | None" = None, *,
                   fallback: GroundingConfig | None = None,
                   fallback_name: str = "benchmark protocol") -> tuple[GroundingConfig, str]:
    """The preprocessing and prompt to evaluate ``model_dir`` with, and where they came from.

    Precedence: non-None keyword overrides > ``model_dir/grounding_config.json`` > ``fallback`` > defaults
    (:class:`GroundingConfig()`). A ``grounding_config.json`` without ``video_layout`` (written before it existed) and
    a checkpoint without the file (a published one) get the default ``released`` layout.

    Args:
        model_dir: checkpoint folder (a hub id or a folder without ``grounding_config.json`` has no saved config).
        overrides: the command line's (:class:`PreprocessingOverrides`; None or None fields = keep).
        fallback: settings used when the checkpoint has no config (e.g. a benchmark's paper protocol).
        fallback_name: how to name ``fallback`` in the returned description.

    Returns:
        (config, description), e.g. ``(cfg, "grounding_config.json of ckpt/ (overridden: fps)")``.

    Raises:
        ValueError: unknown template or video layout, or an invalid ``grounding_config.json`` (names the file).
        UserError: overrides that contradict each other or the saved settings (:func:`_check_override_bounds`), the
            ``transformers5`` layout on an untested transformers (:func:`check_layout_supported`), or the
            ``lmms_eval_qwen2_5_vl`` sampler for a Qwen3-VL checkpoint.
    """
    overrides = overrides or PreprocessingOverrides()
    saved = GroundingConfig.load(model_dir) if Path(model_dir).is_dir() else None
    if saved is not None:
        config, source = saved, f"{CONFIG_NAME} of {model_dir}"
    elif fallback is not None:
        config, source = fallback, f"{fallback_name} ({model_dir} has no {CONFIG_NAME})"
    else:
        config, source = GroundingConfig(), f"built-in defaults ({model_dir} has no {CONFIG_NAME})"
    changed = {k: v for k, v in overrides.video().items() if v is not None}
    family = checkpoint_family(model_dir)
    if changed:
        defaults = VideoSettings()
        cleared = {other: getattr(defaults, other) for name, other in _REPLACES.items()
                   if name in changed and other not in changed}
        _check_override_bounds(config.video, {**cleared, **changed}, family, source)
        config = dataclasses.replace(config, video=dataclasses.replace(config.video, **cleared, **changed))
    named = {k: v for k, v in dataclasses.asdict(overrides).items() if v is not None and k not in overrides.video()}
    config = dataclasses.replace(config, **named)  # prompt_template, video_layout: __post_init__ validates the names
    changed.update(named)
    if changed:
        source += f"; overridden on the command line: {', '.join(sorted(changed))}"
    check_layout_supported(config.video_layout, "--video-layout" if "video_layout" in named else
                           f"video_layout of {source.split(';')[0]}")
    if family is not None and config.video.sampler in family.foreign_samplers:
        raise UserError(f"--video-sampler {config.video.sampler} is lmms-eval's Qwen2.5-VL backend; {model_dir} is a "
                        f"{family.display_name} checkpoint (use exact or qwen_vl_utils)")
    if family is not None:  # frames sized for the checkpoint's vision tower
        config = dataclasses.replace(config, video=family.video_settings(config.video))
    return config, source


# The transformers versions the project is tested on, as pyproject.toml pins them (``transformers>=5.19,<5.25``) and the
# README states them ("5.19 to 5.24"); tests/test_eval.py checks that the three agree.
TESTED_TRANSFORMERS = ("5.19", "5.25")  # [lowest, first untested)


def check_layout_supported(layout: str, flag: str = "--video-layout") -> None:
    """The ``transformers5`` video layout is what transformers 5's Qwen3-VL processor writes in the tested range
    :data:`TESTED_TRANSFORMERS` (the installed version from ``importlib.metadata``); outside it the processor's
    output is not the one the layout describes (5.25.0 ends in a traceback).

    Raises:
        UserError: one line naming ``flag``, the installed version and the tested range.
    """
    from grounding_rl.family.base import TRANSFORMERS5

    if layout != TRANSFORMERS5:
        return
    from importlib.metadata import version

    from packaging.version import Version

    installed = version("transformers")
    low, high = TESTED_TRANSFORMERS
    if not Version(low) <= Version(installed) < Version(high):
        raise UserError(f"{flag} transformers5 needs transformers >= {low}, < {high} (the tested range); "
                        f"transformers {installed} is installed (pip install 'transformers>={low},<{high}')")


def _check_override_bounds(saved, changed: dict, family, source: str) -> None:
    """Frame-count and per-frame bounds that the command-line overrides ``changed`` (VideoSettings field → value)
    break against each other or the saved settings ``saved``, in the flags' own units, before VideoSettings refuses
    them in its own words (pixels, "min_frames").

    Raises:
        UserError: ``--video-max-frames`` under the minimum frame count (lower it with ``--video-min-frames``), or
            ``--video-min-tokens`` above the per-frame maximum in merged tokens.
    """
    merged = {**dataclasses.asdict(saved), **changed}
    if ("max_frames" in changed or "min_frames" in changed) and merged["min_frames"] > merged["max_frames"]:
        where = "--video-min-frames" if "min_frames" in changed else \
            ("video_min_frames of grounding_config.json" if source.startswith(CONFIG_NAME) else "the default")
        raise UserError(f"--video-max-frames {merged['max_frames']} is under the minimum of {merged['min_frames']} "
                        f"frames ({where}); give --video-min-frames {merged['max_frames']} or lower, or a larger "
                        "--video-max-frames")
    if changed.get("min_tokens") is not None:
        factor = family.pixel_factor if family is not None else saved.pixel_factor
        ceiling = dataclasses.replace(saved, **{**changed, "min_tokens": None}, pixel_factor=factor).ceiling_pixels
        most = ceiling // factor ** 2
        if changed["min_tokens"] > most:
            raise UserError(f"--video-min-tokens {changed['min_tokens']} is above the per-frame maximum of {most} "
                            f"merged tokens (--video-max-pixels {ceiling} / {factor}²); give --video-min-tokens "
                            f"{most} or lower, or a larger --video-max-pixels")


def checkpoint_family(model_dir):
    """The checkpoint's model family, or None when it has no readable ``config.json`` here (the model load reports
    that). A folder whose ``config.json`` names an unsupported ``model_type`` raises ValueError."""
    from grounding_rl.family import family_of_checkpoint

    if Path(model_dir).is_dir():
        return family_of_checkpoint(model_dir) if (Path(model_dir) / "config.json").is_file() else None
    try:  # a hub id: its cached config, if any
        return family_of_checkpoint(model_dir)
    except (OSError, ValueError):
        return None


def _with_overrides(cls):
    """Class decorator (under ``@dataclass``): a field ``name`` per :func:`saved_settings` entry, its value or None."""
    for setting in saved_settings():
        cls.__annotations__[setting.name] = f"{setting.type.__name__} | None"
        setattr(cls, setting.name, None)
    return cls


@dataclasses.dataclass(frozen=True)
@_with_overrides
class PreprocessingOverrides:
    """The command-line overrides of a checkpoint's saved preprocessing that ``eval``, ``difficulty`` and ``infer``
    share (None = keep the saved value; :func:`resolve_config`): a field per setting ``grounding_config.json`` records
    (:func:`grounding_rl.prompts.preprocessing.saved_settings`), under its name there: ``prompt_template``,
    ``video_layout``, and the :class:`grounding_rl.data.video.VideoSettings` fields (``fps``, ``min_pixels``, …,
    ``cover_tail``; a budget or floor given one way replaces the saved one given the other way). Its flags:
    :func:`grounding_rl.cli.eval.add_preprocessing_overrides`.
    """

    @classmethod
    def from_args(cls, args) -> "PreprocessingOverrides":
        """The overrides of arguments parsed with :func:`grounding_rl.cli.eval.add_preprocessing_overrides`."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    def check(self) -> None:
        """The numeric overrides that were given are > 0.

        Raises:
            UserError: one line naming the flag, e.g. ``--video-fps must be > 0 (got 0.0)``.
        """
        for setting in saved_settings():
            if setting.type in (int, float):
                check_number("--" + setting.key.replace("_", "-"), getattr(self, setting.name), above=0)

    def video(self) -> dict:
        """The video overrides as :func:`resolve_config` keywords (None values included)."""
        return {f.name: getattr(self, f.name) for f in setting_fields()}


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
            f"min_pixels={v.floor_pixels} max_pixels={v.ceiling_pixels} total_pixels={v.budget_pixels} "
            + (f"(tokens {v.min_tokens}..{v.total_tokens}) " if v.min_tokens or v.total_tokens else "")
            + f"frames=[{v.min_frames}, {v.max_frames}] sampler={v.sampler} pixel_factor={v.pixel_factor}"
            + (" budget_lowers_fps" if v.budget_lowers_fps else "") + (" cover_tail" if v.cover_tail else ""))
