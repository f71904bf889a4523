"""Fixed two-pass zoom training: each query of a step contributes two groups of G, the **pass-1** group (G completions
on the whole clip, the ordinary draw) and a **pass-2** group (G completions on a window of the clip sampled at a
higher rate), each group's advantages normalised on its own (:func:`grounding_rl.update.grpo.group_advantages` over
groups of G: the pass-2 draw has its own group ids).

Pass 2 is ``eval --zoom``'s turn 2 (:mod:`grounding_rl.eval.zoom`), its window from the same
:class:`grounding_rl.rollout.zoom.ZoomEnvironment` (widened by ``zoom_margin``, sampled under pass 1's budget spent per
``zoom_spend``, the family's time: eval's default ``--zoom-time``), its G rows sampled as eval's turn 2: the context
restarted with the window, one ``continue_turn`` of the rollout engine (:meth:`TwoPassZoom.turn2`), then scored and
normalised by pass 1's draw. The pass-2 rows carry ``answer_origin`` (t₀ for Qwen2.5-VL, else 0), added to their answers before any reward
sees them (:func:`grounding_rl.update.rollout.answer_spans`), and ``zoom_window`` [a, b] seconds.

Where the window comes from during training: **the policy's own first sampled pass-1 completion of the group**,
widened by the margin as at evaluation. So the windows trained on are the kind the policy will zoom into at test
(its own answers, right or wrong), at no extra generation; evaluation uses the greedy answer, which a sampled one
approximates. Not the ground truth widened by a random margin: that teacher-forced window always holds the moment,
which the test-time window does not, so pass 2 would learn on an easier distribution than it is evaluated on.

Logged: ``zoom/window_recall`` (share of pass-2 windows holding the whole ground truth), ``zoom/fallbacks`` (windows
from an unparsed answer), ``zoom/window_errors`` (windows that could not be sampled: pass 2 then sees the whole clip,
offset 0), ``zoom/pass1_reward`` and ``zoom/pass2_reward`` (mean weighted reward of each pass); the ``rewards/*``
metrics cover both passes' rows. With ``log_completions`` each row's ``extra.zoom_window`` is its window (None for
pass 1). A step trains on 2 × the generation batch (both passes).

Refused with the crop tool, dynamic sampling, ground-truth injection (its answer is in the video's time), a
distillation teacher, the online difficulty filter (it would record pass-2 rewards as the clip's), the vLLM engine
(not tried), a video sampler other than ``exact`` and set templates.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from grounding_rl.prompts.preprocessing import settings_of, with_settings
from grounding_rl.rollout.zoom import ZoomSettings
from grounding_rl.update.recipes.base import Recipe

ZOOM_KEYS = [s for s in settings_of(ZoomSettings, "zoom_") if s.name != "time"]  # eval's --zoom-margin, --zoom-spend


@dataclass
@with_settings(ZOOM_KEYS)
class TwoPassZoomArguments:
    two_pass_zoom: bool = field(
        default=False,
        metadata={"help": "Fixed two-pass zoom training: each query also trains a pass-2 group on the window of its "
                  "group's first sampled answer (eval --zoom's window and sampling), each group normalised on its "
                  "own."})


class TwoPassZoom(Recipe):
    name = "two_pass_zoom"
    arguments = TwoPassZoomArguments
    conflicts = ("crop_tool", "dynamic_sampling", "gt_injection", "distillation", "online_filter")
    switch = "two_pass_zoom"
    conflict_message = "two_pass_zoom does not run with {}"

    @staticmethod
    def problems(args, config) -> list[str]:
        from grounding_rl.rollout.zoom import window_problems

        out = [p for p in (s.problem(getattr(args, s.key)) for s in ZOOM_KEYS) if p]
        if args.two_pass_zoom:
            if config.use_vllm:
                out.append("two_pass_zoom does not run with use_vllm")
            out += window_problems("two_pass_zoom", config.video_sampler, config.prompt_template,
                                   "the zoom looks again at one")
        return out

    def resample(self, context, rollout, draw):
        """Pass 1 (``rollout``) followed, on this process, by its pass-2 rows: ``draw(items, group_offset, generate)``
        (:func:`grounding_rl.update.rollout.build_rollout`) on :meth:`pass2_items`, group ids after pass 1's, sampled
        by :meth:`turn2`."""
        import functools

        import torch
        from accelerate.utils import gather_object

        from grounding_rl.update import batching
        from grounding_rl.update.rollout import Rollout, timed

        acc, G = context.accelerator, context.num_generations
        first = {}  # group id → its first completion, over every process's rows (a group may be split)
        for text, group in zip(gather_object(list(rollout.texts)), acc.gather(rollout.group_ids).tolist()):
            first.setdefault(group, text)
        with timed(context, "zoom_window"):
            items = self.pass2_items(context, rollout.items, [first[g] for g in rollout.group_ids.tolist()])
        second = draw(items, self.config.generation_batch_size // G, functools.partial(self.turn2, context))
        second.extra["zoom_window"] = [it["zoom_window"] for it in items]  # completions.jsonl: None = pass 1
        for name, column in (("window_recall", "zoom_window_recall"), ("fallbacks", "zoom_fallback"),
                             ("window_errors", "zoom_window_error")):
            values = torch.tensor([float(it[column]) for it in items], device=acc.device)
            context.log(f"zoom/{name}", acc.gather(values).mean().item())
        context.log("zoom/pass1_reward", torch.nanmean(acc.gather(rollout.rewards)).item())
        context.log("zoom/pass2_reward", torch.nanmean(acc.gather(second.rewards)).item())
        return Rollout.concat([rollout, second], functools.partial(
            batching.config_prompt_batch, context.processing_class, config=self.config, device=acc.device),
            context.pad_token_id)

    def turn2(self, context, items: list[dict]):
        """Pass 2's completions, (B, C) ids: turn 2 of the zoom's fixed two-turn conversation, as at evaluation
        (:func:`grounding_rl.rollout.zoom.zoom_rows`): each row's context restarted with its window
        (:func:`grounding_rl.rollout.conversation.restart`), one ``continue_turn`` of the rollout engine
        (:func:`grounding_rl.update.rollout.conversation_turns`) sampled with the run's settings."""
        import torch
        from torch.nn.utils.rnn import pad_sequence

        from grounding_rl.family import family_of
        from grounding_rl.rollout.conversation import restart
        from grounding_rl.update.rollout import conversation_turns

        processor, config = context.processing_class, self.config
        trajectories = [restart(processor, family_of(processor), it["query"], it["clip"], config.prompt_template,
                                config.video_layout) for it in items]
        with conversation_turns(context, config, context.sampling) as (turns, sampling):
            ids = turns.continue_turn(trajectories, sampling)
        return pad_sequence([torch.tensor(row) for row in ids], batch_first=True, padding_value=context.pad_token_id)

    def pass2_items(self, context, items: list[dict], texts: list[str]) -> list[dict]:
        """The pass-2 items of this process's pass-1 ``items``: each row's clip replaced by the window of its group's
        first completion (``texts``: that completion, one per row; the group found by its id), with
        the columns ``answer_origin``, ``zoom_window``, ``zoom_fallback``, ``zoom_window_error`` and
        ``zoom_window_recall`` (the ground truth wholly inside)."""
        from grounding_rl.family import family_of
        from grounding_rl.rollout.zoom import ZoomEnvironment

        out = []
        family = family_of(context.accelerator.unwrap_model(context.model))
        environment = ZoomEnvironment(family.video_settings(self.config.video_settings), self.args.zoom_spend,
                                      self.args.zoom_margin, family.window_answer_shift())
        for text, item in zip(texts, items):
            window, fallback, clip, _, origin = environment(text, item["clip"], item["index"])
            out.append({k: v for k, v in item.items() if k != "substituted_from"} | dict(  # counted once, in pass 1
                clip=item["clip"] if clip is None else clip, answer_origin=origin, zoom_window=window,
                zoom_fallback=fallback, zoom_window_error=clip is None,
                zoom_window_recall=window[0] <= item["start"] and item["end"] <= window[1]))
        return out
