"""TempSamp-R1's reward shaping (:func:`grounding_rl.reward.shaping.tempsamp_shaping`) of the ``iou`` reward of every
completion, after the scores are gathered and before the weighted sum."""
from __future__ import annotations

from dataclasses import dataclass, field

from grounding_rl.update.recipes.base import Recipe


@dataclass
class RewardShapingArguments:
    reward_shaping: str = field(
        default="none",
        metadata={
            "help": "`tempsamp`: TempSamp-R1's non-linear shaping of the `iou` reward of every completion (before the "
            "weighted sum; grounding_rl.reward.shaping.tempsamp_shaping with its τ 0.8 and α 1.0, fixed), meant for "
            "`use_gt_injection`; `none`."
        },
    )


class TempSampShaping(Recipe):
    name = "tempsamp"
    arguments = RewardShapingArguments
    refused = {"distill": {"reward_shaping": "rewards are logged, not trained on"}}

    @staticmethod
    def enabled(args, config) -> bool:
        return args.reward_shaping == "tempsamp"

    @staticmethod
    def problems(args, config) -> list[str]:
        from grounding_rl.reward.shaping import SHAPINGS

        problems = []
        if args.reward_shaping not in SHAPINGS:
            problems.append(f"reward_shaping {args.reward_shaping!r} is not one of {SHAPINGS}")
        elif args.reward_shaping != "none" and "iou" not in config.reward_funcs:
            problems.append(f"reward_shaping {args.reward_shaping!r} shapes the 'iou' reward, which reward_funcs "
                            f"{config.reward_funcs} lacks")
        return problems

    def shape(self, context, rewards_per_func):
        """(N, F) rewards with the ``iou`` column shaped with TempSamp-R1's τ and α (a copy)."""
        from grounding_rl.reward.shaping import tempsamp_shaping

        rewards_per_func = rewards_per_func.clone()
        for j, name in enumerate(context.reward_func_names):
            if name == "iou":
                rewards_per_func[:, j] = tempsamp_shaping(rewards_per_func[:, j])
        return rewards_per_func
