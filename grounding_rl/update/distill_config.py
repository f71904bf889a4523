"""``DistillationConfig``: on-policy distillation (``grounding-rl distill``) with TRL 1.16's names.

TRL's ``DistillationConfig`` (``trl/trainer/distillation_config.py``) names the teacher ``teacher_model_name_or_path``
/ ``teacher_model_init_kwargs``, the divergence ``beta`` (0 forward KL, 0.5 JSD, 1 reverse KL; default 1), and shares
``temperature``, ``max_completion_length``, ``use_vllm``, ``vllm_mode`` with GRPO; it is fully on-policy with one
completion per prompt. Here it is :class:`~grounding_rl.update.config.GroundingGRPOConfig` with ``beta`` read as the
divergence's, one completion per prompt (every advantage is then 0: the GRPO surrogate carries no gradient) and the
teacher term (:mod:`grounding_rl.update.recipes.distillation`) at weight 1; the data, model, video and logging keys
are train's. Where it differs from TRL: ``loss_top_k`` (TRL's server-distillation knob) defaults to 0, the full shared
vocabulary; GKD's ``lmbda`` (the on-policy share) is not taken (always fully on-policy, TRL's stable trainer);
``learning_rate``, ``bf16`` and ``gradient_checkpointing`` keep train's defaults; the rewards are still scored, for the
logs only.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from trl import DistillationConfig as TRLDistillationConfig

from grounding_rl.update.arguments import trl_field
from grounding_rl.update.config import GroundingGRPOConfig

# GRPO-only settings: distill refuses a value other than the default (their GRPO meaning has no use here); the
# recipes' own are declared in their modules (Recipe.refused) and checked with them
GRPO_ONLY = {
    "epsilon": "no surrogate to clip (every advantage is 0)", "epsilon_high": "no surrogate to clip",
    "use_bias_correction_kl": "no KL to a reference model", "num_iterations": "fully on-policy (TRL's stable trainer)",
}


@dataclass
class DistillationConfig(GroundingGRPOConfig):
    """Configuration of ``grounding-rl distill`` (see the module docstring)."""

    beta: float = trl_field("beta", source=TRLDistillationConfig)  # its help names GRPO's other meaning
    num_generations: int = trl_field(
        "num_generations", default=1, note="Distillation: one completion per prompt, as TRL's DistillationTrainer; "
        "no other value.")
    scale_rewards: str = trl_field("scale_rewards", default="none",
                                   note="Distillation: none (one completion per prompt has no std to scale by).")

    min_generations = 1
    stage = "distill"

    def __post_init__(self):
        defaults = {f.name: f.default for f in fields(GroundingGRPOConfig)}
        problems = [f"{name} {getattr(self, name)!r} is refused by distill: {why}" for name, why in GRPO_ONLY.items()
                    if getattr(self, name) != defaults[name]]
        if self.num_generations != 1:
            problems.append(f"num_generations must be 1 for distill (got {self.num_generations}): one completion per "
                            "prompt, as TRL's DistillationTrainer")
        if self.scale_rewards not in ("none", False, "false"):
            problems.append(f"scale_rewards must be none for distill (got {self.scale_rewards!r})")
        if not 0.0 <= self.beta <= 1.0:
            problems.append(f"beta must be in [0, 1] (got {self.beta}): 0 forward KL, 0.5 JSD, 1 reverse KL")
        if problems:
            raise ValueError("invalid DistillationConfig: " + "; ".join(problems))
        super().__post_init__()
