"""``GroundingGRPOTrainer``: GRPO for video temporal grounding on ``transformers.Trainer``.

Why not TRL's ``GRPOTrainer``: in TRL 1.16 it generates with the video but computes the loss without it. This trainer
keeps TRL's structure, names and helpers and holds no math and no recipe: the loss is in :mod:`.grpo`, the forward in
:mod:`.logprobs`, the tensors in :mod:`.batching`, the rollout in :mod:`.rollout` (metrics: :mod:`.rollout_metrics`),
sampling behind :class:`grounding_rl.rollout.generation.RolloutEngine`, every recipe in :mod:`.recipes` (its hooks).

One step, in the order of this file (torchtune's ``grpo_full_finetune_distributed.py`` ``train()``): the dataloader
yields a *generation batch* (each clip G times, split across processes); :meth:`generate_and_score` builds the
:class:`~grounding_rl.update.rollout.Rollout` (sample → sanitise → score → advantages, rewards gathered so groups split
between ranks are normalised together), lets the recipes resample it, logs it once, shuffles its groups when it feeds
several micro-batches, and adds π_old / π_ref log-probs when needed; :meth:`_prepare_inputs` buffers it as
``steps_per_generation`` micro-batches, reused ``num_iterations`` times; :meth:`compute_loss` runs the policy forward
and the GRPO loss, plus the recipes' loss terms (a distillation teacher's, :meth:`Recipe.loss_term`). Generation,
the policy and the reference forwards see the very same token ids and video tensors; with ``share_video_encoding``
each distinct clip is encoded once and each distinct prompt prefilled once.

Phase timings (seconds; verl's ``fit()`` timers), per generation: ``timing/generate``, ``timing/sync_weights`` (vLLM),
``timing/reward``, ``timing/dynamic_sampling`` (the extra draws, also counted in generate and reward),
``timing/old_logps``, ``timing/ref``; per optimizer step: ``step_time`` (TRL's: the micro-steps' ``training_step``,
generation included) and ``timing/update`` (their forward and backward alone).
"""
from __future__ import annotations

import functools
import time
from collections import defaultdict
from dataclasses import fields

import torch
from accelerate.utils import set_seed
from transformers import Trainer, TrainerCallback

from grounding_rl.data.dataset import GroundingDataset, VideoCollator, resumable_repeat_sampler
from grounding_rl.family import family_of
from grounding_rl.models.tokens import completion_token_ids
from grounding_rl.models.vision import placeholder_token_ids
from grounding_rl.reward.rewards import get_reward_funcs, reward_name
from grounding_rl.rollout.generation import SamplingParams
from grounding_rl.update import batching, grpo
from grounding_rl.update.arguments import data_seed
from grounding_rl.update.config import GroundingGRPOConfig
from grounding_rl.update.engines import make_rollout_engine
from grounding_rl.update.logprobs import completion_logps, prefix_sharing, reference_model
from grounding_rl.update.recipes import active_recipes
from grounding_rl.update.recipes.base import StepContext
from grounding_rl.update.resume import ExactResumeMixin, check_resume, write_rollout_format
from grounding_rl.update.rollout import build_rollout, group_permutation, timed
from grounding_rl.update.rollout_metrics import log_rollout, write_completions
from grounding_rl.update.checkpoints import CompleteCheckpointMixin, newest_complete
from grounding_rl.update.saving import GroundingSaveMixin
from grounding_rl.update.sources import row_settings


class GroundingGRPOTrainer(CompleteCheckpointMixin, ExactResumeMixin, GroundingSaveMixin, Trainer):
    """GRPO trainer for Qwen-VL models (any family of :mod:`grounding_rl.family`) on (video, query, start, end)
    samples.

    Args:
        model: the policy (a loaded model, PEFT-wrapped for LoRA: :func:`grounding_rl.cli.common.load_training_model`;
            with a PEFT model the reference is the adapter-free base).
        args: :class:`GroundingGRPOConfig`.
        train_dataset: :class:`GroundingDataset`.
        processing_class: the model's processor.
        reward_funcs: callables with TRL's reward signature (:func:`grounding_rl.update.rollout.reward_columns`) or
            registry names; None = ``args.reward_funcs``.
        ref_model: the reference model when β > 0 and the policy is not a PEFT model (see :func:`grounding_rl.update.logprobs.reference_model`);
            None loads it from the policy's path.
        rollout_engine: a :class:`RolloutEngine`; None = :class:`HFGenerateEngine`.
        frame_cache: optional frame cache passed to :func:`grounding_rl.data.video.sample_frames`.
        callbacks: extra ``TrainerCallback`` objects.
        max_missing_fraction: stop (``UserError``) once more than this share of the distinct videos turned out
            unreadable (:func:`grounding_rl.data.missing.check_fraction`); 1.0 = never, substitutes only.
        eval_dataset: :class:`grounding_rl.data.samples.Sample` objects that :meth:`evaluate` scores greedily
            (``eval_file``; needed when ``eval_strategy`` is not ``"no"``).
        eval_dropped: lines of the eval file the validation policy dropped (the ``standard`` scoring counts them).

    Attributes: :attr:`recipes` (:func:`grounding_rl.update.recipes.active_recipes`; their hooks receive
    :meth:`step_context`), :attr:`row_reward_weights` and :attr:`data_mix` (the rows' own reward weights and the
    sources' mix: :func:`grounding_rl.update.sources.row_settings`).
    """

    loss_is_scaled_for_ga = True  # compute_loss scales for gradient accumulation itself, as TRL's GRPOTrainer

    def __init__(self, model, args: GroundingGRPOConfig, train_dataset: GroundingDataset, processing_class,
                 reward_funcs=None, ref_model=None, rollout_engine=None, frame_cache=None, callbacks=None,
                 max_missing_fraction: float = 1.0, eval_dataset=None, eval_dropped: int = 0):
        if args.disable_dropout:
            from trl.trainer.utils import disable_dropout_in_model

            disable_dropout_in_model(model)
        specs = list(reward_funcs if reward_funcs is not None else args.reward_funcs)
        funcs = [get_reward_funcs([f])[0] if isinstance(f, str) else f for f in specs]
        weights = args.reward_weights or [1.0] * len(funcs)
        if len(weights) != len(funcs):
            raise ValueError(f"{len(weights)} reward_weights for {len(funcs)} reward functions")
        self.reward_funcs = funcs
        self.reward_func_names = [reward_name(f, s if isinstance(s, str) else None) for f, s in zip(funcs, specs)]
        self.reward_weights = torch.tensor(weights, dtype=torch.float32)
        self.sampling = SamplingParams(args.max_completion_length, args.temperature, args.top_p, args.top_k,
                                       args.repetition_penalty)
        self.num_generations = args.num_generations
        self._metrics = defaultdict(list)
        self.timings = defaultdict(float)  # seconds per phase of the current generation (rollout.timed)
        self.pending_metrics, self.pending_extra = defaultdict(list), defaultdict(list)  # log_metric, log_extra
        self.recipes = active_recipes(args)
        for recipe in self.recipes:
            train_dataset = recipe.prepare_data(self.step_context(), train_dataset)
        self.row_reward_weights, self.data_mix = row_settings(train_dataset.samples, self.reward_func_names,
                                                              self.reward_weights, args.prompt_template)
        # frames sized for the model's vision tower (its family's pixel factor)
        collator = VideoCollator(train_dataset, family_of(model).video_settings(args.video_settings), cache=frame_cache)
        super().__init__(model=model, args=args, train_dataset=train_dataset, data_collator=collator,
                         eval_dataset=eval_dataset, processing_class=processing_class, callbacks=callbacks)
        self.model_accepts_loss_kwargs = False
        # Trainer seeded every rank alike; sampling must differ between ranks, or the rows of a group that sit on
        # different ranks would draw identical completions (TRL does the same)
        set_seed(args.seed, device_specific=True)
        self.beta = 0.0 if args.stage == "distill" else args.beta  # the KL weight, TRL GRPOTrainer's (distill: none)
        self.stage = "distillation" if args.stage == "distill" else self.stage  # named in the model card
        self.ref_model = reference_model(self, ref_model)
        self.share_prompt = prefix_sharing(self.model, args)
        self.rollout_engine = rollout_engine or make_rollout_engine(args, self.accelerator, self.model,
                                                                    processing_class)
        ids = completion_token_ids(processing_class.tokenizer, self.accelerator.unwrap_model(self.model).generation_config)
        self.eos_token_ids, self.pad_token_id = list(ids.eos), ids.pad
        self.placeholder_ids = placeholder_token_ids(self.model)
        self._micro_step, self._buffered_inputs = 0, None
        self._step_time = self._update_time = self._prepare_time = 0.0
        self.skipped_total, self.unreadable_videos = 0, set()
        self.num_videos = len({sample["video"] for sample in train_dataset.samples})
        self.max_missing_fraction = max_missing_fraction
        self.completions = None  # the trained rollout's rows, for log_completions
        self.eval_dropped = eval_dropped
        self.call_recipes("setup")
        for recipe in self.recipes:  # a recipe that is a TrainerCallback (validation) hears the events first
            if isinstance(recipe, TrainerCallback):
                self.callback_handler.callbacks.insert(0, recipe)

    def step_context(self) -> StepContext:
        """What the recipes' hooks see now (:class:`StepContext`; before ``Trainer.__init__``, the fields set by
        then)."""
        return StepContext(**{f.name: getattr(self, f.name, None) for f in fields(StepContext)
                              if f.name not in ("metrics", "extra")}, metrics=self._metrics, extra=self.pending_extra)

    def call_recipes(self, hook: str, *args) -> list:
        """Each active recipe's ``hook(step_context, *args)`` (:class:`Recipe`), in registry order: their results."""
        context = self.step_context()
        return [getattr(recipe, hook)(context, *args) for recipe in self.recipes]

    # ------------------------------------------------------------------------------------------------ models
    def _ref_logps(self, batch):
        if self.ref_model is not None:
            return completion_logps(self.ref_model, batch, self.args.temperature, self.share_prompt)
        with self.accelerator.unwrap_model(self.model).disable_adapter():
            return completion_logps(self.model, batch, self.args.temperature, self.share_prompt)

    def _micro_batched(self, fn, batch):
        """Apply a forward ``fn`` per micro-batch of ``per_device_train_batch_size`` rows (bounded memory)."""
        return torch.cat([fn(part) for part in batching.split_rows(batch, self.args.steps_per_generation)], dim=0)

    # ------------------------------------------------------------------------------------------------ data
    def get_train_dataloader(self):
        # TRL's change to Trainer.get_train_dataloader: one batch = per_device × steps_per_generation rows
        return self._get_dataloader(self.train_dataset, "Training",
                                    self._train_batch_size * self.args.steps_per_generation,
                                    sampler_fn=self._get_train_sampler, is_training=True)

    def _get_train_sampler(self, dataset=None):
        """TRL's sampler: each clip G times in a row, the same order on every rank (seeded), the generation batch
        repeated ``num_iterations × steps_per_generation`` times so buffered generations line up with the data; each
        epoch's order is the same when resumed (:func:`grounding_rl.data.dataset.resumable_repeat_sampler`). A recipe
        may supply its own (:meth:`Recipe.sampler`: the online filter's). Seeded by :func:`data_seed`."""
        dataset = dataset if dataset is not None else self.train_dataset
        for recipe in self.recipes:
            sampler = recipe.sampler(self.step_context(), dataset)
            if sampler is not None:
                return sampler
        return resumable_repeat_sampler(
            data_source=dataset, mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.args.num_iterations * self.args.steps_per_generation,
            shuffle=self.args.shuffle_dataset, seed=data_seed(self.args))

    def train(self, resume_from_checkpoint=None, **kwargs):
        """``Trainer.train``; the recipes restore their state from ``resume_from_checkpoint``.

        Raises:
            UserError: this version cannot continue the checkpoint exactly (inside a generation window, or an older
                rollout format: :func:`grounding_rl.update.resume.check_resume`).
        """
        if resume_from_checkpoint is True:  # Trainer's "the last checkpoint of output_dir": the newest complete one
            resume_from_checkpoint = newest_complete(self.args.output_dir)[0] or True
        if isinstance(resume_from_checkpoint, str):
            check_resume(resume_from_checkpoint, self.args)
            self.call_recipes("load", resume_from_checkpoint)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    # ------------------------------------------------------------------------------------------------ rollout
    def _prepare_inputs(self, generation_batch):
        """Generate once per ``steps_per_generation × num_iterations`` micro-steps; return this one's micro-batch."""
        start = time.perf_counter()
        generate_every = self.args.steps_per_generation * self.args.num_iterations
        if self._buffered_inputs is None:  # first step of this run, fresh or resumed (at a window boundary: train())
            self._micro_step = self.state.global_step * self.args.gradient_accumulation_steps
        if self._micro_step % generate_every == 0 or self._buffered_inputs is None:
            batch = self.generate_and_score(generation_batch)
            self._buffered_inputs = batching.split_rows(batch, self.args.steps_per_generation)
        self._prepare_time += time.perf_counter() - start
        return self._buffered_inputs[self._micro_step % self.args.steps_per_generation]

    @torch.no_grad()
    def generate_and_score(self, items: list[dict]) -> dict:
        """One generation batch (this process's collated ``items``) → the training batch it buffers, by the steps of
        the module docstring (:func:`group_permutation`: TRL's shuffle before the split).

        Returns:
            The prompt tensors plus ``completion_ids`` / ``completion_mask`` (B, C), ``advantages`` (B,),
            ``group_ids`` (B,), ``num_items_in_batch``, and when needed ``old_logps`` / ``ref_logps`` (B, C) and
            ``importance_weights``.
        """
        self.timings.clear()
        rollout, context = build_rollout(self, items), self.step_context()
        for recipe in self.recipes:
            rollout = recipe.resample(context, rollout, functools.partial(build_rollout, self))
        log_rollout(self, rollout)
        if self.args.steps_per_generation > 1:
            generation = self._micro_step // (self.args.steps_per_generation * self.args.num_iterations)
            rollout = rollout.select(group_permutation(rollout.group_ids, self.args.seed, self.state.global_step,
                                                       generation))
        batch = self.loss_inputs(rollout)
        for phase, seconds in self.timings.items():
            self._metrics[f"timing/{phase}"].append(seconds)
        return batch

    def loss_inputs(self, rollout) -> dict:
        """The loss batch of a rollout: zero-std groups masked (when a recipe asks, ``dynamic_sampling``),
        ``num_items_in_batch`` (active tokens, all processes), π_old log-probs when TRL's rule needs them
        (:func:`grpo.needs_old_logps`), π_ref's when β ≠ 0, then the recipes' additions (:meth:`Recipe.loss_inputs`)."""
        args = self.args
        batch, mask = dict(rollout.batch), rollout.completion_mask
        if any(recipe.drops_zero_std_groups for recipe in self.recipes):
            mask = mask * (~rollout.zero_std).unsqueeze(1).int()
        batch.update(completion_ids=rollout.completion_ids, completion_mask=mask, advantages=rollout.advantages,
                     group_ids=rollout.group_ids)
        batch["num_items_in_batch"] = self.accelerator.gather(mask.sum()).sum()
        if grpo.needs_old_logps(args.gradient_accumulation_steps, args.steps_per_generation, args.num_iterations,
                                self.rollout_engine.logps_need_correcting):
            with timed(self, "old_logps"):
                batch["old_logps"] = self._micro_batched(
                    lambda b: completion_logps(self.model, b, args.temperature, self.share_prompt), batch)
        if self.beta != 0.0:
            with timed(self, "ref"):
                batch["ref_logps"] = self._micro_batched(self._ref_logps, batch)
        self.call_recipes("loss_inputs", rollout, batch)
        return batch

    # ------------------------------------------------------------------------------------------------ loss
    def training_step(self, model, inputs, num_items_in_batch=None):
        start, self._prepare_time = time.perf_counter(), 0.0
        output = super().training_step(model, inputs, num_items_in_batch)
        self._micro_step += 1
        elapsed = time.perf_counter() - start
        self._step_time += elapsed
        self._update_time += elapsed - self._prepare_time
        if self._micro_step % getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps) == 0:
            self._metrics["step_time"].append(self._step_time)  # TRL 1.16's step_time
            self._metrics["timing/update"].append(self._update_time)
            self._step_time = self._update_time = 0.0
        return output

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if return_outputs:
            raise ValueError("GroundingGRPOTrainer does not return outputs")
        args = self.args
        needs_logits = any(recipe.needs_logits for recipe in self.recipes)
        forward = completion_logps(model, inputs, args.temperature, self.share_prompt, return_logits=needs_logits)
        logps, logits = forward if needs_logits else (forward, None)
        old_logps = inputs.get("old_logps")
        mask = inputs["completion_mask"]
        accumulation = getattr(self, "current_gradient_accumulation_steps", args.gradient_accumulation_steps)
        num_items = None
        if args.loss_type == "dapo":  # TRL: global active tokens, per process, per accumulation window
            num_items = grpo.dapo_normaliser(inputs["num_items_in_batch"], self.accelerator.num_processes,
                                             accumulation, args.steps_per_generation)
        out = grpo.grpo_loss(
            logps, logps.detach() if old_logps is None else old_logps, inputs["advantages"], mask,
            ref_logps=inputs.get("ref_logps"), beta=self.beta, use_bias_correction_kl=args.use_bias_correction_kl,
            epsilon_low=args.epsilon, epsilon_high=args.epsilon_high, loss_type=args.loss_type,
            max_completion_length=args.max_completion_length, num_items=num_items,
            importance_weights=inputs.get("importance_weights"))
        terms = self.call_recipes("loss_term", inputs, logits, num_items)
        out.loss = out.loss + sum(term for term in terms if term is not None)
        loss = out.loss if args.loss_type == "dapo" else out.loss / accumulation

        def global_mean(values):
            total = self.accelerator.reduce(grpo.masked_sum_count(values, mask), reduction="sum")
            return (total[0] / total[1].clamp(min=1.0)).item()

        if out.per_token_kl is not None:
            self._metrics["kl"].append(global_mean(out.per_token_kl))
        self._metrics["clip_ratio/low_mean"].append(global_mean(out.low_clipped.float()))
        self._metrics["clip_ratio/high_mean"].append(global_mean(out.high_clipped.float()))
        self._metrics["clip_ratio/region_mean"].append(global_mean(out.region_clipped.float()))
        self._metrics["ratio/mean"].append(global_mean(out.ratio))
        return loss

    # ------------------------------------------------------------------------------------------------ logs, saving
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add the averaged GRPO metrics (TRL's names) to Trainer's logs, then reset them."""
        metrics = {key: sum(v) / len(v) for key, v in self._metrics.items() if v}
        if "loss" not in logs:  # an evaluation log: nothing of ours to add
            return super().log(logs, start_time)
        if "data/skipped_samples" in metrics:
            metrics["data/skipped_samples"] = self._metrics["data/skipped_samples"][-1]  # a running count
        timing = sorted(key for key in metrics if key == "step_time" or key.startswith("timing/"))
        if timing and self.accelerator.num_processes > 1:  # the slowest process's seconds, the same on every rank
            seconds = torch.tensor([[metrics[key] for key in timing]], device=self.accelerator.device)
            metrics.update(zip(timing, self.accelerator.gather(seconds).max(dim=0).values.tolist()))
        self._metrics.clear()
        super().log({**logs, **metrics}, start_time)
        if self.args.log_completions and self.accelerator.is_main_process and self.completions is not None:
            write_completions(self)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """No loss forward: the callbacks' ``on_evaluate`` fill the metrics of ``eval_dataset`` (default:
        ``eval_file``'s) — the validation recipe's greedy evaluation
        (:class:`grounding_rl.update.recipes.validation.Validation`, a ``TrainerCallback``) — given the hooks'
        :class:`StepContext` as ``context``; they are then logged and returned (what ``metric_for_best_model`` reads).

        Raises:
            ValueError: no callback evaluated (the validation recipe is not installed).
        """
        metrics: dict[str, float] = {}
        self.control.should_evaluate = False  # as CallbackHandler.on_evaluate, which takes no context
        self.control = self.callback_handler.call_event(
            "on_evaluate", self.args, self.state, self.control, metrics=metrics, context=self.step_context(),
            eval_dataset=self.eval_dataset if eval_dataset is None else eval_dataset, dropped=self.eval_dropped,
            metric_key_prefix=metric_key_prefix)
        if not metrics:
            raise ValueError("evaluate: no recipe evaluates during training (the validation recipe is not installed)")
        self.log(metrics)
        return metrics

    def _save_checkpoint_extras(self, folder: str) -> None:
        """The rollout format and each recipe's state, before the checkpoint's mark
        (:class:`grounding_rl.update.checkpoints.CompleteCheckpointMixin`)."""
        write_rollout_format(folder)
        self.call_recipes("save", folder)
