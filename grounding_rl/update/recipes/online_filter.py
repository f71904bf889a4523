"""Time-R1's online range filter: after each epoch, drop the samples whose mean IoU reward over that epoch's
completions is outside (low, high] (:class:`grounding_rl.data.selection.OnlineRangeFilter`). A sampler over the kept
samples (:func:`grounding_rl.data.dataset.filtered_repeat_sampler`), fed by every draw's scores; its state is saved in
every checkpoint as ``online_filter.json``."""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

import torch

from grounding_rl.update.arguments import data_seed
from grounding_rl.update.recipes.base import Recipe, range_problem

logger = logging.getLogger(__name__)

ONLINE_FILTER_FILE = "online_filter.json"


@dataclass
class OnlineFilterArguments:
    online_difficulty_range: list[float] | None = field(
        default=None,
        metadata={"help": "Online range filter [low, high]: after each epoch, drop the samples whose mean IoU reward "
                          "(the 'iou' reward, else 'tiou') over that epoch's completions is outside (low, high] "
                          "(Time-R1's per-epoch filtering, scripts/posttrain/train_rl_SF.sh: [0.0, 0.7]). Epochs keep "
                          "their length, cycling the kept samples. No scores needed. None = off."},
    )


class OnlineFilter(Recipe):
    """The filter is :attr:`filter`; ``data/online_*`` metrics after each epoch."""

    name = "online_filter"
    arguments = OnlineFilterArguments
    fingerprint_keys = ("online_difficulty_range",)
    refused = {"distill": {"online_difficulty_range": "no groups of rewards to filter on"}}
    switch = "online_difficulty_range"

    @staticmethod
    def problems(args, config) -> list[str]:
        return range_problem("online_difficulty_range", args.online_difficulty_range)

    def prepare_data(self, context, dataset):
        """Create the filter over the (offline-selected) training set.

        Raises:
            ValueError: the reward functions have neither ``iou`` nor ``tiou``.
        """
        from grounding_rl.data.selection import OnlineRangeFilter

        names = [n for n in ("iou", "tiou") if n in context.reward_func_names]
        if not names:
            raise ValueError(f"online_difficulty_range filters on the 'iou' (or 'tiou') reward, which reward_funcs "
                             f"{context.reward_func_names} do not have")
        self.column = context.reward_func_names.index(names[0])
        self.filter = OnlineRangeFilter(len(dataset), *self.args.online_difficulty_range)
        return dataset

    def sampler(self, context, dataset):
        from grounding_rl.data.dataset import filtered_repeat_sampler

        args, G = self.config, context.num_generations
        return filtered_repeat_sampler(data_source=dataset, selection=self.filter, mini_repeat_count=G,
                                       batch_size=args.generation_batch_size // G,
                                       repeat_count=args.num_iterations * args.steps_per_generation, seed=data_seed(args),
                                       on_advance=lambda counts: self._log(context, counts))

    def pool(self, context):
        return self.filter.active

    def observe(self, context, items, rewards_per_func, is_gt) -> None:
        """This draw's IoU rewards (all ranks' rows, in gather order); an injected row is not the policy's."""
        device = rewards_per_func.device
        indices = context.accelerator.gather(torch.tensor([it["index"] for it in items], device=device))
        sampled = ~is_gt.to(device)
        self.filter.observe(indices[sampled].tolist(), rewards_per_func[sampled, self.column].tolist())

    @staticmethod
    def _log(context, counts: dict) -> None:
        if context.accelerator.is_main_process:
            logger.info("online difficulty filter after epoch %(epoch)d: kept %(kept)d, dropped %(dropped)d "
                        "(%(dropped_low)d at or below the range, %(dropped_high)d above it), %(unscored)d unscored "
                        "and kept", counts)
        for key in ("kept", "dropped", "dropped_low", "dropped_high", "unscored"):
            context.log(f"data/online_{key}", float(counts[key]))

    def save(self, context, folder: str) -> None:
        with open(os.path.join(folder, ONLINE_FILTER_FILE), "w", encoding="utf-8") as handle:
            json.dump(self.filter.state_dict(), handle)

    def load(self, context, folder: str) -> None:
        """Raises UserError: the checkpoint has no ``online_filter.json`` or one for another training set or range."""
        from grounding_rl.errors import UserError

        path = os.path.join(folder, ONLINE_FILTER_FILE)
        if not os.path.isfile(path):
            raise UserError(f"{folder}: no {ONLINE_FILTER_FILE}; it was written without online_difficulty_range, "
                            "so it cannot resume a run with it")
        with open(path, encoding="utf-8") as handle:
            try:
                self.filter.load_state_dict(json.load(handle))
            except ValueError as err:
                raise UserError(f"{path}: {err}") from None
