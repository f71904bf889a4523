"""What a trained rollout logs, once per generation: TRL 1.16's rollout metrics (names as TRL's) and the completions of
``log_completions`` (``completions.jsonl``, and a table in each active tracker: :mod:`grounding_rl.update.trackers`).
Both come from the rollout the loss trains on (after dynamic sampling's selection), never from a discarded draw."""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from accelerate.utils import gather_object
from trl.trainer.utils import nanstd

from grounding_rl.jsonl_files import JsonlAppender
from grounding_rl.prompts.templates import is_set_template
from grounding_rl.prompts.parsing import parse_answer, parse_spans
from grounding_rl.update.rollout import Rollout
from grounding_rl.update.trackers import log_completions_table

logger = logging.getLogger(__name__)


def log_rollout(trainer, rollout: Rollout) -> None:
    """Append the rollout metrics over all processes' rows to ``trainer._metrics``; the injected ground truth is left
    out (TempSamp-R1's ``gt_log_exclude``), ``gt/advantage`` is the injected rows' mean advantage. With
    ``log_completions``, keep the rows for :func:`write_completions` (``trainer.completions``)."""
    metrics, gather, args = trainer._metrics, trainer.accelerator.gather, trainer.args
    is_gt = gather(rollout.is_gt)
    sampled = ~is_gt
    rewards_per_func, weighted = gather(rollout.rewards_per_func), gather(rollout.rewards)
    advantages = gather(rollout.advantages)
    metrics["completions/placeholder_cut_ratio"].append(gather((rollout.placeholder_cut & ~rollout.is_gt).float())
                                                        .mean().item())
    for j, name in enumerate(trainer.reward_func_names):
        metrics[f"rewards/{name}/mean"].append(torch.nanmean(rewards_per_func[sampled, j]).item())
        metrics[f"rewards/{name}/std"].append(nanstd(rewards_per_func[sampled, j]).item())
    metrics["reward"].append(torch.nanmean(weighted[sampled]).item())
    metrics["reward_std"].append(nanstd(weighted[sampled]).item())
    metrics["frac_reward_zero_std"].append(gather(rollout.scale_zero_std).float().mean().item())
    if is_gt.any():
        metrics["gt/advantage"].append(advantages[is_gt].mean().item())
    metrics["completions/mean_length"].append(gather(rollout.lengths)[sampled].float().mean().item())
    clipped = gather(rollout.truncated.int())[sampled].float().mean().item()
    metrics["completions/clipped_ratio"].append(clipped)
    if clipped == 1.0 and trainer.accelerator.is_main_process:
        logger.warning("every completion of this batch hit max_completion_length (%d tokens): answers are cut "
                       "off, rewards carry no signal; raise max_completion_length", args.max_completion_length)
    texts = gather_object(rollout.texts)
    parse = parse_spans if is_set_template(args.prompt_template) else parse_answer  # a set template's answers
    unparsed = [parse(t) is None for t, gt in zip(texts, is_gt.tolist()) if not gt]
    metrics["parse_failure_rate"].append(sum(unparsed) / max(len(unparsed), 1))
    if args.log_completions:
        keys = sorted(set(gather_object(sorted(rollout.extra))))
        items = rollout.items
        trainer.completions = {
            "query": gather_object([it["query"] for it in items]),
            "qid": gather_object([it["qid"] for it in items]),
            "video": gather_object([it["video"] for it in items]),
            "frame_times": gather_object([[round(float(t), 3) for t in it["clip"].timestamps] for it in items]),
            "ground_truth": gather_object([it.get("spans") or [it["start"], it["end"]] for it in items]),
            "parsed": [parse(t) for t in texts], "completion": texts,
            "rewards": rewards_per_func.cpu(), "advantage": advantages.cpu(),
            "extra": {key: gather_object(rollout.extra.get(key, [None] * len(rollout))) for key in keys}}


def write_completions(trainer) -> None:
    """TRL's ``log_completions``: the trained rollout's rows (query, video, the sampled frames' times in seconds,
    the answer, its parsed span(s) or None, the ground truth ``[start, end]`` or its spans, the reward per function,
    the advantage; the columns of ``log_extra`` under ``extra``) as JSON lines appended to
    ``output_dir/completions.jsonl``, and as a table in each active tracker
    (:func:`grounding_rl.update.trackers.log_completions_table`); at most ``num_completions_to_print`` rows."""
    logged, limit = trainer.completions, trainer.args.num_completions_to_print
    names = trainer.reward_func_names
    rows = []
    for i, completion in enumerate(logged["completion"][:limit]):
        rewards = {name: None if torch.isnan(logged["rewards"][i, j]) else float(logged["rewards"][i, j])
                   for j, name in enumerate(names)}
        row = {"step": trainer.state.global_step, "qid": logged["qid"][i], "query": logged["query"][i],
               "video": logged["video"][i], "frame_times": logged["frame_times"][i], "completion": completion,
               "parsed": logged["parsed"][i], "ground_truth": logged["ground_truth"][i], "rewards": rewards,
               "advantage": float(logged["advantage"][i])}
        if logged["extra"]:
            row["extra"] = {key: values[i] for key, values in logged["extra"].items()}
        rows.append(row)
    path = Path(trainer.args.output_dir) / "completions.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = JsonlAppender(path, default=str)
    try:
        writer.write(*rows)
    finally:
        writer.close()
    columns = ["step", "qid", "query", "video", "frame_times", "completion", "parsed", "ground_truth", *names,
               "advantage"]
    log_completions_table(trainer, columns, [[r[c] for c in columns[:8]] + [*r["rewards"].values(), r["advantage"]]
                                             for r in rows])
    trainer.completions = None
