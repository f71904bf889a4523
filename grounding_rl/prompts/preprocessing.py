"""How a (video, query) pair becomes model inputs — the one place shared by training, SFT, evaluation and inference.

``grounding_config.json`` (written into every checkpoint) records the prompt template, the video layout, the video
settings and the reward settings, so evaluation and inference reuse exactly the training preprocessing.
"""
from __future__ import annotations

import json
import re
import typing
from dataclasses import Field, asdict, dataclass, field, fields
from pathlib import Path
from typing import NamedTuple

import torch

from grounding_rl.data.video import SampledVideo, VideoSettings, setting_fields
from grounding_rl.errors import UserError
from grounding_rl.family import (DEFAULT_VIDEO_LAYOUT, VIDEO_LAYOUTS, Family, checked_video_layout, families,
                                 family_of)
from grounding_rl.prompts.templates import TEMPLATES, render_prompt

CONFIG_NAME = "grounding_config.json"

# The model inputs that build_inputs makes, defined once: generation, the policy and the reference forwards, and SFT
# all pass exactly these (without mm_token_type_ids the 3D RoPE falls back to 1D). The per-row video keys are those
# of every family (grounding_rl.family); a batch holds the ones its family's processor returned, and every consumer
# passes the keys present.
PIXELS, GRID = "pixel_values_videos", "video_grid_thw"
TEXT_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids")
PER_ROW_VIDEO_KEYS = tuple(dict.fromkeys(k for f in families() for k in f.row_video_keys))
VIDEO_KEYS = (PIXELS,) + PER_ROW_VIDEO_KEYS
MODEL_INPUT_KEYS = TEXT_KEYS + VIDEO_KEYS
# The keys a prompt batch may carry besides the model's inputs, defined once: ``video_index`` (B,) long, row i's
# distinct clip when rows share clips (``pixel_values_videos`` then holds each distinct clip once, :func:`build_inputs`
# with ``share_videos``); ``clips``, each row's decoded clip, for an engine that processes the frames itself (vLLM).
VIDEO_INDEX, CLIPS = "video_index", "clips"


def split_patches(pixels: torch.Tensor, grid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The patches of each clip: ``pixel_values_videos`` (Σ t·h·w, D) split by the clips' (N, 3) ``video_grid_thw``
    into N tensors of t·h·w rows each (``torch.split``)."""
    return torch.split(pixels, grid.prod(dim=-1).tolist())


@dataclass
class GroundingConfig:
    """What a checkpoint was trained with, saved as ``grounding_config.json``.

    The settings a user gives (the fields with a ``help``, and ``video``'s: :func:`saved_settings`) are declared
    here and in :class:`VideoSettings` once; training's arguments and ``eval``'s overrides are made from them.

    Attributes:
        prompt_template: name in :data:`grounding_rl.prompts.templates.TEMPLATES`.
        video: frame sampling settings (fps, frame bounds, pixel budget).
        reward_funcs: reward names used in training (informational for eval).
        reward_weights: their weights (None = all 1.0).
        video_layout: how the video tokens sit in the prompt, one of :data:`grounding_rl.family.VIDEO_LAYOUTS`
            (``released``, the default, also for a file written before the field existed; ``transformers5``).
        data_mix: for a training set mixing sources, rows per ``{"prompt_template", "reward_spec", "rows"}``
            (:mod:`grounding_rl.update.sources`); None when every row used ``prompt_template`` and the
            run's rewards (informational: evaluation uses ``prompt_template``).
        duration_filter: the training set's video-duration filter, ``{"min_video_duration", "max_video_duration"
            (seconds, inclusive; None = no bound), "samples" (read), "dropped"}``; None when off (informational).
    """

    prompt_template: str = field(
        default="default", metadata={"help": f"Prompt template name: one of {sorted(TEMPLATES)}."}
    )
    video: VideoSettings = field(default_factory=VideoSettings)
    reward_funcs: list[str] = field(default_factory=lambda: ["iou", "format"])
    reward_weights: list[float] | None = None
    video_layout: str = field(
        default=DEFAULT_VIDEO_LAYOUT,
        metadata={"help": f"How the video tokens sit in the prompt: one of {list(VIDEO_LAYOUTS)}. 'released' "
                  "(Qwen3-VL: the per-frame '<t seconds><|vision_start|>…<|vision_end|>' blocks alone, as transformers 4.57 and "
                  "vLLM write them, what the published checkpoints were trained on); 'transformers5' (the same "
                  "blocks inside one more <|vision_start|> … <|vision_end|> pair, transformers 5.x's processor). "
                  "Qwen2.5-VL has one layout.", "choices": list(VIDEO_LAYOUTS)},
    )
    data_mix: list[dict] | None = None
    duration_filter: dict | None = None

    def __post_init__(self):
        if self.prompt_template not in TEMPLATES:
            raise ValueError(f"unknown prompt_template {self.prompt_template!r}; known: {sorted(TEMPLATES)}")
        checked_video_layout(self.video_layout)

    def to_dict(self) -> dict:
        return asdict(self)

    def save(self, directory: str | Path) -> Path:
        """Write ``directory/grounding_config.json``; returns its path."""
        path = Path(directory) / CONFIG_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def from_dict(cls, data: dict) -> "GroundingConfig":
        """The config of a ``grounding_config.json``'s content: a key it lacks (written before the field existed)
        takes the field's default; keys of no field are ignored."""
        known = {f.name for f in fields(VideoSettings)}
        video = VideoSettings(**{k: v for k, v in (data.get("video") or {}).items() if k in known})
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data and f.name != "video"}, video=video)

    @classmethod
    def load(cls, directory: str | Path) -> "GroundingConfig | None":
        """Read ``directory/grounding_config.json``; None when the directory has none (e.g. a hub checkpoint).

        Raises:
            ValueError: the file exists but is not valid JSON (names the file).
        """
        path = Path(directory) / CONFIG_NAME
        if not path.is_file():
            return None
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: invalid JSON ({err})") from err


class Setting(NamedTuple):
    """A setting ``grounding_config.json`` records and a user gives (:func:`saved_settings`): ``name`` in
    :class:`GroundingConfig` or :class:`VideoSettings` (``prompt_template``, ``fps``), ``key`` in a training YAML
    (``prompt_template``, ``video_fps``; ``eval``'s flag ``--video-fps``), ``type`` (float, int, str or bool; an
    optional one's None allowed besides) and the declaring ``field`` (its default, its ``help`` and ``choices``)."""

    name: str
    key: str
    type: type
    field: Field

    def value_in(self, config: GroundingConfig):
        """The setting's value in ``config`` (its ``video`` for a video setting)."""
        return getattr(config.video if self.name in VideoSettings.__dataclass_fields__ else config, self.name)

    def problem(self, value, name: str | None = None) -> str | None:
        """Why ``value`` (None passes) is refused under ``name`` (default ``key``): not one of the field's
        ``choices``, or below its ``minimum``; None when it is fine."""
        metadata, name = self.field.metadata, name or self.key
        if value is not None and metadata.get("choices") and value not in metadata["choices"]:
            return f"{name} must be one of {', '.join(metadata['choices'])} (got {value!r})"
        if value is not None and metadata.get("minimum") is not None and not value >= metadata["minimum"]:
            return f"{name} must be ≥ {metadata['minimum']} (got {value})"
        return None


def settings_of(owner, prefix: str = "", chosen=None) -> list[Setting]:
    """A :class:`Setting` per field of the dataclass ``owner`` (those of ``chosen``, default all), keyed
    ``prefix + name``."""
    hints = typing.get_type_hints(owner)
    return [Setting(f.name, prefix + f.name, next(t for t in typing.get_args(hints[f.name]) or (hints[f.name],)
                                                  if t is not type(None)), f) for f in chosen or fields(owner)]


def saved_settings() -> list[Setting]:
    """Every setting ``grounding_config.json`` records that a user gives, declared once: the fields of
    :class:`GroundingConfig` with a ``help`` (``prompt_template``, ``video_layout``), then ``video``'s
    (:func:`grounding_rl.data.video.setting_fields`, ``video_<name>``). :class:`PreprocessingArguments` and ``eval``'s
    overrides (:class:`grounding_rl.eval.settings.PreprocessingOverrides`) are made from them."""
    return settings_of(GroundingConfig, "", [f for f in fields(GroundingConfig) if "help" in f.metadata]) + \
        settings_of(VideoSettings, "video_", setting_fields())


class CheckedSettings:
    """Base of a dataclass of settings declared once (each field's help, default, ``choices``, ``minimum``): building
    one raises :class:`grounding_rl.errors.UserError` (one line naming the flag, :attr:`flag` + the field's name with
    ``-`` for ``_``) for the first value :meth:`Setting.problem` refuses."""

    flag = "--"

    def __post_init__(self):
        for setting in settings_of(type(self), self.flag):
            problem = setting.problem(getattr(self, setting.name), setting.key.replace("_", "-"))
            if problem:
                raise UserError(problem)


def with_settings(settings: list[Setting]):
    """Class decorator (under ``@dataclass``): a field ``key`` per setting, with its default and help (no ``choices``:
    training reports a bad value in its own words, :meth:`Setting.problem`)."""
    def add(cls):
        for setting in settings:
            cls.__annotations__[setting.key] = setting.field.type
            setattr(cls, setting.key, field(default=setting.field.default,
                                            metadata={"help": setting.field.metadata["help"]}))
        return cls
    return add


@dataclass
@with_settings(saved_settings())
class PreprocessingArguments:
    """Prompt and frame-sampling settings of a training entry point (``train`` and ``sft`` share them, under the same
    names, so one YAML block serves both stages). Mixed into their ``TrainingArguments`` dataclasses; saved with every
    checkpoint as ``grounding_config.json``. Besides ``max_prompt_length``, its fields are made from
    :func:`saved_settings` (``prompt_template``, ``video_layout``, ``video_<name>`` for each video setting)."""

    max_prompt_length: int | None = field(
        default=8192,
        metadata={
            "help": "Longest prompt (text + video tokens) allowed; a longer one is an error naming the sample, never "
            "truncated (truncation would cut video tokens). None disables the check."
        },
    )

    @property
    def video_settings(self) -> VideoSettings:
        """The frame-sampling settings as a :class:`VideoSettings`.

        Raises:
            ValueError: contradictory settings (:class:`VideoSettings`; :meth:`preprocessing_problems` lists them).
        """
        return VideoSettings(**{f.name: getattr(self, "video_" + f.name) for f in setting_fields()})

    def preprocessing_problems(self) -> list[str]:
        """Messages for invalid or contradictory settings (empty when all is well)."""
        problems = []
        if self.prompt_template not in TEMPLATES:
            problems.append(f"prompt_template {self.prompt_template!r} is not one of {sorted(TEMPLATES)}")
        if self.video_layout not in VIDEO_LAYOUTS:
            problems.append(f"video_layout {self.video_layout!r} is not one of {list(VIDEO_LAYOUTS)}")
        if self.max_prompt_length is not None and self.max_prompt_length < 1:  # null: no check
            problems.append(f"max_prompt_length must be ≥ 1 (got {self.max_prompt_length})")
        try:  # VideoSettings' rules, its messages in this dataclass's names (fps → video_fps)
            self.video_settings
        except ValueError as err:
            names = "|".join(f.name for f in setting_fields() if "_" in f.name)  # 'fps', 'sampler': words too
            text = re.sub(rf"\b({names})\b", r"video_\1", str(err).removeprefix("invalid VideoSettings: "))
            problems.append(re.sub(r"\b(fps|sampler) must\b", r"video_\1 must", text))
        return problems


class _DistinctClips:
    """A processor's video processor that preprocesses each distinct clip once: ``index[i]`` is row i's clip. It
    returns the distinct clips' patches and, per row, their grid and metadata (which the processor reads row by row to
    write each prompt's video tokens and timestamps), so a batch of several queries about one clip resizes and
    normalises its frames once. Every other attribute is the wrapped processor's."""

    def __init__(self, video_processor, index: list[int]):
        self._inner, self._index = video_processor, index
        self._first = [index.index(u) for u in range(max(index) + 1)]

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __call__(self, videos, *args, **kwargs):
        if len(videos) != len(self._index):
            raise RuntimeError(f"{len(videos)} videos for {len(self._index)} rows")
        metadata = kwargs.get("video_metadata")
        if metadata is not None:
            kwargs["video_metadata"] = [metadata[row] for row in self._first]
        out = self._inner([videos[row] for row in self._first], *args, **kwargs)
        out["video_grid_thw"] = out["video_grid_thw"][self._index]
        if out.get("video_metadata") is not None:
            out["video_metadata"] = [out["video_metadata"][u] for u in self._index]
        return out


def build_inputs(processor, queries: list[str], videos: list[SampledVideo], template: str | list[str] = "default",
                 share_videos: bool = False, family: Family | None = None,
                 video_layout: str = DEFAULT_VIDEO_LAYOUT, **extra):
    """Processor inputs for a batch of (query, clip) pairs, left-padded for generation.

    The processor is not modified (its tokenizer keeps the padding side it was loaded with, so a checkpoint saves it
    as it came); left padding is asked for in this call only.

    Args:
        processor: a Qwen-VL ``AutoProcessor`` of a supported family.
        queries: one sentence per row.
        videos: one :class:`SampledVideo` per row (frames already resized to multiples of the family's pixel
            factor; no second resize).
        template: prompt template name, or one per row (a training set mixing sources).
        share_videos: rows passing the same :class:`SampledVideo` object share its patches: ``pixel_values_videos``
            then holds each distinct clip once, in order of first use, and ``video_index`` (B,) names each row's clip
            (see :mod:`grounding_rl.models.vision`).
        family: the model family (None = the processor's, :func:`grounding_rl.family.family_of`).
        video_layout: how the video tokens sit in the prompt (:data:`grounding_rl.family.VIDEO_LAYOUTS`; Qwen3-VL:
            ``released`` = transformers 4.57's ``<t seconds><|vision_start|>…<|vision_end|>`` per temporal group,
            ``transformers5`` = the same inside one more ``<|vision_start|>`` … ``<|vision_end|>``;
            :meth:`grounding_rl.family.Family.video_prompt`).
        extra: passed to the processor (e.g. ``return_tensors`` overrides).

    Returns:
        ``BatchFeature`` with ``input_ids`` and ``attention_mask`` (B, L), ``pixel_values_videos``
        (Σ patches, 3·2·patch²), ``video_grid_thw`` (B, 3), ``mm_token_type_ids`` (B, L), and Qwen2.5-VL's
        ``second_per_grid_ts`` (B,) — pass all of them to the model (the keys of :data:`MODEL_INPUT_KEYS` present) —
        plus ``video_index`` when ``share_videos``.

    Raises:
        ValueError: ``queries`` and ``videos`` differ in length; the processor is of no supported family; a clip's
            frames are not multiples of the family's pixel factor (sampled for another family); unknown
            ``video_layout``.
        RuntimeError: the installed processor did not lay the video out in ``video_layout``.
    """
    if len(queries) != len(videos):
        raise ValueError(f"{len(queries)} queries but {len(videos)} videos")
    family = family or family_of(processor)
    for video in videos:
        height, width = video.frames.shape[1:3]
        if height % family.pixel_factor or width % family.pixel_factor:
            raise ValueError(f"{video.path}: frames of {height}x{width} are not multiples of {family.pixel_factor} "
                             f"({family.name}); sample with family.video_settings(settings)")
    templates = [template] * len(queries) if isinstance(template, str) else list(template)
    if len(templates) != len(queries):
        raise ValueError(f"{len(templates)} prompt templates for {len(queries)} queries")
    texts = [family.video_prompt(processor, render_prompt(processor, q, t, v.duration), video_layout)
             for q, t, v in zip(queries, templates, videos)]
    clip_of: dict[int, int] = {}
    index = [clip_of.setdefault(id(v), len(clip_of)) for v in videos]
    call = processor
    if share_videos and len(clip_of) < len(videos):  # the video processor runs once per distinct clip
        import copy

        call = copy.copy(processor)
        call.video_processor = _DistinctClips(processor.video_processor, index)
    # a fast tokenizer keeps the padding it was last called with in its Rust backend, and save_pretrained writes it
    # into tokenizer.json: restore it, so the checkpoint's tokenizer pads as it did when it was loaded
    backend = getattr(processor.tokenizer, "backend_tokenizer", None)
    padding_before = backend.padding if backend is not None else None
    try:
        features = call(
            text=texts,
            videos=[v.frames for v in videos],
            video_metadata=[family.video_metadata(v) for v in videos],
            **family.processor_kwargs(),  # frames are already at qwen-vl-utils' sizes: no sampling, resize or cap
            padding=True,
            padding_side="left",
            return_tensors="pt",
            **extra,
        )
    finally:
        if backend is not None and backend.padding != padding_before:
            if padding_before is None:
                backend.no_padding()
            else:
                backend.enable_padding(**{k: v for k, v in padding_before.items() if k != "length"},
                                       length=padding_before.get("length"))
    family.check_video_layout(processor, features["input_ids"], video_layout)
    if share_videos:
        sizes = features[GRID].prod(dim=-1).tolist()
        first = sorted({clip: row for row, clip in reversed(list(enumerate(index)))}.items())
        pixels = features[PIXELS]
        if pixels.shape[0] == sum(sizes):  # the processor encoded every row's clip: keep each distinct one once
            per_row = split_patches(pixels, features[GRID])
            features[PIXELS] = torch.cat([per_row[row] for _, row in first])
        elif pixels.shape[0] != sum(int(sizes[row]) for _, row in first):
            raise RuntimeError(f"the processor returned {pixels.shape[0]} video patches for grids {sizes}")
        features[VIDEO_INDEX] = torch.tensor(index, dtype=torch.long)
    return features


class PromptTooLongError(UserError, ValueError):
    """A prompt longer than ``max_prompt_length``: the user's settings (one line, exit 2, as any
    :class:`grounding_rl.errors.UserError`), and a ``ValueError`` where callers catch one."""


def check_prompt_length(length: int, limit: int | None, sample: str) -> None:
    """The one prompt-length rule of GRPO and SFT: a prompt longer than ``max_prompt_length`` tokens is an error, never
    a truncation (truncating would cut video tokens). ``limit`` None: no limit.

    Args:
        length: the prompt's tokens (video tokens included).
        limit: ``max_prompt_length``.
        sample: how to name the sample in the message, e.g. ``"sample 3 (qid x, a.mp4)"``.

    Raises:
        PromptTooLongError: ``"sample 3 (qid x, a.mp4): prompt is 5000 tokens, more than max_prompt_length 4096;
            …"`` (a :class:`grounding_rl.errors.UserError` and a ``ValueError``).
    """
    if limit is not None and length > limit:
        raise PromptTooLongError(f"{sample}: prompt is {length} tokens, more than max_prompt_length {limit}; prompts are never "
                         "truncated (that would cut video tokens): lower video_fps / video_max_pixels / "
                         "video_total_pixels (video_total_tokens) or raise max_prompt_length")


def prompt_text(processor, input_ids, attention_mask=None) -> str:
    """One prompt row as the model sees it, readable: the decoded tokens (special tokens and Qwen3-VL's textual
    timestamps kept, left padding dropped), each run of video placeholder tokens collapsed to
    ``<|video_pad|>×N``.

    Args:
        processor: the processor that made the row.
        input_ids: (L,) token ids of one row (from :func:`build_inputs`).
        attention_mask: (L,) mask; None = every token is real.
    """
    import itertools

    tokenizer = processor.tokenizer
    ids = [int(i) for i in input_ids]
    if attention_mask is not None:
        ids = [i for i, keep in zip(ids, attention_mask) if int(keep)]
    video = getattr(processor, "video_token", None) or "<|video_pad|>"
    video_id = tokenizer.convert_tokens_to_ids(video)
    parts = []
    for is_video, run in itertools.groupby(ids, key=lambda i: i == video_id):
        run = list(run)
        parts.append(f"{video}×{len(run)}" if is_video else tokenizer.decode(run, skip_special_tokens=False))
    return "".join(parts)
