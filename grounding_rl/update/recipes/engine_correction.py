"""TRL 1.16's vLLM importance-sampling correction (:func:`grounding_rl.update.grpo.engine_importance_weights`): weights
π_old / π_engine on the surrogate loss, and their metrics (``sampling/sampling_logp_difference/{mean,max}``,
``sampling/importance_sampling_ratio/{min,mean,max}``)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from grounding_rl.update import grpo
from grounding_rl.update.arguments import trl_field
from grounding_rl.update.recipes.base import Recipe


@dataclass
class EngineCorrectionArguments:
    """TRL's names, defaults and help texts (read from ``trl.GRPOConfig``)."""

    vllm_importance_sampling_correction: bool = trl_field("vllm_importance_sampling_correction")
    vllm_importance_sampling_mode: str = trl_field(
        "vllm_importance_sampling_mode", note="Supported here: token_truncate, token_mask, sequence_truncate, "
        "sequence_mask.")
    vllm_importance_sampling_clip_max: float | None = trl_field("vllm_importance_sampling_clip_max")
    vllm_importance_sampling_clip_min: float | None = trl_field("vllm_importance_sampling_clip_min")


class EngineCorrection(Recipe):
    name = "vllm_importance_sampling"
    arguments = EngineCorrectionArguments

    @staticmethod
    def enabled(args, config) -> bool:
        return bool(config.use_vllm and args.vllm_importance_sampling_correction)

    @staticmethod
    def problems(args, config) -> list[str]:
        if config.use_vllm and args.vllm_importance_sampling_mode not in grpo.IMPORTANCE_SAMPLING_MODES:
            return [f"vllm_importance_sampling_mode {args.vllm_importance_sampling_mode!r} is not one of "
                    f"{grpo.IMPORTANCE_SAMPLING_MODES}"]
        return []

    def loss_inputs(self, context, rollout, batch) -> None:
        """``batch["importance_weights"]`` from its ``old_logps`` and the rollout's sampling log-probs (none when
        the engine gave none)."""
        if rollout.sampling_logps is None:
            return
        args, acc = self.args, context.accelerator
        out = grpo.engine_importance_weights(
            batch["old_logps"], rollout.sampling_logps.to(batch["old_logps"].device), batch["completion_mask"],
            args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_min,
            args.vllm_importance_sampling_clip_max)
        batch["importance_weights"] = out.weights
        stats = acc.gather(torch.tensor([[out.logp_difference_mean, out.logp_difference_max, out.ratio_min,
                                          out.ratio_mean, out.ratio_max]], device=acc.device))
        context.log("sampling/sampling_logp_difference/mean", stats[:, 0].mean().item())
        context.log("sampling/sampling_logp_difference/max", stats[:, 1].max().item())
        context.log("sampling/importance_sampling_ratio/min", stats[:, 2].min().item())
        context.log("sampling/importance_sampling_ratio/mean", stats[:, 3].mean().item())
        context.log("sampling/importance_sampling_ratio/max", stats[:, 4].max().item())
