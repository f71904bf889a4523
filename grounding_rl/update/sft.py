"""Supervised warm start that teaches the answer format before GRPO: config, collator and trainer.

Each canonical sample becomes one chat turn: the prompt is exactly what GRPO, evaluation and inference use (frames from
:func:`grounding_rl.data.video.sample_frames`, text and video tensors from
:func:`grounding_rl.prompts.preprocessing.build_inputs` with the configured prompt template); the target is
:func:`grounding_rl.prompts.templates.answer_text` of the ground truth followed by the end-of-turn token. Only the
target's tokens carry labels; prompt, video and padding tokens are ``-100``. Training is ``transformers.Trainer`` with a
small collator (:class:`SFTCollator`): TRL's ``SFTTrainer`` builds its own prompt/completion tokenisation and video
handling (qwen-vl-utils sampling, no ``video_metadata``), which would not be our preprocessing. The entry point is
``grounding-rl sft`` (:mod:`grounding_rl.cli.sft`).

**Crop trajectories** (``crop_trajectory_fraction`` f > 0, ``max_tool_calling_iterations`` K ≥ 1): a cold start for
multi-turn GRPO with the crop tool (LongVT, arXiv 2511.20785, SFT on tool-use traces before agentic RL). A sample
drawn with probability f (:func:`crop_plan`, a seeded RNG per (seed, sample index): the same choice and window on
every epoch, process and resume) becomes a conversation: the first prompt of the multi-turn loop (the tool offered,
at most K crops), model turn 1 = :func:`grounding_rl.rollout.tools.call_text` of a window containing the ground
truth (:func:`crop_target_window`), the tool turn = what the environment appends at rollout (the conversation is
built by :func:`grounding_rl.rollout.conversation.start` and :func:`~grounding_rl.rollout.conversation.step`, the
rollout's own code, with these two scripted model turns: same window sampling, text and time), model turn 2 = the
answer target (absolute seconds). Labels only on the model turns (``tool_mask``); tool, user, system, video and
padding tokens are ``-100``. The other samples stay the single-turn samples above (no tool offered), so the model
keeps answering directly when no tool is offered and learns to crop when it is.
"""
from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import Trainer, TrainingArguments

from grounding_rl.data.dataset import VideoCollator
from grounding_rl.data.video import VideoSettings
from grounding_rl.family import DEFAULT_VIDEO_LAYOUT, family_of
from grounding_rl.prompts.preprocessing import (VIDEO_KEYS, GroundingConfig, PreprocessingArguments, build_inputs,
                                             check_prompt_length, settings_of, with_settings)
from grounding_rl.prompts.templates import DEFAULT_THINK, answer_set_text, answer_text
from grounding_rl.rollout.tools import ToolSettings
from grounding_rl.update.arguments import BaseTrainingArguments, count_problems, trl_field
from grounding_rl.update.resume import ExactResumeMixin
from grounding_rl.update.checkpoints import CompleteCheckpointMixin
from grounding_rl.update.saving import GroundingSaveMixin

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100


@dataclass
@with_settings(settings_of(ToolSettings))
class GroundingSFTConfig(BaseTrainingArguments, PreprocessingArguments):
    """Configuration of ``grounding-rl sft``: ``transformers.TrainingArguments`` plus the prompt and video settings
    (the field names of :class:`grounding_rl.update.config.GroundingGRPOConfig`, so one YAML block serves both stages)
    and the target's think text. Data and model come from the shared script arguments
    (:class:`grounding_rl.cli.common.GroundingScriptArguments`) and ``trl.ModelConfig``."""

    think_text: str = field(
        default=DEFAULT_THINK, metadata={"help": "Text inside <think></think> of every target (short and generic)."}
    )
    crop_trajectory_fraction: float = field(
        default=0.0,
        metadata={"help": "Share of samples (0-1, drawn per sample from a seeded RNG) trained as a crop trajectory: "
                  "the tool offered, a crop request for a window containing the ground truth, the environment's tool "
                  "turn, then the answer (loss on the two model turns only). 0 = single-turn SFT. Needs "
                  "max_tool_calling_iterations."})
    # --- TrainingArguments defaults changed for this task (their help texts read from TrainingArguments)
    learning_rate: float = trl_field("learning_rate", default=1e-5, source=TrainingArguments)
    logging_steps: float = trl_field("logging_steps", default=10, source=TrainingArguments)
    remove_unused_columns: bool | None = trl_field(
        "remove_unused_columns", default=False, source=TrainingArguments,
        note="Kept False here: the collator needs the raw sample fields.")

    def __post_init__(self):
        from grounding_rl.update.fields import refused_settings

        refused = refused_settings(self, "sft")  # the values as parsed, before TrainingArguments changes any
        if refused:
            raise ValueError("invalid GroundingSFTConfig: " + "; ".join(refused))
        super().__post_init__()
        problems = count_problems(self) + self.preprocessing_problems() + self.crop_problems()
        if problems:
            raise ValueError("invalid GroundingSFTConfig: " + "; ".join(problems))

    def crop_problems(self) -> list[str]:
        """Messages for invalid crop-trajectory settings (empty when all is well)."""
        from grounding_rl.rollout.zoom import window_problems

        f, k = self.crop_trajectory_fraction, self.max_tool_calling_iterations
        out = [p for p in (s.problem(getattr(self, s.key)) for s in settings_of(ToolSettings)) if p]
        if not 0.0 <= f <= 1.0:
            out.append(f"crop_trajectory_fraction must be in [0, 1] (got {f})")
        if out:
            return out
        if f == 0.0:
            return [] if k is None else [f"max_tool_calling_iterations {k} is only used with crop_trajectory_fraction "
                                         "> 0 (the trajectories' offer of the tool)"]
        if k is None or k < 1:
            out.append(f"crop_trajectory_fraction {f} needs max_tool_calling_iterations ≥ 1 (got {k}): the K that "
                       "GRPO and eval --max-tool-calling-iterations will offer")
        out += window_problems("crop_trajectory_fraction > 0", self.video_sampler, self.prompt_template,
                               "the crop tool is for one")
        return out

    def grounding_config(self) -> GroundingConfig:
        """What GRPO, evaluation and inference must reuse (no rewards were used: ``reward_funcs`` is empty)."""
        return GroundingConfig(prompt_template=self.prompt_template, video=self.video_settings, reward_funcs=[],
                               reward_weights=None, video_layout=self.video_layout)


MAX_CROP_MARGIN = 2.0  # u ~ U(0, 2) per side: mean 1, eval --zoom's default margin


def crop_plan(seed: int, index: int, fraction: float) -> tuple[float, float] | None:
    """Whether sample ``index`` is trained as a crop trajectory, and its two margin draws.

    A ``random.Random`` seeded with ``"{seed}:{index}"`` (a pure function of both: the same on every epoch, process
    and resume) draws v, u_left, u_right in that order; the sample is a trajectory when v < ``fraction``.

    Returns:
        ``(u_left, u_right)``, each uniform in [0, :data:`MAX_CROP_MARGIN`), or None for a direct-answer sample.
    """
    rng = random.Random(f"{seed}:{index}")
    v, left, right = rng.random(), rng.uniform(0.0, MAX_CROP_MARGIN), rng.uniform(0.0, MAX_CROP_MARGIN)
    return (left, right) if v < fraction else None


def crop_target_window(start: float, end: float, duration: float, clip_fps: float,
                       margins: tuple[float, float]) -> tuple[float, float]:
    """The window a crop trajectory requests: the ground truth [s, e] widened on each side and clipped to the video.

    [s − m_l, e + m_r] ∩ [0, d] with m = max(u · (e − s), 2 / f₁) per side (u from :func:`crop_plan`): the rule of
    ``eval --zoom``'s window (:func:`grounding_rl.eval.zoom.zoom_window`, margin × length, never below one temporal
    patch = two frames of the whole clip at its sampled rate f₁) with its margin drawn per side, so the ground truth
    is not always centred. The window's ends are whole seconds (start rounded down, end up; the video's end when
    that is nearer): a request needs no finer precision than its margin of ≥ 2 frames, and random hundredths would be
    digits to learn that carry nothing (a tiny model copying them collapsed to empty windows).

    Args:
        start, end: the ground truth, seconds (start ≤ end); duration: the video's length, seconds.
        clip_fps: f₁, the whole clip's sampled rate (frames per second, > 0).
        margins: (u_left, u_right) ≥ 0.

    Returns:
        (start, end) seconds. E.g. gt (40, 45), d 150, f₁ 0.32, u (0.5, 2.0) → m = (6.25, 10) → (33, 55);
        gt (140, 145), d 150.5, u (1, 1) → (133, 150.5).
    """
    floor = 2.0 / clip_fps
    length = end - start
    left, right = (max(u * length, floor) for u in margins)
    return float(max(0, math.floor(start - left))), round(min(float(duration), float(math.ceil(end + right))), 2)


class SFTCollator:
    """Turns dataset items into a left-padded batch whose labels cover only the target.

    The prompt part of every row is exactly :func:`grounding_rl.prompts.preprocessing.build_inputs`' output (its
    non-padding tokens, in order); the target's ids are appended (tokenised on their own, which equals tokenising the
    whole text because the prompt ends with ``"assistant\\n"``, a pre-token boundary of the Qwen2 split regex).
    With ``crop_fraction`` > 0 some rows are crop trajectories instead (module docstring): their ids are the
    rollout's conversation (:mod:`grounding_rl.rollout.conversation`), labels on its model turns only; a row whose
    window cannot be sampled or whose tool turn overflows ``max_prompt_length`` stays a direct-answer row (logged).

    Args:
        processor: the model's processor (its family decides the preprocessing and the frames' pixel factor).
        dataset: the training :class:`grounding_rl.data.dataset.GroundingDataset` whose items (with ``index``) are
            collated; clips load through :class:`grounding_rl.data.dataset.VideoCollator`, so an unreadable clip is
            replaced by a deterministic substitute and logged, as in GRPO.
        template: prompt template name (a row's own ``prompt_template`` wins, for its prompt and target alike).
        video: frame-sampling settings.
        think_text: the ``<think>`` text of the targets.
        max_prompt_length: an error (naming the qid) when a prompt has more tokens; None = no check.
        frame_cache: optional frame cache for the clips.
        video_layout: how the video tokens sit in the prompt (:data:`grounding_rl.family.VIDEO_LAYOUTS`).
        crop_fraction, max_turns, seed: ``crop_trajectory_fraction``, ``max_tool_calling_iterations`` (K) and the
            run's seed (:func:`crop_plan`).

    Returns (``__call__``):
        dict with ``input_ids``, ``attention_mask``, ``mm_token_type_ids``, ``labels`` (B, L) and
        the video tensors of the family (``pixel_values_videos``, ``video_grid_thw``; Qwen2.5-VL's
        ``second_per_grid_ts``), every row's videos in row order, each row's in token order.
    """

    def __init__(self, processor, dataset, template: str = "default", video: VideoSettings = VideoSettings(),
                 think_text: str = DEFAULT_THINK, max_prompt_length: int | None = None, frame_cache=None,
                 video_layout: str = DEFAULT_VIDEO_LAYOUT, crop_fraction: float = 0.0, max_turns: int | None = None,
                 seed: int = 0):
        self.family = family_of(processor)
        self.settings = self.family.video_settings(video)
        self.loader = VideoCollator(dataset, self.settings, cache=frame_cache)
        self.processor = processor
        self.template = template
        self.video_layout = video_layout
        self.think_text = think_text
        self.max_prompt_length = max_prompt_length
        self.crop_fraction, self.max_turns, self.seed = crop_fraction, max_turns, seed

    def target(self, row: dict, template: str) -> str:
        """The answer turn's text (no end-of-turn token)."""
        return (answer_text(row["start"], row["end"], self.think_text, template) if not row.get("spans") else
                answer_set_text(row["spans"], self.think_text, template))

    def trajectory(self, row: dict, template: str, margins: tuple[float, float]):
        """The row's crop conversation (:class:`grounding_rl.rollout.conversation.Trajectory`, done), or None when
        its window cannot be used (logged)."""
        from grounding_rl.rollout import conversation as conv
        from grounding_rl.rollout.tools import CropEnvironment, call_text

        tokenizer = self.processor.tokenizer
        clip, name = row["clip"], f"sample {row['qid']} ({row['video']})"
        window = crop_target_window(row["start"], row["end"], clip.duration, clip.sampled_fps, margins)
        t = conv.start(self.processor, self.family, row["query"], clip, template, self.max_turns, self.video_layout,
                       self.max_prompt_length, name)
        end_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
        for text in (call_text(window), self.target(row, template)):
            conv.step(t, tokenizer(text + tokenizer.eos_token, add_special_tokens=False)["input_ids"],
                      self.processor, self.family, CropEnvironment(self.settings), max_turns=self.max_turns,
                      end_ids=[end_id], max_prompt_length=self.max_prompt_length, layout=self.video_layout)
            if not t.windows or t.context_forced:
                logger.warning("%s: the crop window %.2f-%.2f s %s; trained as a direct answer", name, *window,
                               "overflows max_prompt_length" if t.context_forced else
                               f"cannot be used ({t.turns[0]['error']})")
                return None
        return t

    def __call__(self, rows: list[dict]) -> dict:
        tokenizer = self.processor.tokenizer
        rows = self.loader(rows)  # decoded; an unreadable clip is replaced by its substitute
        templates = [r.get("prompt_template") or self.template for r in rows]  # a row's own template wins
        trajectories = {}
        for i, (row, t) in enumerate(zip(rows, templates)):
            plan = None if row.get("spans") or not self.crop_fraction else \
                crop_plan(self.seed, row["index"], self.crop_fraction)
            if plan is not None and (traj := self.trajectory(row, t, plan)) is not None:
                trajectories[i] = traj
        direct = [i for i in range(len(rows)) if i not in trajectories]
        per_row = {}  # i -> (ids, mm, labels, videos: list of {key: tensor})
        if direct:
            prompt = build_inputs(self.processor, [rows[i]["query"] for i in direct], [rows[i]["clip"] for i in direct],
                                  [templates[i] for i in direct], video_layout=self.video_layout)
            target_ids = tokenizer([self.target(rows[i], templates[i]) + tokenizer.eos_token for i in direct],
                                   add_special_tokens=False)["input_ids"]
            patches = prompt["video_grid_thw"].prod(dim=1).tolist()
            pixels = torch.split(prompt["pixel_values_videos"], patches)
            for k, i in enumerate(direct):
                keep = prompt["attention_mask"][k].bool()
                prompt_ids = prompt["input_ids"][k][keep]
                check_prompt_length(len(prompt_ids), self.max_prompt_length,
                                    f"sample {rows[i]['qid']} ({rows[i]['video']})")
                target = torch.tensor(target_ids[k], dtype=prompt_ids.dtype)
                video = {key: (pixels[k] if key == "pixel_values_videos" else prompt[key][k])
                         for key in VIDEO_KEYS if key in prompt}
                per_row[i] = (torch.cat([prompt_ids, target]),
                              torch.cat([prompt["mm_token_type_ids"][k][keep], torch.zeros_like(target)]),
                              torch.cat([torch.full_like(prompt_ids, IGNORE_INDEX), target]), [video])
        for i, t in trajectories.items():
            completion = torch.tensor(t.completion_ids, dtype=torch.long)
            trained = torch.tensor(t.tool_mask, dtype=torch.bool)
            per_row[i] = (torch.tensor(t.prompt_ids + t.completion_ids, dtype=torch.long),
                          torch.tensor(t.prompt_mm + t.completion_mm, dtype=torch.long),
                          torch.cat([torch.full((len(t.prompt_ids),), IGNORE_INDEX, dtype=torch.long),
                                     torch.where(trained, completion, IGNORE_INDEX)]),
                          [{key: v[key] for key in VIDEO_KEYS if key in v} for v in t.videos])
        ids, mm, labels, videos = zip(*(per_row[i] for i in range(len(rows))))
        batch = {  # left-padded
            "input_ids": pad_sequence(ids, batch_first=True, padding_value=tokenizer.pad_token_id, padding_side="left"),
            "attention_mask": pad_sequence([torch.ones_like(x) for x in ids], batch_first=True, padding_side="left"),
            "mm_token_type_ids": pad_sequence(mm, batch_first=True, padding_side="left"),
            "labels": pad_sequence(labels, batch_first=True, padding_value=IGNORE_INDEX, padding_side="left"),
        }
        videos = [v for row in videos for v in row]
        for key in VIDEO_KEYS:
            if key in videos[0]:
                batch[key] = (torch.cat([v[key] for v in videos]) if key == "pixel_values_videos" else
                              torch.stack([torch.as_tensor(v[key]) for v in videos]))
        return batch


class GroundingSFTTrainer(CompleteCheckpointMixin, ExactResumeMixin, GroundingSaveMixin, Trainer):
    """``transformers.Trainer`` whose checkpoints hold ``grounding_config.json`` and a model card."""

    stage = "SFT"
