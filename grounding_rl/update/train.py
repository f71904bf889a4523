"""``grounding-rl train --config X.yaml [--key value …]``: GRPO training on a canonical JSONL of grounding samples.

The YAML and the command line are parsed together by ``trl.TrlParser`` into three dataclasses: the script arguments
below, :class:`GroundingGRPOConfig` (TrainingArguments + GRPO knobs + video/prompt/reward settings) and TRL's
``ModelConfig`` (model path, dtype, LoRA via ``get_peft_config``). Unknown keys are an error. Multi-process runs go
through ``accelerate launch --config_file configs/accelerate/<ddp|zero2|zero3|zero3_offload>.yaml`` or ``torchrun``.
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field

from grounding_rl.paths import resolve_config_path

logger = logging.getLogger("grounding_rl.train")


@dataclass
class GroundingScriptArguments:
    """What to train on.

    Attributes:
        train_file: canonical JSONL (``grounding-rl prepare`` output); relative video paths resolve against
            ``video_root`` or the file's folder.
        video_root: folder holding the videos, or None.
        freeze_vision_tower: keep the vision encoder fixed (no gradients into it).
        max_train_samples: use only the first N samples (smoke runs), None = all.
        frame_cache_dir, frame_cache_gb: optional :class:`grounding_rl.data.cache.FrameCache` for decoded clips.
        tiny_model: used only by ``scripts/train.sh`` (:func:`grounding_rl.models.tiny.ensure_from_config`).
    """

    train_file: str = field(default=None, metadata={"help": "Canonical JSONL of training samples (required)."})
    video_root: str | None = field(default=None, metadata={"help": "Folder of the videos (relative paths)."})
    freeze_vision_tower: bool = field(default=False, metadata={"help": "Freeze the vision encoder."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Train on the first N samples only."})
    frame_cache_dir: str | None = field(
        default=None,
        metadata={"help": "Folder of an on-disk frame cache (decode each clip once across epochs); None = off."},
    )
    frame_cache_gb: float = field(default=20.0, metadata={"help": "Size bound of the frame cache in GB."})
    tiny_model: dict | str | None = field(
        default=None,
        metadata={"help": "A tiny random-weight model for CPU runs: {tokenizer: DIR, hidden_size: N, ...}; "
                          "scripts/train.sh builds it at model_name_or_path when missing (grounding-rl tiny-model)."},
    )


def parse_args(argv: list[str] | None):
    """(script_args, GroundingGRPOConfig, ModelConfig) from ``--config X.yaml`` plus overrides.

    Building the config first also sets up the process group and registers a DeepSpeed config, which ZeRO-3 needs
    before any model is loaded. Raises ValueError on missing or contradictory settings.
    """
    from trl import ModelConfig, TrlParser

    from grounding_rl.update.config import GroundingGRPOConfig

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--config" in argv:  # configs name paths relative to the repository root
        i = argv.index("--config") + 1
        argv[i] = resolve_config_path(argv[i])
    parser = TrlParser((GroundingScriptArguments, GroundingGRPOConfig, ModelConfig), prog="grounding-rl train")
    script_args, training_args, model_args = parser.parse_args_and_config(argv)
    if not script_args.train_file:
        raise ValueError("train_file is required (a canonical JSONL)")
    if not model_args.model_name_or_path:
        raise ValueError("model_name_or_path is required")
    script_args.train_file = resolve_config_path(script_args.train_file)
    script_args.video_root = resolve_config_path(script_args.video_root)
    model_args.model_name_or_path = resolve_config_path(model_args.model_name_or_path)
    training_args.output_dir = resolve_config_path(training_args.output_dir)
    return script_args, training_args, model_args


def init_deepspeed_comm(training_args) -> None:
    """Hand an existing process group to DeepSpeed before any model loads.

    With ``use_cpu`` (gloo) the process group is created by accelerate's ``PartialState`` while building the
    TrainingArguments, but ``deepspeed.comm`` stays uninitialised, so ZeRO-3's ``zero.Init`` inside
    ``from_pretrained`` would see a world size of 1 and reject the batch sizes. No-op without DeepSpeed.
    """
    if not (training_args.deepspeed or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"):
        return
    import deepspeed
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and not deepspeed.comm.is_initialized():
        deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    script_args, training_args, model_args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if training_args.process_index == 0 else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from transformers.trainer_utils import get_last_checkpoint
    from trl import get_peft_config

    from grounding_rl.models.loading import freeze_vision_tower, load_policy, load_processor
    from grounding_rl.update.data import GroundingDataset
    from grounding_rl.update.trainer import GroundingGRPOTrainer

    init_deepspeed_comm(training_args)
    dataset = GroundingDataset.from_jsonl(script_args.train_file, video_root=script_args.video_root)
    if script_args.max_train_samples:
        dataset = GroundingDataset(dataset.samples[: script_args.max_train_samples])
    logger.info("%d training samples from %s", len(dataset), script_args.train_file)
    model = load_policy(model_args.model_name_or_path, dtype=model_args.dtype,
                        attn_implementation=model_args.attn_implementation, revision=model_args.model_revision)
    processor = load_processor(model_args.model_name_or_path, revision=model_args.model_revision)
    if script_args.freeze_vision_tower:
        freeze_vision_tower(model)
    cache = None
    if script_args.frame_cache_dir:
        from grounding_rl.data.cache import FrameCache

        cache = FrameCache(resolve_config_path(script_args.frame_cache_dir), int(script_args.frame_cache_gb * 1e9))
    trainer = GroundingGRPOTrainer(model, training_args, dataset, processor, peft_config=get_peft_config(model_args),
                                   frame_cache=cache)

    resume = training_args.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("true", "last"):
        resume = get_last_checkpoint(training_args.output_dir)
        if resume is None:
            raise ValueError(f"resume_from_checkpoint: no checkpoint in {training_args.output_dir}")
    result = trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(training_args.output_dir)
    if trainer.is_world_process_zero():
        logger.info("done: %s; model and grounding_config.json in %s", result.metrics, training_args.output_dir)
    # leave together: a rank exiting while another still tears down its communicator can abort at interpreter exit
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
