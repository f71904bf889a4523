"""``grounding-rl sft --config X.yaml [--key value …]``: a supervised warm start on the answer format before GRPO.

Same entry layer as ``grounding-rl train`` (:mod:`grounding_rl.cli.common`): the same script arguments, config parser,
model loader, resume resolution and saved files; the training config is
:class:`grounding_rl.update.sft.GroundingSFTConfig`.
"""
from __future__ import annotations

import sys

from grounding_rl.cli import common


def main(argv: list[str] | None = None) -> int:
    from grounding_rl.update.sft import GroundingSFTConfig, GroundingSFTTrainer, SFTCollator

    script_args, args, model_args = common.parse_training_args(GroundingSFTConfig, argv, "grounding-rl sft")
    common.setup_logging(args)
    fingerprint = common.run_fingerprint(script_args, args, model_args)
    resume = common.resolve_resume(args, fingerprint)  # before any loading: a wrong checkpoint fails at once
    common.claim_output_dir(script_args, args, fingerprint, resume)  # one run per folder
    common.init_deepspeed_comm(args)
    dataset = common.load_dataset(script_args)
    common.warn_unlike_the_checkpoint(model_args, args)
    model, processor = common.load_training_model(script_args, model_args, args)
    collator = SFTCollator(processor, dataset, args.prompt_template, args.video_settings, args.think_text,
                           args.max_prompt_length, frame_cache=common.frame_cache(script_args),
                           video_layout=args.video_layout, crop_fraction=args.crop_trajectory_fraction,
                           max_turns=args.max_tool_calling_iterations, seed=args.seed)
    trainer = GroundingSFTTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator,
                                  processing_class=processor)
    trainer.fingerprint = fingerprint
    trainer.duration_filter = dataset.duration_filter  # saved in grounding_config.json
    return common.train_and_finish(trainer, resume, "grounding-rl sft")


if __name__ == "__main__":
    sys.exit(main())
