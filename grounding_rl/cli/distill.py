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

from grounding_rl.cli.train import run_trainer


def main(argv: list[str] | None = None) -> int:
    from grounding_rl.errors import UserError
    from grounding_rl.update.distill_config import DistillationConfig
    from grounding_rl.update.recipes import RECIPES

    if "distillation" not in RECIPES:
        raise UserError("the distillation recipe (grounding_rl/update/recipes/distillation.py) is not registered")

    return run_trainer(DistillationConfig, argv, "grounding-rl distill")


if __name__ == "__main__":
    sys.exit(main())
