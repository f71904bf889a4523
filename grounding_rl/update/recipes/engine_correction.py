"""TRL 1.16's vLLM importance-sampling correction (:func:`grounding_rl.update.grpo.engine_importance_weights`): weights
π_old / π_engine on the surrogate loss, and their metrics (``sampling/sampling_logp_difference/{mean,max}``,
``sampling/importance_sampling_ratio/{min,mean,max}``)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grounding_rl.update import grpo
from grounding_rl.update.recipes.base import Recipe


@dataclass
class EngineCorrectionArguments:
    vllm_importance_sampling_correction: bool = field(
        default=True,
        metadata={
            "help": "Whether to apply Importance Sampling (IS) to correct for the mismatch between vLLM "
            "completion logprobs and recomputed training logprobs. If set to `False`, no IS is applied "
            "regardless of `vllm_importance_sampling_mode`."
        },
    )
    vllm_importance_sampling_mode: str = field(
        default="sequence_mask",
        metadata={
            "help": "How IS is performed when vllm_importance_sampling_correction=True: 'token_truncate', "
            "'token_mask', 'sequence_truncate' or 'sequence_mask' (truncate: clip the ratio to [C_min, C_max]; "
            "mask: set ratios outside it to zero; token: one ratio per token; sequence: one per completion)."
        },
    )
    vllm_importance_sampling_clip_max: float | None = field(
        default=3.0,
        metadata={"help": "Importance sampling upper bound C_max used by `vllm_importance_sampling_mode`."},
    )
    vllm_importance_sampling_clip_min: float | None = field(
        default=None,
        metadata={"help": "Importance sampling lower bound C_min used by `vllm_importance_sampling_mode`."},
    )


class EngineCorrection(Recipe):
    name = "vllm_importance_sampling"
    arguments = EngineCorrectionArguments

    @staticmethod
    def enabled(args) -> bool:
        return bool(args.use_vllm and args.vllm_importance_sampling_correction)

    @staticmethod
    def problems(args) -> list[str]:
        if args.use_vllm and args.vllm_importance_sampling_mode not in grpo.IMPORTANCE_SAMPLING_MODES:
            return [f"vllm_importance_sampling_mode {args.vllm_importance_sampling_mode!r} is not one of "
                    f"{grpo.IMPORTANCE_SAMPLING_MODES}"]
        return []

    def loss_inputs(self, trainer, rollout, batch) -> None:
        """``batch["importance_weights"]`` from its ``old_logps`` and the rollout's sampling log-probs (none when
        the engine gave none)."""
        if rollout.sampling_logps is None:
            return
        args, acc = self.args, trainer.accelerator
        out = grpo.engine_importance_weights(
            batch["old_logps"], rollout.sampling_logps.to(batch["old_logps"].device), batch["completion_mask"],
            args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_min,
            args.vllm_importance_sampling_clip_max)
        batch["importance_weights"] = out.weights
        stats = acc.gather(torch.tensor([[out.logp_difference_mean, out.logp_difference_max, out.ratio_min,
                                          out.ratio_mean, out.ratio_max]], device=acc.device))
        metrics = trainer._metrics
        metrics["sampling/sampling_logp_difference/mean"].append(stats[:, 0].mean().item())
        metrics["sampling/sampling_logp_difference/max"].append(stats[:, 1].max().item())
        metrics["sampling/importance_sampling_ratio/min"].append(stats[:, 2].min().item())
        metrics["sampling/importance_sampling_ratio/mean"].append(stats[:, 3].mean().item())
        metrics["sampling/importance_sampling_ratio/max"].append(stats[:, 4].max().item())
