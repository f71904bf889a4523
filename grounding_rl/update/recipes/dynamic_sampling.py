"""DAPO's dynamic sampling (arXiv 2503.14476, Algorithm 1), with the groups kept over the global batch as verl's
recipe keeps them (``recipe/dapo/dapo_ray_trainer.py``: ``filter_groups``, ``max_num_gen_batches``).

Draw after draw, the groups with non-zero reward std of *all* processes are collected (every process sees the
gathered rewards, so the list is the same everywhere), until one generation batch's worth is held or
``max_num_gen_batches`` batches were drawn. The first ``generation_batch_size / G`` kept groups in draw order are
trained on, a shortfall filled with zero-std groups of the first draw (masked out of the loss); process r trains on
the r-th share of that list, its rows gathered from whichever process drew them. Under ``scale_rewards: batch`` a
group's std is that of the draw it came from.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from accelerate.utils import gather_object

from grounding_rl.update import batching, grpo
from grounding_rl.update.recipes.base import Recipe
from grounding_rl.update.rollout import Rollout, timed


@dataclass
class DynamicSamplingArguments:
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "DAPO's dynamic sampling (arXiv 2503.14476, Algorithm 1): groups whose G rewards are all equal "
            "carry no gradient, so further generation batches are drawn until the processes together hold as many "
            "groups with non-zero reward std as one generation batch has, or `max_num_gen_batches` batches were "
            "drawn; the kept groups are chosen over the global batch (verl's recipe), the same on every process; "
            "surplus groups are discarded, and a shortfall is filled with zero-std groups that are masked out of the "
            "loss. All processes draw the same number of batches, so ZeRO-3 never waits. Needs each process's rows "
            "(per_device_train_batch_size × steps_per_generation) to hold whole groups. Extra batches are drawn at "
            "random from the training set, seeded by the step."
        },
    )
    max_num_gen_batches: int = field(
        default=4,
        metadata={
            "help": "With `dynamic_sampling`: at most this many generation batches per generation, the first "
            "included (verl's `algorithm.filter_groups.max_num_gen_batches`, used by DAPO's recipe; ≥ 1)."
        },
    )


def extra_generation_batch(context, config, draw: int) -> list[dict]:
    """This process's share of the ``draw``-th extra generation batch of this step: generation_batch_size / G clips
    drawn without replacement (with replacement from a smaller set) from the samples the recipes allow
    (:meth:`Recipe.pool`, e.g. those the online filter keeps), G rows each, the same on every process (seeded by the
    run's seed (``config``), the global step and ``draw``, so a resumed run draws the same)."""
    pools = [p for p in (recipe.pool(context) for recipe in context.recipes) if p is not None]
    pool = pools[0] if pools else list(range(len(context.train_dataset)))
    G, size = context.num_generations, len(pool)
    groups = config.generation_batch_size // G
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + context.state.global_step * 1_009 + draw)
    picks = (torch.randperm(size, generator=generator)[:groups] if size >= groups
             else torch.randint(size, (groups,), generator=generator))
    rows = [pool[i] for i in picks.repeat_interleave(G).tolist()]
    acc = context.accelerator
    local = len(rows) // acc.num_processes
    mine = rows[acc.process_index * local:(acc.process_index + 1) * local]
    return context.data_collator([context.train_dataset[i] for i in mine])


def group_order(context, rollout: Rollout) -> tuple[list[int], list[int]]:
    """``(ids, kept)``: the ids of all the rollout's groups and of those whose rewards are not all equal
    (:func:`grpo.kept_groups`), over every process's rows, in the order of their first row (the same lists on every
    process)."""
    acc = context.accelerator
    ids = acc.gather(rollout.group_ids)
    return list(dict.fromkeys(ids.tolist())), grpo.kept_groups(acc.gather(rollout.zero_std), ids)


def gathered(context, rollout: Rollout) -> dict:
    """Every process's rows of ``rollout``, field by field (completions padded to the widest process's; items
    without their clip)."""
    acc, pad = context.accelerator, context.pad_token_id
    fill = {"completion_ids": pad, "completion_mask": 0, "sampling_logps": float("nan")}
    out = {}
    for name in ("completion_ids", "completion_mask", "lengths", "truncated", "placeholder_cut", "rewards_per_func",
                 "rewards", "advantages", "zero_std", "scale_zero_std", "group_ids", "is_gt", "sampling_logps"):
        value = getattr(rollout, name)
        if value is not None and name in fill:
            value = acc.pad_across_processes(value, dim=1, pad_index=fill[name])
        out[name] = None if value is None else acc.gather(value)
    out["texts"] = gather_object(rollout.texts)
    out["items"] = gather_object([{k: v for k, v in item.items() if k != "clip"} for item in rollout.items])
    keys = sorted(set(gather_object(sorted(rollout.extra))))
    out["extra"] = {key: gather_object(rollout.extra.get(key, [None] * len(rollout))) for key in keys}
    return out


class DynamicSampling(Recipe):
    """``dynamic_sampling/gen_batches`` (draws this step), ``groups_drawn``, ``groups_dropped`` (drawn − trained
    with spread), ``groups_filled`` (zero-std fill), all processes together."""

    name = "dynamic_sampling"
    arguments = DynamicSamplingArguments
    refused = {"distill": {"dynamic_sampling": "no groups to filter", "max_num_gen_batches": "no groups to filter"}}
    drops_zero_std_groups = True
    switch = "dynamic_sampling"

    @staticmethod
    def problems(args, config) -> list[str]:
        problems = [f"max_num_gen_batches must be ≥ 1 (got {args.max_num_gen_batches})"] \
            if args.max_num_gen_batches < 1 else []
        if args.dynamic_sampling and (config.generation_batch_size // config.world_size) % config.num_generations:
            problems.append(f"dynamic_sampling needs whole groups on every process: per_device_train_batch_size "
                            f"{config.per_device_train_batch_size} × steps_per_generation {config.steps_per_generation}"
                            f" must be divisible by num_generations ({config.num_generations})")
        return problems

    def resample(self, context, rollout, draw):
        """The rollout to train on; ``draw(items, group_offset)`` builds one more (:func:`build_rollout`)."""
        acc, G = context.accelerator, context.num_generations
        total = self.config.generation_batch_size // G
        first, kept = group_order(context, rollout)
        draws, kept = [rollout], [(0, g) for g in kept]
        while len(draws) < self.args.max_num_gen_batches and len(kept) < total:
            with timed(context, "dynamic_sampling"):
                extra = draw(extra_generation_batch(context, self.config, len(draws)), len(draws) * total)
            kept += [(len(draws), g) for g in group_order(context, extra)[1]]
            draws.append(extra)
        chosen = kept[:total]
        filled = total - len(chosen)
        chosen += [(0, g) for g in first if (0, g) not in chosen][:filled]
        context.log("dynamic_sampling/gen_batches", float(len(draws)))
        context.log("dynamic_sampling/groups_drawn", float(len(draws) * total))
        context.log("dynamic_sampling/groups_dropped", float(len(draws) * total - (total - filled)))
        context.log("dynamic_sampling/groups_filled", float(filled))
        if len(draws) == 1 and chosen == [(0, g) for g in first]:
            return rollout
        local_groups = len(rollout) // G
        mine = chosen[acc.process_index * local_groups:(acc.process_index + 1) * local_groups]
        return self._rows(context, draws, mine)

    def _rows(self, context, draws: list[Rollout], mine: list[tuple[int, int]]) -> Rollout:
        acc = context.accelerator
        views = [Rollout(batch=None, **gathered(context, d)) for d in draws]
        rows = [(d, r) for d, gid in mine for r in (views[d].group_ids == gid).nonzero().flatten().tolist()]
        offsets = [sum(map(len, views[:d])) for d in range(len(views))]
        picked = Rollout.concat(views, lambda items: None, context.pad_token_id).select([offsets[d] + r for d, r in rows])
        start = acc.process_index * len(draws[0])
        items = []
        for d, r in rows:  # a row this process drew keeps its decoded clip; another's is decoded again here
            local = r - start
            items.append(dict(draws[d].items[local]) if 0 <= local < len(draws[d]) else
                         context.data_collator.load_item(views[d].items[r]["index"]))
        return replace(picked, items=items, batch=batching.config_prompt_batch(context.processing_class, items,
                                                                               self.config, acc.device))
