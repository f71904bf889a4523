"""Multi-turn GRPO with the crop tool: each completion is a conversation in which the model may request
``crop(start, end)`` up to ``max_tool_calling_iterations`` times (TRL 1.16's name) before it answers
(:mod:`grounding_rl.rollout.tools`, :mod:`grounding_rl.rollout.conversation`); the loss counts model tokens only
(:mod:`grounding_rl.update.conversation`).

The recipe replaces the single-turn sampling of a draw (:meth:`Recipe.converse`): the conversations are run with
``model.generate`` (``max_completion_length`` is the budget of each model turn, ``max_prompt_length`` the input of
every turn, appended windows included), the final turn's text is what the reward functions score, and every row gets
the columns ``crop_windows`` and ``crop_calls`` (for the ``crop_window`` and ``crop_cost`` rewards,
:mod:`grounding_rl.reward.window`). Logged per generation: ``turns/mean``, ``tools/call_frequency``,
``tools/failure_frequency`` (TRL's definitions), ``zoom/coverage``, ``tools/context_forced``; with
``log_completions`` each row's conversation record (turns, windows) is in ``extra.conversation``.

Every turn is one ``continue_turn`` of the engine (:class:`grounding_rl.rollout.conversation.HFTurns`; with
``use_vllm`` :meth:`grounding_rl.rollout.vllm.VLLMEngine.continue_turn`: one prompt with every video so far, weights
synced once per rollout, its log-probs of the model tokens feeding the importance-sampling correction (NaN, no
correction, at tool tokens); on one process or several, each with its own engine (``vllm_tensor_parallel_size`` 1:
ranks may run different numbers of turns)). Not combined (yet) with dynamic sampling, ground-truth injection,
distillation or validation during training (``eval_file``: it would score single-turn answers) — refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from grounding_rl.prompts.preprocessing import settings_of, with_settings
from grounding_rl.rollout.tools import ToolSettings
from grounding_rl.update.recipes.base import Recipe

CROP_SPEND = ("fps", "resolution")


@dataclass
@with_settings(settings_of(ToolSettings))
class CropToolArguments:
    crop_spend: str = field(
        default="fps",
        metadata={"help": "What a requested window spends the whole clip's frame budget on: 'fps' (the same frames "
                  "and size over the window) or 'resolution' (eval --zoom-spend's rule)."})


class CropTool(Recipe):
    name = "crop_tool"
    arguments = CropToolArguments

    conflicts = ("dynamic_sampling", "gt_injection", "distillation", "validation")
    switch = "max_tool_calling_iterations"
    conflict_message = "max_tool_calling_iterations > 0 does not run with {} yet"

    @staticmethod
    def extra_videos(args) -> int:
        return args.max_tool_calling_iterations or 0

    @staticmethod
    def problems(args, config) -> list[str]:
        from grounding_rl.rollout.zoom import window_problems

        out = [p for p in (s.problem(getattr(args, s.key)) for s in settings_of(ToolSettings)) if p]
        if args.crop_spend not in CROP_SPEND:
            out.append(f"crop_spend must be one of {', '.join(CROP_SPEND)} (got {args.crop_spend!r})")
        if (args.max_tool_calling_iterations or 0) > 0:
            if config.use_vllm and config.vllm_tensor_parallel_size > 1:
                # each process's engine samples its own rows (no collective inside generate), so ranks may run
                # different numbers of turns; a tensor-parallel group's ranks gather their prompts every call
                out.append("max_tool_calling_iterations > 0 with use_vllm runs with vllm_tensor_parallel_size 1 (the "
                           "ranks of a tensor-parallel group would wait on each other when their conversations run "
                           f"different numbers of turns; got {config.vllm_tensor_parallel_size})")
            out += window_problems("max_tool_calling_iterations > 0", config.video_sampler, config.prompt_template,
                                   "the crop tool is for one")
        return out

    def setup(self, context) -> None:
        """One warning when ``share_prompt_prefix`` is on: a group's conversations diverge after the first turn, so
        their forward runs per row (each distinct clip or window still encoded once).

        Raises:
            ValueError: ZeRO-3 without ``ds3_gather_for_generation``: the ranks run different numbers of turns (each
                rank's conversations end when they answer), and partitioned layers would leave them waiting on each
                other's parameter gathers.
        """
        if (context.is_deepspeed_enabled and not self.config.ds3_gather_for_generation
                and context.accelerator.state.deepspeed_plugin.zero_stage == 3):
            raise ValueError("max_tool_calling_iterations > 0 under ZeRO-3 needs ds3_gather_for_generation: true "
                             "(each rank runs as many turns as its own conversations need)")
        if context.share_prompt:
            import logging

            logging.getLogger("grounding_rl.update.trainer").warning(
                "share_prompt_prefix: multi-turn conversations diverge after their first turn; the policy and "
                "reference forwards run per row")

    def converse(self, context, items):
        """Run this process's conversations (rows in order) and return ``(batch, clean, texts, items)`` for
        :func:`grounding_rl.update.rollout.build_rollout`."""
        import dataclasses

        import torch

        from grounding_rl.family import family_of
        from grounding_rl.rollout import conversation as conv
        from grounding_rl.rollout.tools import CropEnvironment
        from grounding_rl.update import batching
        from grounding_rl.update.conversation import conversation_batch, metric_sums, metrics_from_sums
        from grounding_rl.update.rollout import conversation_turns

        args, config, processor = self.args, self.config, context.processing_class
        family = family_of(context.accelerator.unwrap_model(context.model))
        K = args.max_tool_calling_iterations
        trajectories = [conv.start(processor, family, it["query"], it["clip"], config.prompt_template, K,
                                   config.video_layout, config.max_prompt_length,
                                   f"sample {it['index']} (qid {it['qid']}, {it['video']})") for it in items]
        environment = CropEnvironment(family.video_settings(config.video_settings), args.crop_spend)
        run = dict(end_ids=context.eos_token_ids, stop_ids=context.placeholder_ids,
                   max_prompt_length=config.max_prompt_length, layout=config.video_layout)
        # each rank decodes alone (synced_gpus off): its conversations may need fewer turns than another rank's
        with conversation_turns(context, self.config, dataclasses.replace(context.sampling, synced_gpus=False)
                                ) as (turns, sampling):
            conv.run_conversations(lambda active: turns.continue_turn(active, sampling), trajectories, processor,
                                   family, environment, K, **run)
        device = context.accelerator.device
        batch = batching.to_device(conversation_batch(trajectories, context.pad_token_id), device)
        truncated = torch.tensor([t.truncated for t in trajectories], device=device)
        mask = batch["completion_mask"]
        if config.mask_truncated_completions:
            mask = mask * (~truncated).unsqueeze(1).int()
        clean = {"completion_ids": batch["completion_ids"], "completion_mask": mask,
                 "lengths": torch.tensor([len(t.completion_ids) for t in trajectories], device=device),
                 "truncated": truncated, "placeholder_cut": torch.zeros_like(truncated),
                 "is_gt": torch.zeros_like(truncated), "sampling_logps": None}
        if getattr(turns, "logps_need_correcting", False):  # vLLM's log-probs of the model tokens
            from grounding_rl.rollout import vllm

            clean["sampling_logps"] = vllm.conversation_sampling_logps(
                trajectories, batch["completion_ids"].size(1)).to(device)
        sums = torch.tensor(metric_sums(trajectories, [(it["start"], it["end"]) for it in items]), device=device)
        sums = context.accelerator.gather(sums.unsqueeze(0)).sum(dim=0).tolist()  # all processes' trajectories
        for name, value in metrics_from_sums(sums).items():
            if value == value:  # NaN (no window sampled) is not logged
                context.log(name, value)
        context.extra["conversation"].extend(t.record() for t in trajectories)
        items = [dict(it, crop_windows=[list(w) for w in t.windows], crop_calls=t.calls)
                 for it, t in zip(items, trajectories)]
        return batch, clean, [t.final_text for t in trajectories], items
