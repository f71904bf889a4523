"""Supervised warm start that teaches the answer format before GRPO: config, collator and trainer.

Each canonical sample becomes one chat turn: the prompt is exactly what GRPO, evaluation and inference use (frames from
:func:`grounding_rl.data.video.sample_frames`, text and video tensors from
:func:`grounding_rl.prompts.preprocessing.build_inputs` with the configured prompt template); the target is
:func:`grounding_rl.prompts.templates.answer_text` of the ground truth followed by the end-of-turn token. Only the
target's tokens carry labels; prompt, video and padding tokens are ``-100``. Training is ``transformers.Trainer`` with a
small collator (:class:`SFTCollator`): TRL's ``SFTTrainer`` builds its own prompt/completion tokenisation and video
handling (qwen-vl-utils sampling, no ``video_metadata``), which would not be our preprocessing. The entry point is
``grounding-rl sft`` (:mod:`grounding_rl.cli.sft`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from transformers import Trainer, TrainingArguments

from grounding_rl.data.dataset import VideoCollator
from grounding_rl.data.video import VideoSettings
from grounding_rl.family import DEFAULT_VIDEO_LAYOUT, family_of
from grounding_rl.prompts.preprocessing import (VIDEO_KEYS, GroundingConfig, PreprocessingArguments, build_inputs,
                                             check_prompt_length)
from grounding_rl.prompts.templates import DEFAULT_THINK, answer_set_text, answer_text
from grounding_rl.update.arguments import BaseTrainingArguments, count_problems, trl_field
from grounding_rl.update.resume import ExactResumeMixin
from grounding_rl.update.saving import GroundingSaveMixin

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100


@dataclass
class GroundingSFTConfig(BaseTrainingArguments, PreprocessingArguments):
    """Configuration of ``grounding-rl sft``: ``transformers.TrainingArguments`` plus the prompt and video settings
    (the field names of :class:`grounding_rl.update.config.GroundingGRPOConfig`, so one YAML block serves both stages)
    and the target's think text. Data and model come from the shared script arguments
    (:class:`grounding_rl.cli.common.GroundingScriptArguments`) and ``trl.ModelConfig``."""

    think_text: str = field(
        default=DEFAULT_THINK, metadata={"help": "Text inside <think></think> of every target (short and generic)."}
    )
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
        problems = count_problems(self) + self.preprocessing_problems()
        if problems:
            raise ValueError("invalid GroundingSFTConfig: " + "; ".join(problems))

    def grounding_config(self) -> GroundingConfig:
        """What GRPO, evaluation and inference must reuse (no rewards were used: ``reward_funcs`` is empty)."""
        return GroundingConfig(prompt_template=self.prompt_template, video=self.video_settings, reward_funcs=[],
                               reward_weights=None, video_layout=self.video_layout)


class SFTCollator:
    """Turns dataset items into a left-padded batch whose labels cover only the target.

    The prompt part of every row is exactly :func:`grounding_rl.prompts.preprocessing.build_inputs`' output (its
    non-padding tokens, in order); the target's ids are appended (tokenised on their own, which equals tokenising the
    whole text because the prompt ends with ``"assistant\\n"``, a pre-token boundary of the Qwen2 split regex).

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

    Returns (``__call__``):
        dict with ``input_ids``, ``attention_mask``, ``mm_token_type_ids``, ``labels`` (B, L) and
        the video tensors of the family (``pixel_values_videos``, ``video_grid_thw``; Qwen2.5-VL's
        ``second_per_grid_ts``) as from ``build_inputs``.
    """

    def __init__(self, processor, dataset, template: str = "default", video: VideoSettings = VideoSettings(),
                 think_text: str = DEFAULT_THINK, max_prompt_length: int | None = None, frame_cache=None,
                 video_layout: str = DEFAULT_VIDEO_LAYOUT):
        self.loader = VideoCollator(dataset, family_of(processor).video_settings(video), cache=frame_cache)
        self.processor = processor
        self.template = template
        self.video_layout = video_layout
        self.think_text = think_text
        self.max_prompt_length = max_prompt_length

    def __call__(self, rows: list[dict]) -> dict:
        tokenizer = self.processor.tokenizer
        rows = self.loader(rows)  # decoded; an unreadable clip is replaced by its substitute
        templates = [r.get("prompt_template") or self.template for r in rows]  # a row's own template wins
        prompt = build_inputs(self.processor, [r["query"] for r in rows], [r["clip"] for r in rows], templates,
                              video_layout=self.video_layout)
        targets = [(answer_text(r["start"], r["end"], self.think_text, t) if not r.get("spans") else
                    answer_set_text(r["spans"], self.think_text, t)) + tokenizer.eos_token
                   for r, t in zip(rows, templates)]
        target_ids = tokenizer(targets, add_special_tokens=False)["input_ids"]
        ids, mm, labels = [], [], []
        for i, row in enumerate(rows):
            keep = prompt["attention_mask"][i].bool()
            prompt_ids = prompt["input_ids"][i][keep]
            check_prompt_length(len(prompt_ids), self.max_prompt_length, f"sample {row['qid']} ({row['video']})")
            target = torch.tensor(target_ids[i], dtype=prompt_ids.dtype)
            ids.append(torch.cat([prompt_ids, target]))
            mm.append(torch.cat([prompt["mm_token_type_ids"][i][keep], torch.zeros_like(target)]))
            labels.append(torch.cat([torch.full_like(prompt_ids, IGNORE_INDEX), target]))
        length = max(len(x) for x in ids)
        pad_id = tokenizer.pad_token_id

        def left_pad(seqs, value):
            return torch.stack([torch.cat([torch.full((length - len(s),), value, dtype=s.dtype), s]) for s in seqs])

        batch = {
            "input_ids": left_pad(ids, pad_id),
            "attention_mask": left_pad([torch.ones_like(x) for x in ids], 0),
            "mm_token_type_ids": left_pad(mm, 0),
            "labels": left_pad(labels, IGNORE_INDEX),
        }
        for key in VIDEO_KEYS:
            if key in prompt:
                batch[key] = prompt[key]
        return batch


class GroundingSFTTrainer(ExactResumeMixin, GroundingSaveMixin, Trainer):
    """``transformers.Trainer`` whose checkpoints hold ``grounding_config.json`` and a model card."""

    stage = "SFT"
