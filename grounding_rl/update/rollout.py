"""The typed rollout of one generation batch, and the public function that builds it.

:func:`build_rollout` runs the four stages of one draw, each a small function: :func:`sample` (prompt tensors, then the
rollout engine), :func:`sanitise` (cut sampled vision placeholders, injected rows, completion mask), :func:`score`
(every reward function with what TRL 1.16's ``_calculate_rewards`` passes; gathered across processes) and
the advantages (weighted sum, :func:`grounding_rl.update.grpo.group_advantages`). Recipes
(:mod:`grounding_rl.update.recipes`) hook into it by name; nothing here branches on a recipe's config field.

Shapes: B rows on this process (the generation batch's share, whole or split groups), C completion tokens, F reward
functions, N = B × processes. Groups are identified by :attr:`Rollout.group_ids` (verl's ``uid``,
``compute_grpo_outcome_advantage(…, index)``), not by position, so rows can be selected, concatenated and shuffled.
Model: torchtune's ``GRPOTrajectory`` (``torchtune/dev/grpo/types.py``), one record for what a generation produced.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace

import torch
import torch.nn.functional as F
from accelerate.utils import gather_object

from grounding_rl.data.missing import check_fraction
from grounding_rl.prompts.preprocessing import check_prompt_length
from grounding_rl.reward.rewards import weighted_rewards
from grounding_rl.rollout.generation import completion_mask, cut_at_tokens
from grounding_rl.update import batching, grpo


@dataclass
class Rollout:
    """What one generation batch produced on this process, row-aligned (B rows).

    Attributes:
        items: B collated items (dataset columns, ``index``, the decoded ``clip``).
        batch: prompt tensors on the device (:func:`grounding_rl.update.batching.prompt_batch`), B rows.
        completion_ids: (B, C) long, padded with the pad token.
        completion_mask: (B, C) int, 1 for tokens that count in the loss (up to EOS, before a cut; 0 for a truncated
            row with ``mask_truncated_completions``).
        lengths: (B,) long, completion tokens before ``mask_truncated_completions``.
        truncated: (B,) bool, no EOS within the completion (or cut).
        placeholder_cut: (B,) bool, the engine sampled a vision placeholder and the row was cut before it.
        texts: B decoded completions.
        rewards_per_func: (B, F) float32 as trained on (after any shaping); NaN where a function returned None.
        rewards: (B,) weighted total (``reward_weights``).
        advantages: (B,) float32.
        zero_std: (B,) bool, the row's group has G equal rewards (:attr:`grpo.Advantages.group_zero_std`).
        scale_zero_std: (B,) bool, the std that scaled the row is 0 (TRL's ``frac_reward_zero_std``).
        group_ids: (B,) long, one id per group of G rows, unique within a generation step.
        is_gt: (B,) bool, the row holds an injected ground-truth answer (not sampled).
        sampling_logps: (B, C) float32, the engine's own log-probs of the sampled tokens (NaN where it sampled
            none), or None for an engine without them.
        extra: columns a reward function logged with ``log_extra``, one value per row (None where absent).
    """

    items: list[dict]
    batch: dict
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    lengths: torch.Tensor
    truncated: torch.Tensor
    placeholder_cut: torch.Tensor
    texts: list[str]
    rewards_per_func: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    zero_std: torch.Tensor
    scale_zero_std: torch.Tensor
    group_ids: torch.Tensor
    is_gt: torch.Tensor
    sampling_logps: torch.Tensor | None = None
    extra: dict[str, list] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.items)

    def select(self, rows: list[int]) -> Rollout:
        """A rollout of ``rows`` (in that order, repeats allowed); pixel patches follow their rows."""
        index = torch.as_tensor(rows, dtype=torch.long)
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "batch":
                out[f.name] = None if value is None else batching.select_rows(value, rows)
            elif isinstance(value, torch.Tensor):
                out[f.name] = value[index.to(value.device)]
            elif isinstance(value, dict):
                out[f.name] = {key: [column[r] for r in rows] for key, column in value.items()}
            elif isinstance(value, list):
                out[f.name] = [value[r] for r in rows]
            else:
                out[f.name] = value
        return replace(self, **out)

    @staticmethod
    def concat(parts: list[Rollout], prompt_batch, pad_token_id: int) -> Rollout:
        """The rows of ``parts`` one after another. ``prompt_batch(items) -> batch`` rebuilds the prompt tensors
        (their padding and shared clips differ between parts); completions are widened to the widest part with
        ``pad_token_id`` (mask 0, sampling log-prob NaN)."""
        if len(parts) == 1:
            return parts[0]
        width = max(part.completion_ids.size(1) for part in parts)
        widen = {"completion_ids": pad_token_id, "completion_mask": 0, "sampling_logps": float("nan")}
        out = {}
        for f in fields(Rollout):
            values = [getattr(part, f.name) for part in parts]
            if f.name == "batch":
                continue
            if f.name == "extra":
                keys = sorted({key for value in values for key in value})
                out[f.name] = {key: [v for part, value in zip(parts, values)
                                     for v in value.get(key, [None] * len(part))] for key in keys}
            elif isinstance(values[0], torch.Tensor):
                if f.name in widen:
                    values = [F.pad(v, (0, width - v.size(1)), value=widen[f.name]) for v in values]
                out[f.name] = torch.cat(values)
            elif values[0] is None:
                out[f.name] = None
            else:
                out[f.name] = [v for value in values for v in value]
        return Rollout(batch=prompt_batch(out["items"]), **out)


# ---------------------------------------------------------------------------------------------------------- timing
@contextmanager
def timed(trainer, phase: str):
    """Add the seconds the block takes to ``trainer.timings[phase]`` (summed over one generation; logged as
    ``timing/<phase>``, verl's ``marked_timer`` in ``RayPPOTrainer.fit``)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        trainer.timings[phase] += time.perf_counter() - start


# ---------------------------------------------------------------------------------------------------------- stages
def sample(trainer, items: list[dict], generate=None) -> tuple[dict, torch.Tensor, torch.Tensor | None]:
    """Prompt tensors of ``items`` and one sampled completion per row: by the rollout engine's batched call, or by
    ``generate(items)`` → (B, C) ids when given (the two-pass zoom's turn 2, :func:`conversation_turns`).

    Returns:
        ``(batch, completion_ids (B, C), sampling_logps (B, C) or None)``; the batch is on the device.

    Raises:
        ValueError: a prompt is longer than ``max_prompt_length`` (prompts are never truncated).
    """
    args, engine = trainer.args, trainer.rollout_engine
    batch = batching.config_prompt_batch(trainer.processing_class, items, args, trainer.accelerator.device)
    for length, item in zip(batch["prompt_mask"].sum(dim=1).tolist(), items):  # never truncated
        check_prompt_length(length, args.max_prompt_length,
                            f"sample {item['index']} (qid {item['qid']}, {item['video']})")
    if generate is not None:
        return batch, generate(items).to(batch["prompt_ids"].device), None
    model = trainer.model_wrapped
    if hasattr(engine, "sync_weights"):  # vLLM: the policy's weights first, timed apart
        with timed(trainer, "sync_weights"):
            engine.sync_weights(model)
        model = None
    with timed(trainer, "generate"):
        completion_ids = engine.generate(model, batching.generation_inputs(batch, items), trainer.sampling)
    return batch, completion_ids, getattr(engine, "sampling_logps", None)


@contextmanager
def conversation_turns(context, config, sampling):
    """The rollout engine's conversation interface, ``continue_turn(trajectories, sampling)``
    (:mod:`grounding_rl.rollout.conversation`), for the turns of one rollout: the engine's own where it has one
    (vLLM, once the policy's weights are synced), or :class:`grounding_rl.rollout.conversation.HFTurns` on the
    policy unwrapped for generation (ZeRO-3 parameters gathered with ``ds3_gather_for_generation``; each distinct
    clip or window encoded once). ``context``: the hook's
    :class:`grounding_rl.update.recipes.base.StepContext`; ``config``: the training config. Yields ``(turns,
    sampling)``: on transformers ``sampling`` as given, on vLLM the context's own. Timed as ``generate``."""
    from trl.models import unwrap_model_for_generation

    from grounding_rl.rollout import conversation as conv

    engine = context.rollout_engine
    if hasattr(engine, "continue_turn"):  # vLLM: the policy's weights once per rollout, every turn on the engine
        if hasattr(engine, "sync_weights"):
            with timed(context, "sync_weights"):
                engine.sync_weights(context.model_wrapped)
        with timed(context, "generate"):
            yield engine, context.sampling
        return
    with timed(context, "generate"), unwrap_model_for_generation(
            context.model_wrapped, context.accelerator, gather_deepspeed3_params=config.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=config.gradient_checkpointing_kwargs) as unwrapped:
        yield conv.HFTurns(unwrapped, context.pad_token_id), sampling


def sanitise(trainer, items: list[dict], completion_ids: torch.Tensor, sampling_logps: torch.Tensor | None,
             start: int) -> dict:
    """Make sampled completions safe to train on: cut each before a sampled vision placeholder (it would break every
    later forward), let recipes replace rows (:meth:`Recipe.inject`), then the completion mask.

    Args:
        completion_ids: (B, C) as sampled. sampling_logps: (B, C) or None. start: global index of the first row.

    Returns:
        ``completion_ids``, ``completion_mask``, ``lengths``, ``truncated``, ``placeholder_cut``, ``is_gt``,
        ``sampling_logps`` (see :class:`Rollout`).
    """
    device, eos = completion_ids.device, trainer.eos_token_ids
    sampled, keep = cut_at_tokens(completion_ids, trainer.placeholder_ids, trainer.pad_token_id)
    placeholder_cut = (completion_mask(completion_ids, eos)[0] * (1 - keep)).bool().any(dim=1)
    is_gt = torch.zeros(len(items), dtype=torch.bool, device=device)
    completion_ids = sampled
    context = trainer.step_context()
    for recipe in trainer.recipes:
        replaced = recipe.inject(context, items, completion_ids, start)
        if replaced is not None:
            completion_ids, rows = replaced
            is_gt = is_gt | rows
    if sampling_logps is not None:  # not sampled by the engine (injected, or past its width): NaN = no correction
        sampling_logps = F.pad(sampling_logps.float(), (0, completion_ids.size(1) - sampling_logps.size(1)),
                               value=float("nan"))
        sampling_logps[is_gt] = float("nan")
    mask, truncated = completion_mask(completion_ids, eos)
    # positions past the sampled width (an injected answer widened the batch) were never sampled
    keep = F.pad(keep, (0, completion_ids.size(1) - keep.size(1)), value=0)
    keep[is_gt] = 1
    beyond = (mask * (1 - keep)).bool().any(dim=1)  # the mask ran past a cut or the sampled width: no EOS there
    mask, truncated = mask * keep, truncated | beyond
    lengths = mask.sum(dim=1)
    if trainer.args.mask_truncated_completions:
        mask = mask * (~truncated).unsqueeze(1).int()
    return {"completion_ids": completion_ids, "completion_mask": mask, "lengths": lengths, "truncated": truncated,
            "placeholder_cut": placeholder_cut, "is_gt": is_gt, "sampling_logps": sampling_logps}


def reward_columns(trainer, items: list[dict], completion_ids: list[list[int]]) -> dict:
    """The keyword arguments of every reward function, as TRL 1.16's ``_calculate_rewards`` builds them: every dataset
    column as a list (one entry per completion; the decoded ``clip`` left out), ``prompt_template``,
    ``completion_ids``, ``trainer_state`` (the ``TrainerState``), ``log_metric(name, value)`` (a scalar, averaged over
    processes and the logging window) and ``log_extra(column, values)`` (one value per completion, written with the
    logged completions)."""
    keys = [key for key in items[0] if key not in ("clip", "answer_origin")] if items else []
    columns = {key: [item.get(key) for item in items] for key in keys}
    columns["prompt_template"] = [item.get("prompt_template") or trainer.args.prompt_template for item in items]
    columns["completion_ids"] = completion_ids
    columns["trainer_state"] = trainer.state
    columns["log_metric"] = lambda name, value: trainer.pending_metrics[name].append(float(value))
    columns["log_extra"] = lambda column, values: trainer.pending_extra[column].extend(values)
    return columns


def answer_spans(texts: list[str], origins: list[float]) -> list[tuple[float, float] | None]:
    """Each text's parsed answer in the video's seconds, its row's ``origin`` added
    (:func:`grounding_rl.rollout.zoom.to_absolute`, :class:`grounding_rl.rollout.zoom.ZoomEnvironment`'s origin); None
    when it does not parse. E.g. "2.00 to 5.50" with 30.25 → (32.25, 35.75)."""
    from grounding_rl.prompts.parsing import parse_answer
    from grounding_rl.rollout.zoom import to_absolute

    return [to_absolute(parse_answer(text), origin) for text, origin in zip(texts, origins)]


def score(trainer, items: list[dict], texts: list[str], completion_ids: torch.Tensor,
          lengths: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Every reward function on this process's completions.

    Returns:
        ``(rewards_per_func, extra)``: (B, F) float32 on the device, NaN where a function returned None; ``extra``
        the ``log_extra`` columns, B values each.

    Raises:
        UserError: a reward function returned another number of values than completions (named).
    """
    from grounding_rl.errors import UserError

    ids = [row[:n] for row, n in zip(completion_ids.tolist(), lengths.tolist())]
    columns = reward_columns(trainer, items, ids)
    if items and "answer_origin" in items[0]:  # answers in a window's time: every reward sees the video's seconds
        columns["answer_span"] = answer_spans(texts, [item["answer_origin"] for item in items])
    per_func = torch.full((len(items), len(trainer.reward_funcs)), float("nan"))
    for j, (func, name) in enumerate(zip(trainer.reward_funcs, trainer.reward_func_names)):
        values = list(func(completions=texts, **columns))
        if len(values) != len(texts):
            raise UserError(f"reward function {name!r} returned {len(values)} values for {len(texts)} completions; "
                            "it must return one per completion (None to skip one)")
        per_func[:, j] = torch.tensor([float("nan") if v is None else float(v) for v in values])
    extra = {key: list(values) for key, values in trainer.pending_extra.items()}
    trainer.pending_extra.clear()
    for key, values in extra.items():
        if len(values) != len(texts):
            raise UserError(f"log_extra column {key!r} got {len(values)} values for {len(texts)} completions")
    return per_func.to(completion_ids.device), extra


def account_items(trainer, items: list[dict]) -> None:
    """Count substituted (unreadable) samples, all processes together (``data/skipped_samples``, a running count).

    Raises:
        UserError: more than ``max_missing_fraction`` of the distinct videos turned out unreadable.
    """
    acc = trainer.accelerator
    skipped = len({it["substituted_from"] for it in items if it.get("substituted_from") is not None})
    trainer.skipped_total += int(acc.gather(torch.tensor([skipped], device=acc.device)).sum().item())
    trainer._metrics["data/skipped_samples"].append(float(trainer.skipped_total))
    failed = gather_object([it["substituted_from"] for it in items if it.get("substituted_from") is not None])
    trainer.unreadable_videos.update(trainer.train_dataset.samples[i]["video"] for i in failed)
    check_fraction(sorted(trainer.unreadable_videos), trainer.num_videos, trainer.max_missing_fraction,
                   "training: unreadable", "check the videos (grounding-rl prepare --video-root lists them)")


def flush_reward_metrics(trainer) -> None:
    """Average what reward functions logged with ``log_metric`` over processes into the trainer's metrics (TRL 1.16:
    names sorted so every process gathers in the same order)."""
    acc = trainer.accelerator
    if acc.num_processes == 1 and not trainer.pending_metrics:
        return
    for name in sorted(set(gather_object(list(trainer.pending_metrics)))):
        values = trainer.pending_metrics.get(name, [])
        local = torch.tensor([sum(values), len(values)], dtype=torch.float32, device=acc.device)
        total, count = acc.gather(local).view(-1, 2).sum(dim=0).tolist()
        trainer._metrics[name].append(total / max(count, 1.0))
    trainer.pending_metrics.clear()


@torch.no_grad()
def build_rollout(trainer, items: list[dict], group_offset: int = 0, generate=None) -> Rollout:
    """One draw: sample → sanitise → score → advantages for this process's ``items`` (G consecutive rows per clip).

    Args:
        trainer: a :class:`grounding_rl.update.trainer.GroundingGRPOTrainer` (engine, processor, rewards, recipes).
        items: collated items, B rows; the processes' rows in order form whole groups.
        group_offset: added to the group ids (``(global row) // G``), so that draws of one step stay distinct.
        generate: None, or what samples the completions instead of the engine's batched call (:func:`sample`).

    Returns:
        :class:`Rollout`. Rewards are gathered across processes before the advantages; recipes observe the scores
        (:meth:`Recipe.observe`, before shaping) and may shape them (:meth:`Recipe.shape`).

    Raises:
        ValueError: a prompt longer than ``max_prompt_length``. UserError: a reward function's output has the wrong
        length, or too many unreadable videos.
    """
    acc, G = trainer.accelerator, trainer.num_generations
    device = acc.device
    account_items(trainer, items)
    start = acc.process_index * len(items)
    context = trainer.step_context()
    conversed = next((out for out in (r.converse(context, items) for r in trainer.recipes) if out is not None), None)
    if conversed is not None:  # multi-turn (the crop tool): the final turns are scored
        batch, clean, texts, items = conversed
    else:
        batch, completion_ids, sampling_logps = sample(trainer, items, generate)
        clean = sanitise(trainer, items, completion_ids, sampling_logps, start)
        texts = trainer.processing_class.batch_decode(
            [ids[:n] for ids, n in zip(clean["completion_ids"].tolist(), clean["lengths"].tolist())],
            skip_special_tokens=True)
    with timed(trainer, "reward"):
        local_rewards, extra = score(trainer, items, texts, clean["completion_ids"], clean["lengths"])
        rewards_per_func = acc.gather(local_rewards)
    flush_reward_metrics(trainer)
    trainer.call_recipes("observe", items, rewards_per_func, acc.gather(clean["is_gt"]))  # as scored, before shaping
    for recipe in trainer.recipes:
        rewards_per_func = recipe.shape(context, rewards_per_func)
    weights = trainer.reward_weights
    row_weights = getattr(trainer, "row_reward_weights", None)  # (num_samples, F): rows with their own reward spec
    if row_weights is not None:
        weights = acc.gather(row_weights[[item["index"] for item in items]].to(device))
    group_ids = torch.arange(start, start + len(items), device=device) // G + group_offset  # the sampler's G rows
    weighted = weighted_rewards(rewards_per_func, weights)  # all processes' rows: a split group is normalised as one
    adv = grpo.group_advantages(weighted, acc.gather(group_ids), trainer.args.scale_rewards)
    local = slice(start, start + len(items))
    return Rollout(items=items, batch=batch, texts=texts, rewards_per_func=rewards_per_func[local],
                   rewards=weighted[local], advantages=adv.advantages[local], zero_std=adv.group_zero_std[local],
                   scale_zero_std=adv.zero_std[local], group_ids=group_ids, extra=extra, **clean)


# ---------------------------------------------------------------------------------------------------------- shuffle
def group_permutation(group_ids: torch.Tensor, seed: int, global_step: int, generation: int) -> list[int]:
    """Rows in a random order of whole groups (rows of equal ``group_ids``), each group's rows kept in order: TRL 1.16
    shuffles the generation batch before cutting it into micro-batches (``shuffle_sequence_dict`` then
    ``split_tensor_dict`` in ``GRPOTrainer._prepare_inputs``); by group here, so that every micro-batch keeps the
    encode-once and prefix sharing of its groups.

    The permutation comes from a ``torch.Generator`` of its own seeded by ``(seed, global_step, generation)``; nothing
    is drawn from the global RNG, and a resumed run shuffles the same. Example: group ids [0, 0, 1, 1] → rows
    [2, 3, 0, 1] or [0, 1, 2, 3].
    """
    ids = group_ids.tolist()
    order = list(dict.fromkeys(ids))
    rows_of = defaultdict(list)
    for row, gid in enumerate(ids):
        rows_of[gid].append(row)
    generator = torch.Generator().manual_seed(((seed * 1_000_003 + global_step) * 1_009 + generation) % 2**63)
    return [row for p in torch.randperm(len(order), generator=generator).tolist() for row in rows_of[order[p]]]
