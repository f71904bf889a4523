"""``grounding-rl sft``: a supervised warm start that teaches the answer format before GRPO (issue 5, point 3).

Each canonical sample becomes one chat turn: the prompt is exactly what GRPO, evaluation and inference use (frames from
:func:`grounding_rl.data.video.sample_frames`, text and video tensors from :func:`grounding_rl.preprocessing.build_inputs`
with the configured prompt template); the target is ``<think>{think_text}</think><answer>{start:.2f} to
{end:.2f}</answer><|im_end|>`` built from the ground truth (:func:`sft_target`). Only the target's tokens carry labels;
prompt, video and padding tokens are ``-100``. Training is ``transformers.Trainer`` with a small collator
(:class:`SFTCollator`): TRL's ``SFTTrainer`` builds its own prompt/completion tokenisation and video handling
(qwen-vl-utils sampling, no ``video_metadata``), which would not be our preprocessing.

Usage::

    grounding-rl sft --config configs/demo_sft.yaml [--learning_rate 1e-3 --max_steps 50 ...]

Every checkpoint and the output folder hold ``grounding_config.json`` (prompt template and video settings) so that
``grounding-rl train`` / ``eval`` / ``infer`` reuse the same preprocessing.
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import TrainerCallback, TrainingArguments

from grounding_rl.data.video import VideoSettings
from grounding_rl.preprocessing import GroundingConfig, PreprocessingArguments

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
DEFAULT_THINK = "The event is visible in the video, so I find when it starts and ends."


def sft_target(start: float, end: float, think: str = DEFAULT_THINK) -> str:
    """The supervised completion for a ground-truth interval (seconds), times with two decimals.

    >>> sft_target(3.5, 9.0, "x")
    '<think>x</think><answer>3.50 to 9.00</answer>'
    """
    return f"<think>{think}</think><answer>{start:.2f} to {end:.2f}</answer>"


@dataclass
class GroundingSFTConfig(TrainingArguments, PreprocessingArguments):
    """Configuration of ``grounding-rl sft``: ``transformers.TrainingArguments`` plus the data, prompt and video
    settings. The prompt/video field names are those of :class:`grounding_rl.update.config.GroundingGRPOConfig`, so
    one YAML block serves both stages. The model comes from ``trl.ModelConfig`` (``model_name_or_path``, ``dtype``,
    ``attn_implementation``, LoRA fields)."""

    # --- data
    train_file: str | None = field(
        default=None, metadata={"help": "Canonical JSONL of training samples (grounding-rl prepare / demo-data)."}
    )
    video_root: str | None = field(
        default=None, metadata={"help": "Folder for relative video paths (default: the JSONL file's folder)."}
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Use only the first N samples of train_file (quick runs); None = all."}
    )
    # --- target
    think_text: str = field(
        default=DEFAULT_THINK, metadata={"help": "Text inside <think></think> of every target (short and generic)."}
    )
    # --- model
    freeze_vision_tower: bool = field(default=False, metadata={"help": "Do not train the ViT and patch merger."})
    tiny_model: dict | str | None = field(
        default=None,
        metadata={"help": "A tiny random-weight model for CPU runs: {tokenizer: DIR, hidden_size: N, ...}; "
                          "scripts/demo.sh builds it at model_name_or_path when missing (grounding-rl tiny-model)."},
    )
    # --- TrainingArguments defaults changed for this task
    learning_rate: float = field(default=1e-5, metadata={"help": "The initial learning rate for AdamW."})
    logging_steps: float = field(default=10, metadata={"help": "Log every X update steps."})
    remove_unused_columns: bool | None = field(
        default=False, metadata={"help": "Kept False: the collator needs the raw sample fields."}
    )

    def __post_init__(self):
        super().__post_init__()
        problems = []
        if not self.train_file:
            problems.append("train_file is required")
        problems += self.preprocessing_problems()
        if problems:
            raise ValueError("invalid GroundingSFTConfig: " + "; ".join(problems))

    def grounding_config(self) -> GroundingConfig:
        """What GRPO, evaluation and inference must reuse (no rewards were used: ``reward_funcs`` is empty)."""
        return GroundingConfig(prompt_template=self.prompt_template, video=self.video_settings, reward_funcs=[],
                               reward_weights=None)


class SFTCollator:
    """Turns sample dicts into a left-padded batch whose labels cover only the target.

    The prompt part of every row is exactly :func:`grounding_rl.preprocessing.build_inputs`' output (its non-padding
    tokens, in order); the target's ids are appended (tokenised on their own, which equals tokenising the whole text
    because the prompt ends with ``"assistant\\n"``, a pre-token boundary of the Qwen2 split regex).

    Args:
        processor: a Qwen2.5-VL processor.
        template: prompt template name.
        video: frame-sampling settings.
        think_text: the ``<think>`` text of the targets.
        max_prompt_length: an error (naming the qid) when a prompt has more tokens; None = no check.
        dataset: the training :class:`grounding_rl.update.data.GroundingDataset` whose items (with ``index``) are
            collated; clips then load through :class:`grounding_rl.update.data.VideoCollator`, so an unreadable clip
            is replaced by a deterministic substitute and logged, as in GRPO. None: rows are decoded as given.

    Returns (``__call__``):
        dict with ``input_ids``, ``attention_mask``, ``mm_token_type_ids``, ``labels`` (B, L) and
        ``pixel_values_videos``, ``video_grid_thw``, ``second_per_grid_ts`` as from ``build_inputs``.
    """

    def __init__(self, processor, template: str = "default", video: VideoSettings = VideoSettings(),
                 think_text: str = DEFAULT_THINK, max_prompt_length: int | None = None, dataset=None):
        from grounding_rl.update.data import VideoCollator

        self.loader = VideoCollator(dataset, video) if dataset is not None else None
        self.processor = processor
        self.template = template
        self.video = video
        self.think_text = think_text
        self.max_prompt_length = max_prompt_length

    def __call__(self, rows: list[dict]) -> dict:
        from grounding_rl.data.video import sample_frames
        from grounding_rl.preprocessing import build_inputs

        tokenizer = self.processor.tokenizer
        if self.loader is not None:
            rows = self.loader(rows)  # decoded; an unreadable clip is replaced by its substitute
            videos = [r["clip"] for r in rows]
        else:
            videos = [sample_frames(r["video"], self.video) for r in rows]
        prompt = build_inputs(self.processor, [r["query"] for r in rows], videos, self.template)
        targets = [sft_target(r["start"], r["end"], self.think_text) + tokenizer.eos_token for r in rows]
        target_ids = tokenizer(targets, add_special_tokens=False)["input_ids"]
        ids, mm, labels = [], [], []
        for i, row in enumerate(rows):
            keep = prompt["attention_mask"][i].bool()
            prompt_ids = prompt["input_ids"][i][keep]
            if self.max_prompt_length is not None and len(prompt_ids) > self.max_prompt_length:
                raise ValueError(f"sample {row['qid']} ({row['video']}): prompt has {len(prompt_ids)} tokens > "
                                 f"max_prompt_length {self.max_prompt_length}; lower video_max_pixels / "
                                 f"video_total_pixels / video_fps or raise max_prompt_length")
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
        for key in ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
            batch[key] = prompt[key]
        return batch


class SaveGroundingConfigCallback(TrainerCallback):
    """Writes ``grounding_config.json`` into every checkpoint folder the Trainer saves."""

    def __init__(self, config: GroundingConfig):
        self.config = config

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                self.config.save(folder)
        return control


def load_model(model_args, args: GroundingSFTConfig):
    """The model to train, via :func:`grounding_rl.models.loading.load_policy` (the GRPO loader; remote code off),
    optionally with a frozen vision tower and LoRA (``trl.get_peft_config``).

    Raises:
        ValueError: ``model_name_or_path`` is not set, or an unknown ``dtype``.
    """
    from grounding_rl.models.loading import freeze_vision_tower, load_policy

    if not model_args.model_name_or_path:
        raise ValueError("model_name_or_path is required (a folder or hub id of a Qwen2.5-VL model)")
    model = load_policy(model_args.model_name_or_path, dtype=model_args.dtype,
                        attn_implementation=model_args.attn_implementation, revision=model_args.model_revision)
    if args.gradient_checkpointing:
        model.config.use_cache = False
    if args.freeze_vision_tower:
        freeze_vision_tower(model)
    if model_args.use_peft:
        from peft import get_peft_model
        from trl import get_peft_config

        model = get_peft_model(model, get_peft_config(model_args))
    return model


def train_sft(args: GroundingSFTConfig, model_args) -> Path:
    """Run the warm start and save model, processor and ``grounding_config.json`` into ``args.output_dir``.

    Args:
        args: training, data, prompt and video settings (paths already resolved).
        model_args: ``trl.ModelConfig``.

    Returns:
        the output folder.

    Raises:
        ValueError: no samples in ``train_file``; a prompt longer than ``max_prompt_length``.
        grounding_rl.data.video.VideoLoadError: a clip cannot be read (names the file).
    """
    from transformers import Trainer
    from transformers.trainer_utils import get_last_checkpoint

    from grounding_rl.data.samples import load_samples
    from grounding_rl.models.loading import load_processor
    from grounding_rl.update.data import GroundingDataset

    samples = load_samples(args.train_file, video_root=args.video_root)
    if args.max_train_samples is not None:
        samples = samples[: args.max_train_samples]
    if not samples:
        raise ValueError(f"{args.train_file}: no usable samples")
    processor = load_processor(model_args.model_name_or_path, revision=model_args.model_revision)
    model = load_model(model_args, args)
    grounding = args.grounding_config()
    dataset = GroundingDataset(samples)
    collator = SFTCollator(processor, args.prompt_template, args.video_settings, args.think_text,
                           args.max_prompt_length, dataset=dataset)
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator,
                      processing_class=processor, callbacks=[SaveGroundingConfigCallback(grounding)])
    resume = args.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("true", "last"):
        resume = get_last_checkpoint(args.output_dir)
        if resume is None:
            raise ValueError(f"resume_from_checkpoint: no checkpoint in {args.output_dir}")
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(args.output_dir)
    if trainer.is_world_process_zero():
        processor.save_pretrained(args.output_dir)
        grounding.save(args.output_dir)
    return Path(args.output_dir)


def parse_args(argv: list[str] | None = None):
    """``(GroundingSFTConfig, trl.ModelConfig)`` from ``--config X.yaml`` plus ``--key value`` overrides (unknown keys
    are an error); the config path and the paths in it (train_file, video_root, model_name_or_path, output_dir)
    resolve as in :func:`grounding_rl.paths.resolve_config_path`.

    Raises:
        ValueError: missing train_file, unknown prompt_template, contradictory video settings, unknown keys.
    """
    from trl import ModelConfig, TrlParser

    from grounding_rl.paths import resolve_config_path

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--config" in argv:  # configs name paths relative to the repository root
        i = argv.index("--config") + 1
        if i < len(argv):
            argv[i] = resolve_config_path(argv[i])
    parser = TrlParser((GroundingSFTConfig, ModelConfig), prog="grounding-rl sft")
    args, model_args = parser.parse_args_and_config(argv)
    args.train_file = resolve_config_path(args.train_file)
    args.video_root = resolve_config_path(args.video_root)
    args.output_dir = resolve_config_path(args.output_dir)
    model_args.model_name_or_path = resolve_config_path(model_args.model_name_or_path)
    return args, model_args


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args, model_args = parse_args(argv)
    out = train_sft(args, model_args)
    print(f"saved {out}")
    return 0
