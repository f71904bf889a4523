"""Validation during training: the greedy evaluation of ``grounding-rl eval`` on ``eval_file`` every
``eval_steps`` (:func:`greedy_evaluation`, run by the recipe as a ``TrainerCallback``'s ``on_evaluate``: the GRPO
trainer's ``evaluate`` runs no loss forward), with
both scorings of :mod:`grounding_rl.reward.records`; ``metric_for_best_model`` names one of :data:`EVAL_METRICS`."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback

from grounding_rl.update.recipes.base import Recipe

# what validation during training logs (with the prefix eval_): the standard scoring, then the reward's clamped one
EVAL_METRICS = ("R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "parse_failure_rate", "format_rate",
                "clamped_R1@0.3", "clamped_R1@0.5", "clamped_R1@0.7", "clamped_mIoU")


@dataclass
class ValidationArguments:
    eval_file: str | None = field(
        default=None,
        metadata={"help": "Canonical JSONL evaluated greedily during training (the code of `grounding-rl eval`) with "
                          "eval_strategy steps/epoch; logs eval_R1@0.3/0.5/0.7, eval_mIoU (standard scoring), "
                          "eval_clamped_* and the parse-failure and format rates; metric_for_best_model (default mIoU "
                          "with load_best_model_at_end) picks the best checkpoint. Relative videos resolve against "
                          "video_root."},
    )
    eval_max_samples: int | None = field(
        default=None, metadata={"help": "Evaluate only the first N samples of eval_file; None = all."})


def _strategy(args) -> str:
    return str(getattr(args.eval_strategy, "value", args.eval_strategy))


class Validation(Recipe, TrainerCallback):
    """The recipe, and the ``TrainerCallback`` whose ``on_evaluate`` fills the metrics the GRPO trainer's
    ``evaluate`` logs and returns (so ``metric_for_best_model`` and later callbacks read them)."""

    name = "validation"
    arguments = ValidationArguments
    switch = "eval_file"

    @staticmethod
    def enabled(args, config) -> bool:
        return _strategy(config) != "no" or bool(config.eval_on_start)

    @staticmethod
    def problems(args, config) -> list[str]:
        problems = []
        evaluating = Validation.enabled(args, config)
        if evaluating and not args.eval_file:
            problems.append(f"eval_strategy {_strategy(config)!r} needs eval_file (a canonical JSONL to evaluate "
                            "greedily during training)")
        if evaluating and config.world_size > 1:
            problems.append(f"validation during training (eval_strategy) runs on one process only, not "
                            f"{config.world_size}: a 2-process ZeRO-3 run stalled at its first evaluation; evaluate the "
                            "checkpoints with `grounding-rl eval` (multi-process, resumable) instead")
        if args.eval_file and not evaluating:
            problems.append("eval_file is set but eval_strategy is 'no': set eval_strategy: steps and eval_steps")
        if args.eval_max_samples is not None and args.eval_max_samples < 1:
            problems.append(f"eval_max_samples must be ≥ 1 (got {args.eval_max_samples})")
        metric = config.metric_for_best_model
        if metric is not None and metric.removeprefix("eval_") not in EVAL_METRICS:
            problems.append(f"metric_for_best_model {metric!r} is not an evaluation metric of GRPO training; one of "
                            f"{list(EVAL_METRICS)}")
        return problems

    @staticmethod
    def trainer_inputs(args, config, script_args) -> dict:
        """``eval_dataset`` (the samples of ``eval_file``, by the evaluation policy of
        :func:`grounding_rl.data.samples.load_samples`, relative videos against ``video_root``; the first
        ``eval_max_samples``) and ``eval_dropped`` (the lines dropped, counted only for the whole file); none without
        ``eval_file``."""
        if not args.eval_file:
            return {}
        from grounding_rl.data.samples import load_samples
        from grounding_rl.paths import resolve_config_path

        args.eval_file = resolve_config_path(args.eval_file)
        counts: dict[str, int] = {}
        samples = load_samples(args.eval_file, video_root=script_args.video_root, counts=counts)
        if args.eval_max_samples:
            return {"eval_dataset": samples[: args.eval_max_samples], "eval_dropped": 0}
        return {"eval_dataset": samples, "eval_dropped": counts.get("dropped", 0)}

    def on_evaluate(self, args, state, control, metrics=None, context=None, eval_dataset=None, dropped: int = 0,
                    metric_key_prefix: str = "eval", **kwargs):
        """Add :func:`greedy_evaluation`'s metrics of ``eval_dataset`` to ``metrics``; ``context``: the hooks'
        :class:`grounding_rl.update.recipes.base.StepContext`."""
        metrics.update(greedy_evaluation(eval_dataset, context, args, dropped, metric_key_prefix))


def greedy_evaluation(samples, context, args, dropped: int, prefix: str = "eval") -> dict[str, float]:
    """Greedy evaluation of the policy on ``samples`` (:class:`grounding_rl.data.samples.Sample`, from ``eval_file``),
    with the code of ``grounding-rl eval`` (one call of :func:`grounding_rl.rollout.answering.answer_batches`, records
    and both scorings from :mod:`grounding_rl.reward.records`); each rank answers a shard of whole videos. From the hooks'
    ``context`` (:class:`grounding_rl.update.recipes.base.StepContext`: the policy, its accelerator and processor, the
    collator's frame settings and cache), the training ``args``; ``dropped``: lines of the eval file the validation
    policy dropped.

    Each rank decodes its shard alone (``synced_gpus=False``: under ZeRO-3 the parameters are gathered for it,
    ``ds3_gather_for_generation``), however many batches the other ranks have. The random states (torch, numpy,
    Python) are restored afterwards, so a run with validation trains exactly as one without. Generation budget:
    ``max_completion_length``; batch: ``per_device_eval_batch_size``; decoding workers: ``dataloader_num_workers``.

    Returns:
        ``{prefix_R1@0.3, …, prefix_mIoU, prefix_parse_failure_rate, prefix_format_rate`` (standard scoring)
        ``, prefix_clamped_R1@0.3, …, prefix_clamped_mIoU, prefix_n}``.

    Raises:
        ValueError: no evaluation samples, or ZeRO-3 without ``ds3_gather_for_generation`` (shards of different
            sizes would leave ranks waiting on each other's parameter gathers).
    """
    model, acc, collator = context.model, context.accelerator, context.data_collator
    samples = list(samples or [])
    if not samples:
        raise ValueError("evaluate: no evaluation samples (eval_file)")
    plugin = getattr(acc.state, "deepspeed_plugin", None)
    if plugin is not None and not args.ds3_gather_for_generation and plugin.zero_stage == 3:
        raise ValueError("validation during training under ZeRO-3 needs ds3_gather_for_generation: true")
    import random

    import numpy as np
    from trl.models import unwrap_model_for_generation

    from grounding_rl.prompts.templates import is_set_template
    from grounding_rl.reward.records import metrics_from_records, prediction_record
    from grounding_rl.rollout.answering import Mode, answer_batches
    from grounding_rl.rollout.greedy import group_by_video, shard_by_video

    groups = shard_by_video(group_by_video([s.video for s in samples]), acc.process_index, acc.num_processes)
    mine = [p for _, positions in groups for p in positions]
    cache = collator.cache
    cache_root = str(cache.root) if getattr(cache, "root", None) is not None else None
    config = SimpleNamespace(video=collator.settings, prompt_template=args.prompt_template,
                             video_layout=args.video_layout)
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = [acc.device] if acc.device.type == "cuda" else []
    training = model.training
    local = []
    try:
        with torch.random.fork_rng(devices=devices):
            model.eval()
            with unwrap_model_for_generation(
                    context.model_wrapped, acc, gather_deepspeed3_params=args.ds3_gather_for_generation,
                    gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs) as unwrapped:
                for batch in answer_batches(unwrapped, context.processing_class, [samples[p].video for p in mine],
                                            [samples[p].query for p in mine], config, args.max_completion_length,
                                            args.per_device_eval_batch_size, Mode(synced_gpus=False),
                                            args.dataloader_num_workers, cache_root, getattr(cache, "max_bytes", 0)):
                    local += [(mine[a.position], prediction_record(
                        samples[mine[a.position]], a.text, a.error, a.sampling,
                        set_answers=is_set_template(args.prompt_template))) for a in batch]
    finally:
        model.train(training)
        random.setstate(python_state)
        np.random.set_state(numpy_state)
    records = [record for _, record in sorted(gather_object(local), key=lambda pair: pair[0])]
    metrics = metrics_from_records(records, args.prompt_template, dropped)
    out = {f"{prefix}_{key}": float(metrics[key]) for key in ("n", *EVAL_METRICS[:6])}
    clamped = metrics["by_scoring"]["clamped"]
    out.update({f"{prefix}_clamped_{key}": float(clamped[key]) for key in ("R1@0.3", "R1@0.5", "R1@0.7", "mIoU")})
    return out
