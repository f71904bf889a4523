"""``grounding-rl distill --config X.yaml [--key value …]``: on-policy distillation of a grounding model into another.

The student (``model_name_or_path``) samples one completion per prompt through the same generation path as ``train``
(HF or vLLM); the teacher (``teacher_model_name_or_path``) scores every sampled token on the same frames through its own
processor; the loss is the per-token generalized JSD with TRL's ``beta``
(:class:`grounding_rl.update.distill_config.DistillationConfig`, :mod:`grounding_rl.update.recipes.distillation`).
Data, model, LoRA and video keys are ``train``'s, in the YAML or as flags; the output folder holds what ``train`` leaves
and is read by ``eval`` and ``infer`` unchanged.
"""
from __future__ import annotations

import sys

from grounding_rl.cli import common
from grounding_rl.cli.train import load_eval_samples


def main(argv: list[str] | None = None) -> int:
    from grounding_rl.update.distill_config import DistillationConfig

    script_args, training_args, model_args = common.parse_training_args(DistillationConfig, argv,
                                                                        "grounding-rl distill")
    common.setup_logging(training_args)
    fingerprint = common.run_fingerprint(script_args, training_args, model_args)
    common.check_teacher(model_args, training_args)  # a distillation teacher's tokenizer, before any weights load
    resume = common.resolve_resume(training_args, fingerprint)
    common.claim_output_dir(script_args, training_args, fingerprint, resume)
    common.init_deepspeed_comm(training_args)
    from grounding_rl.update.trainer import GroundingGRPOTrainer

    dataset = common.load_dataset(script_args)
    model, processor = common.load_training_model(script_args, model_args, training_args)
    eval_samples, eval_dropped = load_eval_samples(training_args, script_args)
    trainer = GroundingGRPOTrainer(model, training_args, dataset, processor,
                                   frame_cache=common.frame_cache(script_args),
                                   max_missing_fraction=script_args.max_missing_fraction,
                                   eval_dataset=eval_samples, eval_dropped=eval_dropped)
    trainer.stage, trainer.fingerprint = "distillation", fingerprint
    result = trainer.train(resume_from_checkpoint=resume)
    common.finish_training(trainer, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
