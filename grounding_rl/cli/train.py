"""``grounding-rl train --config X.yaml [--key value …]``: GRPO training on a canonical JSONL of grounding samples.

Every knob is a field of :class:`grounding_rl.update.config.GroundingGRPOConfig` (TRL's ``GRPOConfig`` names),
:class:`grounding_rl.cli.common.GroundingScriptArguments` (data) or ``trl.ModelConfig`` (model, LoRA); the recipes in
``configs/`` show them in use. Multi-process runs go through ``scripts/train.sh`` (``accelerate launch``) or
``torchrun``.
"""
from __future__ import annotations

import sys
from collections import ChainMap

from grounding_rl.cli import common


def main(argv: list[str] | None = None) -> int:
    from grounding_rl.update.config import GroundingGRPOConfig

    return run_trainer(GroundingGRPOConfig, argv, "grounding-rl train")


def run_trainer(config_class, argv: list[str] | None, prog: str) -> int:
    """Parse ``config_class``'s arguments (GRPO's, or distillation's), check the run before any weights load, then
    build :class:`grounding_rl.update.trainer.GroundingGRPOTrainer` and train it. Shared by ``train`` and
    ``distill``."""
    script_args, training_args, model_args = common.parse_training_args(config_class, argv, prog)
    common.setup_logging(training_args)
    fingerprint = common.run_fingerprint(script_args, training_args, model_args)
    common.check_teacher(model_args, training_args)  # a distillation teacher's tokenizer, before any weights load
    resume = common.resolve_resume(training_args, fingerprint)  # before any loading: a wrong checkpoint fails at once
    common.claim_output_dir(script_args, training_args, fingerprint, resume)  # one run per folder
    common.init_deepspeed_comm(training_args)
    from grounding_rl.update.recipes import each
    from grounding_rl.update.trainer import GroundingGRPOTrainer

    dataset = common.load_dataset(script_args)
    warn_single_span_rewards(dataset, training_args.reward_funcs)
    common.warn_unlike_the_checkpoint(model_args, training_args)
    model, processor = common.load_training_model(script_args, model_args, training_args)
    trainer = GroundingGRPOTrainer(model, training_args, dataset, processor,
                                   frame_cache=common.frame_cache(script_args),
                                   max_missing_fraction=script_args.max_missing_fraction,
                                   **ChainMap(*each(training_args, "trainer_inputs", training_args, script_args)))
    trainer.fingerprint = fingerprint
    trainer.duration_filter = dataset.duration_filter  # saved in grounding_config.json
    return common.train_and_finish(trainer, resume, prog)


def warn_single_span_rewards(dataset, reward_funcs) -> str | None:
    """Warn (and return the message) when the training data has samples with several spans and ``reward_funcs`` use
    a single-span reward (``iou``, ``tiou``), which scores the spans' hull; the set rewards score the set."""
    several = sum(1 for s in dataset.samples if s.get("spans") and len(s["spans"]) > 1)
    single = [name for name in reward_funcs if name in ("iou", "tiou")]
    if not several or not single:
        return None
    message = (f"{several} of {len(dataset)} training samples have several spans; reward(s) {', '.join(single)} "
               "score their hull (first start to last end): use set_iou (or twass, r2twass, ngiou) to score the set")
    common.logger.warning(message)
    return message


if __name__ == "__main__":
    sys.exit(main())
