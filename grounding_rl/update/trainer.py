"""``GroundingGRPOTrainer``: GRPO for video temporal grounding on ``transformers.Trainer``.

Why not TRL's ``GRPOTrainer``: in TRL 1.16 it generates with the video but computes the loss without it. This trainer
keeps TRL's structure, names and public helpers (``RepeatSampler``, ``unwrap_model_for_generation``,
``prepare_deepspeed``, ``selective_log_softmax``) and holds no math itself: the loss is in :mod:`.grpo`, the forward in
:mod:`.logprobs`, the tensors in :mod:`.batching`, sampling behind :class:`grounding_rl.rollout.generation.RolloutEngine`.

One step (TRL's schedule): the dataloader yields a *generation batch* (each clip repeated G times by the sampler, split
across processes); we build the prompt with the video, sample G completions per clip, score them with the weighted
rewards (gathered across processes so groups split between ranks are normalised together), compute advantages, and
— when needed — π_old and π_ref log-probs. The batch is buffered and cut into ``steps_per_generation`` micro-batches,
reused ``num_iterations`` times. The very same token ids (with Qwen3-VL's textual timestamps), ``pixel_values_videos``,
``video_grid_thw``, ``mm_token_type_ids`` (and Qwen2.5-VL's ``second_per_grid_ts``) go to generation, the policy
forward and the reference forward. With
``share_video_encoding`` (default) the batch keeps each distinct clip's patches once with a ``video_index``, so each
of the three runs the vision tower once per distinct clip and generation prefills each distinct prompt once.
"""
from __future__ import annotations

import logging
from collections import defaultdict

import torch
import torch.nn.functional as F
from accelerate.utils import gather_object, is_peft_model, set_seed
from transformers import Trainer
from trl.trainer.utils import nanstd

from grounding_rl.data.dataset import GroundingDataset, VideoCollator, filtered_repeat_sampler, resumable_repeat_sampler
from grounding_rl.data.missing import check_fraction
from grounding_rl.family import family_of
from grounding_rl.prompts.templates import answer_text
from grounding_rl.reward.parsing import parse_answer
from grounding_rl.reward.rewards import get_reward_funcs, reward_name, weighted_rewards
from grounding_rl.reward.shaping import tempsamp_shaping
from grounding_rl.models.vision import placeholder_token_ids
from grounding_rl.rollout.generation import SamplingParams, completion_mask, cut_at_tokens, make_rollout_engine
from grounding_rl.update import batching, grpo
from grounding_rl.update.config import EVAL_METRICS, GroundingGRPOConfig
from grounding_rl.update.logprobs import completion_logps
from grounding_rl.update.resume import ExactResumeMixin
from grounding_rl.update.saving import GroundingSaveMixin

logger = logging.getLogger(__name__)

ONLINE_FILTER_FILE = "online_filter.json"  # the online difficulty filter's state, in every checkpoint


class GroundingGRPOTrainer(ExactResumeMixin, GroundingSaveMixin, Trainer):
    """GRPO trainer for Qwen-VL models (any family of :mod:`grounding_rl.family`) on (video, query, start, end)
    samples.

    Args:
        model: the policy (a loaded model, PEFT-wrapped for LoRA: :func:`grounding_rl.cli.common.load_training_model`;
            with a PEFT model the reference is the adapter-free base).
        args: :class:`GroundingGRPOConfig`.
        train_dataset: :class:`GroundingDataset`.
        processing_class: the model's processor.
        reward_funcs: callables ``fn(completions, **columns) -> list[float]`` or registry names; None =
            ``args.reward_funcs``.
        ref_model: the reference model when β > 0 and the policy is not a PEFT model (see :meth:`_build_ref_model`);
            None loads it from the policy's path.
        rollout_engine: a :class:`RolloutEngine`; None = :class:`HFGenerateEngine`.
        frame_cache: optional frame cache passed to :func:`grounding_rl.data.video.sample_frames`.
        callbacks: extra ``TrainerCallback`` objects.
        max_missing_fraction: stop (``UserError``) once more than this share of the distinct videos turned out
            unreadable (:func:`grounding_rl.data.missing.check_fraction`); 1.0 = never, substitutes only.
        eval_dataset: :class:`grounding_rl.data.samples.Sample` objects that :meth:`evaluate` scores greedily
            (``eval_file``; needed when ``eval_strategy`` is not ``"no"``).
        eval_dropped: lines of the eval file the validation policy dropped (the ``standard`` scoring counts them).

    Difficulty-aware data (:mod:`grounding_rl.data.difficulty`): ``difficulty_range`` / ``difficulty_sampling``
    select the training samples once, here (:attr:`data_selection` holds the counts); ``online_difficulty_range``
    drops samples after each epoch (:attr:`online_filter`, saved in every checkpoint as ``online_filter.json``).
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
        self.num_generations = args.num_generations
        self.sampling = SamplingParams(args.max_completion_length, args.temperature, args.top_p, args.top_k,
                                       args.repetition_penalty)
        train_dataset = self._select_training_data(train_dataset, args)
        # frames sized for the model's vision tower (its family's pixel factor)
        collator = VideoCollator(train_dataset, family_of(model).video_settings(args.video_settings), cache=frame_cache)
        super().__init__(model=model, args=args, train_dataset=train_dataset, data_collator=collator,
                         eval_dataset=eval_dataset, processing_class=processing_class, callbacks=callbacks)
        self.model_accepts_loss_kwargs = False
        # Trainer seeded every rank alike; sampling must differ between ranks, or the rows of a group that sit on
        # different ranks would draw identical completions (TRL does the same)
        set_seed(args.seed, device_specific=True)
        self.ref_model = self._build_ref_model(ref_model)
        self.share_prompt = self._prefix_sharing()
        self.rollout_engine = rollout_engine or make_rollout_engine(args, self.accelerator, self.model,
                                                                    processing_class)
        eos = self.accelerator.unwrap_model(self.model).generation_config.eos_token_id
        if eos is None:
            eos = processing_class.tokenizer.eos_token_id
        self.eos_token_ids = [eos] if isinstance(eos, int) else list(eos)
        pad = processing_class.tokenizer.pad_token_id
        self.pad_token_id = self.eos_token_ids[0] if pad is None else pad
        self.placeholder_ids = placeholder_token_ids(self.model)
        self._metrics = defaultdict(list)
        self._step = 0
        self._buffered_inputs = None
        self._skipped_total = 0
        self._unreadable_videos: set[str] = set()
        self._num_videos = len({sample["video"] for sample in train_dataset.samples})
        self.max_missing_fraction = max_missing_fraction
        self._completions = None  # the last generation batch, for log_completions
        self.eval_dropped = eval_dropped
        self.online_filter, self._filter_column = None, None
        if args.online_difficulty_range is not None:
            from grounding_rl.data.difficulty import OnlineRangeFilter

            names = [n for n in ("iou", "tiou") if n in self.reward_func_names]
            if not names:
                raise ValueError(f"online_difficulty_range filters on the 'iou' (or 'tiou') reward, which reward_funcs "
                                 f"{self.reward_func_names} do not have")
            self._filter_column = self.reward_func_names.index(names[0])
            self.online_filter = OnlineRangeFilter(len(self.train_dataset), *args.online_difficulty_range)

    # ------------------------------------------------------------------------------------------------ models
    def _build_ref_model(self, ref_model):
        """None when β = 0 or with PEFT (adapter disabled instead); else a frozen copy, DeepSpeed-initialised
        (``trl.models.prepare_deepspeed``: ZeRO-3 sharded like the policy, no optimizer) or accelerate-prepared."""
        if self.args.beta == 0.0 or is_peft_model(self.model):
            return None
        if ref_model is None:
            from grounding_rl.models.loading import load_reference

            unwrapped = self.accelerator.unwrap_model(self.model)
            ref_model = load_reference(unwrapped.config._name_or_path,
                                       dtype=str(unwrapped.dtype).removeprefix("torch."),
                                       attn_implementation=unwrapped.config._attn_implementation)
        ref_model.eval().requires_grad_(False)
        if self.is_deepspeed_enabled:
            from trl.models import prepare_deepspeed

            return prepare_deepspeed(ref_model, self.accelerator)
        return self.accelerator.prepare_model(ref_model, evaluation_mode=True)

    def _prefix_sharing(self) -> bool:
        """``share_prompt_prefix`` where it applies; otherwise one warning and the per-row forward."""
        if not self.args.share_prompt_prefix:
            return False
        from grounding_rl.update.prefix import supports_prefix_sharing

        ok, why = supports_prefix_sharing(self.model)
        if ok and not self.args.share_video_encoding:
            ok, why = False, "share_video_encoding is off"
        if not ok:
            logger.warning("share_prompt_prefix: %s; the policy and reference forwards run per row", why)
        return ok

    def _ref_logps(self, batch):
        if self.ref_model is not None:
            return completion_logps(self.ref_model, batch, self.args.temperature, self.share_prompt)
        with self.accelerator.unwrap_model(self.model).disable_adapter():
            return completion_logps(self.model, batch, self.args.temperature, self.share_prompt)

    def train(self, resume_from_checkpoint=None, **kwargs):
        """``Trainer.train``, refusing a checkpoint inside a generation window (see
        :attr:`GroundingGRPOConfig.generation_window`; only a checkpoint at ``max_steps``, from which nothing is left
        to train, may sit inside one).

        Raises:
            UserError: ``resume_from_checkpoint`` is inside a generation window of this run's settings.
        """
        if resume_from_checkpoint is True:  # Trainer's "the last checkpoint of output_dir" (it raises for none)
            import os

            from transformers.trainer_utils import get_last_checkpoint

            found = get_last_checkpoint(self.args.output_dir) if os.path.isdir(self.args.output_dir) else None
            resume_from_checkpoint = found or True
        if isinstance(resume_from_checkpoint, str):
            from grounding_rl.errors import UserError
            from grounding_rl.update.resume import checkpoint_global_step

            step, window = checkpoint_global_step(resume_from_checkpoint), self.args.generation_window
            if step is not None and step % window and not 0 < self.args.max_steps <= step:
                raise UserError(
                    f"{resume_from_checkpoint}: step {step} is inside a generation window of {window} optimizer steps "
                    "(steps_per_generation × num_iterations / gradient_accumulation_steps); resume from a checkpoint "
                    f"at a multiple of {window}, or with the settings that wrote it")
            self._load_online_filter(resume_from_checkpoint)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    # ------------------------------------------------------------------------------------------------ data
    def get_train_dataloader(self):
        # TRL's change to Trainer.get_train_dataloader: one batch = per_device × steps_per_generation rows
        return self._get_dataloader(self.train_dataset, "Training",
                                    self._train_batch_size * self.args.steps_per_generation,
                                    sampler_fn=self._get_train_sampler, is_training=True)

    def _get_train_sampler(self, dataset=None):
        """TRL's sampler: each clip G times in a row, the same order on every rank (seeded), the generation batch
        repeated ``num_iterations × steps_per_generation`` times so buffered generations line up with the data; each
        epoch's order is the same when resumed (:func:`grounding_rl.data.dataset.resumable_repeat_sampler`). With
        ``online_difficulty_range``, over the samples the filter keeps
        (:func:`grounding_rl.data.dataset.filtered_repeat_sampler`). Seeded by ``data_seed`` when set, else ``seed``
        (``TrainingArguments``' rule for its samplers; TRL's GRPO sampler reads ``seed`` only)."""
        data_seed = self.args.seed if self.args.data_seed is None else self.args.data_seed
        if self.online_filter is not None:
            return filtered_repeat_sampler(
                data_source=dataset if dataset is not None else self.train_dataset, selection=self.online_filter,
                mini_repeat_count=self.num_generations,
                batch_size=self.args.generation_batch_size // self.num_generations,
                repeat_count=self.args.num_iterations * self.args.steps_per_generation, seed=data_seed,
                on_advance=self._log_online_filter)
        return resumable_repeat_sampler(
            data_source=dataset if dataset is not None else self.train_dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.args.num_iterations * self.args.steps_per_generation,
            shuffle=self.args.shuffle_dataset,
            seed=data_seed,
        )

    # ------------------------------------------------------------------------------------------------ difficulty
    def _select_training_data(self, dataset: GroundingDataset, args) -> GroundingDataset:
        """The samples to train on after the offline ``difficulty_range`` / ``difficulty_sampling`` selection
        (:func:`grounding_rl.data.difficulty.select_samples`, seeded by ``seed``: the same on every rank); the
        counts are logged and kept as :attr:`data_selection`."""
        from grounding_rl.data.difficulty import select_samples

        indices, counts = select_samples(
            dataset.samples, sampling=args.difficulty_sampling, score_range=args.difficulty_range,
            mean=args.difficulty_gaussian_mean, std=args.difficulty_gaussian_std, num_bins=args.difficulty_num_bins,
            subset_size=args.difficulty_subset_size, duration_edges=args.difficulty_duration_edges, seed=args.seed)
        self.data_selection = counts
        if len(indices) == len(dataset):
            if args.difficulty_sampling == "timelens":
                logger.warning("difficulty_sampling timelens: difficulty_subset_size %d keeps all %d samples, so the "
                               "weighting changes nothing; lower difficulty_subset_size", args.difficulty_subset_size,
                               len(dataset))
            return dataset
        logger.info("difficulty selection: kept %(kept)d of %(samples)d samples (range filter dropped "
                    "%(range_dropped_low)d at or below its low end and %(range_dropped_high)d above its high end; "
                    "TimeLens's draw reweighted %(reweighted)d and drew %(drawn)d)", counts)
        return GroundingDataset([dataset.samples[i] for i in indices])

    def _observe_difficulty(self, items, rewards_per_func, is_gt) -> None:
        """Feed the online filter this draw's IoU rewards (all ranks' rows, in gather order); an injected
        ground-truth row (``use_gt_injection``) is not the policy's and is left out."""
        if self.online_filter is None:
            return
        device = rewards_per_func.device
        indices = self.accelerator.gather(torch.tensor([it["index"] for it in items], device=device))
        sampled = ~self.accelerator.gather(is_gt.to(device))
        self.online_filter.observe(indices[sampled].tolist(), rewards_per_func[sampled, self._filter_column].tolist())

    def _log_online_filter(self, counts: dict) -> None:
        if self.accelerator.is_main_process:
            logger.info("online difficulty filter after epoch %(epoch)d: kept %(kept)d, dropped %(dropped)d "
                        "(%(dropped_low)d at or below the range, %(dropped_high)d above it), %(unscored)d unscored "
                        "and kept", counts)
        for key in ("kept", "dropped", "dropped_low", "dropped_high", "unscored"):
            self._metrics[f"data/online_{key}"].append(float(counts[key]))

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.online_filter is not None and self.args.should_save:
            import json
            import os

            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = os.path.join(self._get_output_dir(trial=trial),
                                  f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            with open(os.path.join(folder, ONLINE_FILTER_FILE), "w", encoding="utf-8") as handle:
                json.dump(self.online_filter.state_dict(), handle)

    def _load_online_filter(self, checkpoint: str) -> None:
        """Restore the online filter's state from ``checkpoint`` (no-op without ``online_difficulty_range``).

        Raises:
            UserError: the checkpoint has no ``online_filter.json`` or one for another training set or range.
        """
        if self.online_filter is None:
            return
        import json
        import os

        from grounding_rl.errors import UserError

        path = os.path.join(checkpoint, ONLINE_FILTER_FILE)
        if not os.path.isfile(path):
            raise UserError(f"{checkpoint}: no {ONLINE_FILTER_FILE}; it was written without online_difficulty_range, "
                            "so it cannot resume a run with it")
        with open(path, encoding="utf-8") as handle:
            try:
                self.online_filter.load_state_dict(json.load(handle))
            except ValueError as err:
                raise UserError(f"{path}: {err}") from None

    # ------------------------------------------------------------------------------------------------ validation
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Greedy evaluation of the policy on ``eval_dataset`` (default: the trainer's, from ``eval_file``), with the
        code of ``grounding-rl eval`` (:func:`grounding_rl.rollout.runner.greedy_answer_batches`, records and both
        scorings from :mod:`grounding_rl.reward.records`); each rank answers a shard of whole videos. Replaces
        ``Trainer.evaluate``, which would run a loss forward.

        Each rank decodes its shard alone (``synced_gpus=False``: under ZeRO-3 the parameters are gathered for it,
        ``ds3_gather_for_generation``), however many batches the other ranks have. The random states (torch, numpy,
        Python) are restored afterwards, so a run with validation trains exactly as
        one without. Generation budget: ``max_completion_length``; batch: ``per_device_eval_batch_size``; decoding
        workers: ``dataloader_num_workers``.

        Returns:
            ``{prefix_R1@0.3, …, prefix_mIoU, prefix_parse_failure_rate, prefix_format_rate`` (standard scoring)
            ``, prefix_clamped_R1@0.3, …, prefix_clamped_mIoU, prefix_n}``, also logged; ``metric_for_best_model``
            names one of them.

        Raises:
            ValueError: no evaluation samples, or ZeRO-3 without ``ds3_gather_for_generation`` (shards of different
                sizes would leave ranks waiting on each other's parameter gathers).
        """
        samples = list((self.eval_dataset if eval_dataset is None else eval_dataset) or [])
        if not samples:
            raise ValueError("evaluate: no evaluation samples (eval_file)")
        if (self.is_deepspeed_enabled and not self.args.ds3_gather_for_generation
                and self.accelerator.state.deepspeed_plugin.zero_stage == 3):
            raise ValueError("validation during training under ZeRO-3 needs ds3_gather_for_generation: true")
        from grounding_rl.reward.records import metrics_from_records

        records = self._greedy_records(samples)
        metrics = metrics_from_records(records, self.args.prompt_template, self.eval_dropped)
        out = {f"{metric_key_prefix}_{key}": float(metrics[key]) for key in ("n", *EVAL_METRICS[:6])}
        clamped = metrics["by_scoring"]["clamped"]
        out.update({f"{metric_key_prefix}_clamped_{key}": float(clamped[key])
                    for key in ("R1@0.3", "R1@0.5", "R1@0.7", "mIoU")})
        self.log(out)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, out)
        return out

    def _greedy_records(self, samples) -> list:
        """Prediction records of ``samples`` in their order, every rank's shard gathered (the policy in eval mode,
        unwrapped as for generation; random states kept)."""
        import random

        import numpy as np
        from trl.models import unwrap_model_for_generation

        from grounding_rl.reward.records import prediction_record
        from grounding_rl.rollout.runner import greedy_answer_batches, group_by_video, shard_by_video

        acc, args = self.accelerator, self.args
        groups = shard_by_video(group_by_video([s.video for s in samples]), acc.process_index, acc.num_processes)
        mine = [p for _, positions in groups for p in positions]
        cache = self.data_collator.cache
        cache_root = str(cache.root) if getattr(cache, "root", None) is not None else None
        python_state, numpy_state = random.getstate(), np.random.get_state()
        devices = [acc.device] if acc.device.type == "cuda" else []
        training = self.model.training
        local = []
        try:
            with torch.random.fork_rng(devices=devices):
                self.model.eval()
                with unwrap_model_for_generation(self.model_wrapped, acc,
                                                 gather_deepspeed3_params=args.ds3_gather_for_generation,
                                                 gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs
                                                 ) as unwrapped:
                    for batch in greedy_answer_batches(
                            unwrapped, self.processing_class, [samples[p].video for p in mine],
                            [samples[p].query for p in mine], self.data_collator.settings, args.prompt_template,
                            args.max_completion_length, args.per_device_eval_batch_size, args.dataloader_num_workers,
                            cache_root, getattr(cache, "max_bytes", 0), synced_gpus=False,
                            video_layout=args.video_layout):
                        local += [(mine[k], prediction_record(samples[mine[k]], answer, error))
                                  for k, answer, error in batch]
        finally:
            self.model.train(training)
            random.setstate(python_state)
            np.random.set_state(numpy_state)
        return [record for _, record in sorted(gather_object(local), key=lambda pair: pair[0])]

    # ------------------------------------------------------------------------------------------------ rollout
    def _prepare_inputs(self, generation_batch):
        """Generate once per ``steps_per_generation × num_iterations`` steps; return this step's micro-batch."""
        generate_every = self.args.steps_per_generation * self.args.num_iterations
        if self._buffered_inputs is None:  # first step of this run, fresh or resumed (at a window boundary: train())
            self._step = self.state.global_step * self.args.gradient_accumulation_steps
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            rollout = self._generate_and_score(generation_batch)
            self._buffered_inputs = batching.split_rows(rollout, self.args.steps_per_generation)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _check_prompt_lengths(self, batch, items):
        limit = self.args.max_prompt_length
        if limit is None:
            return
        lengths = batch["prompt_mask"].sum(dim=1).tolist()
        for length, item in zip(lengths, items):
            if length > limit:
                raise ValueError(
                    f"sample {item['index']} (qid {item['qid']}, {item['video']}): prompt is {length} tokens, more "
                    f"than max_prompt_length {limit}; prompts are never truncated (that would cut video tokens): "
                    "lower video_fps / video_max_pixels / video_total_pixels or raise max_prompt_length")

    def _score(self, items, completions):
        """(B_local, F) rewards, NaN where a function returned None."""
        columns = {key: [item[key] for item in items] for key in ("start", "end", "duration", "query", "qid")}
        columns["prompt_template"] = [self.args.prompt_template] * len(items)
        per_func = torch.full((len(items), len(self.reward_funcs)), float("nan"))
        for j, func in enumerate(self.reward_funcs):
            values = func(completions=completions, **columns)
            per_func[:, j] = torch.tensor([float("nan") if v is None else float(v) for v in values])
        return per_func

    @torch.no_grad()
    def _generate_and_score(self, items: list[dict]) -> dict:
        """One generation batch → the buffered training batch: prompt tensors, completions (the ground truth
        injected with ``use_gt_injection``), advantages, and π_old / π_ref log-probs when needed. With
        ``dynamic_sampling``, further batches are drawn first (:meth:`_dynamic_sampling`)."""
        args = self.args
        draw = self._rollout(items)
        if args.dynamic_sampling:
            draw = self._dynamic_sampling(draw)
        batch, mask = draw["batch"], draw["completion_mask"]
        if args.drop_zero_std_groups or args.dynamic_sampling:
            mask = mask * (~draw["zero_std"]).unsqueeze(1).int()
        batch.update(completion_ids=draw["completion_ids"], completion_mask=mask, advantages=draw["advantages"])
        batch["num_items_in_batch"] = self.accelerator.gather(mask.sum()).sum()
        if grpo.needs_old_logps(args.gradient_accumulation_steps, args.steps_per_generation, args.num_iterations,
                                self.rollout_engine.logps_need_correcting):
            batch["old_logps"] = self._micro_batched(
                lambda b: completion_logps(self.model, b, args.temperature, self.share_prompt), batch)
        if args.beta != 0.0:
            batch["ref_logps"] = self._micro_batched(self._ref_logps, batch)
        if args.use_vllm and args.vllm_importance_sampling_correction and draw.get("sampling_logps") is not None:
            self._correct_for_engine(batch, draw["sampling_logps"], mask)
        return batch

    def _rollout(self, items: list[dict]) -> dict:
        """Generate G completions per clip of this process's ``items``, score them (rewards gathered so that a
        group split across processes is normalised as one) and log the rollout metrics.

        Returns:
            ``items``, ``batch`` (prompt tensors on the device), ``completion_ids`` / ``completion_mask`` (B, C),
            ``advantages`` (B,), ``zero_std`` (B,) bool — the row's group has equal rewards —, ``is_gt`` (B,) bool —
            the row holds the injected ground truth.
        """
        device, args = self.accelerator.device, self.args
        batch = batching.prompt_batch(self.processing_class, items, args.prompt_template,
                                      share_videos=args.share_video_encoding, video_layout=args.video_layout)
        self._check_prompt_lengths(batch, items)
        batch = batching.to_device(batch, device)

        completion_ids = self.rollout_engine.generate(self.model_wrapped, batching.generation_inputs(batch, items),
                                                      self.sampling)
        sampling_logps = getattr(self.rollout_engine, "sampling_logps", None)  # vLLM's own, for the IS correction
        # a sampled vision placeholder would break every later forward: cut the completion before it
        sampled, keep = cut_at_tokens(completion_ids, self.placeholder_ids, self.pad_token_id)
        placeholder_cut = (completion_mask(completion_ids, self.eos_token_ids)[0] * (1 - keep)).bool().any(dim=1)
        start = self.accelerator.process_index * len(items)
        is_gt = grpo.injected_rows(start, len(items), self.num_generations, device) if args.use_gt_injection \
            else torch.zeros(len(items), dtype=torch.bool, device=device)
        completion_ids = self._inject_ground_truth(sampled, items, is_gt) if args.use_gt_injection else sampled
        if sampling_logps is not None:  # not sampled by the engine (injected, or past its width): NaN = no correction
            sampling_logps = F.pad(sampling_logps.float(), (0, completion_ids.size(1) - sampling_logps.size(1)),
                                   value=float("nan"))
            sampling_logps[is_gt] = float("nan")
        mask, truncated = completion_mask(completion_ids, self.eos_token_ids)
        # positions past the sampled width (the injected answer widened the batch) were never sampled
        keep = F.pad(keep, (0, completion_ids.size(1) - keep.size(1)), value=0)
        keep[is_gt] = 1
        beyond = (mask * (1 - keep)).bool().any(dim=1)  # the mask ran past a cut or the sampled width: no EOS there
        mask, truncated = mask * keep, truncated | beyond
        self._metrics["completions/placeholder_cut_ratio"].append(
            self.accelerator.gather((placeholder_cut & ~is_gt).float()).mean().item())
        lengths = mask.sum(dim=1)
        if args.mask_truncated_completions:
            mask = mask * (~truncated).unsqueeze(1).int()
        texts = self.processing_class.batch_decode(
            [ids[:n] for ids, n in zip(completion_ids.tolist(), lengths.tolist())], skip_special_tokens=True)

        rewards_per_func = self.accelerator.gather(self._score(items, texts).to(device))
        self._observe_difficulty(items, rewards_per_func, is_gt)  # the IoU rewards as scored, before any shaping
        if args.reward_shaping == "tempsamp":
            rewards_per_func = rewards_per_func.clone()
            for j, name in enumerate(self.reward_func_names):
                if name == "iou":
                    rewards_per_func[:, j] = tempsamp_shaping(rewards_per_func[:, j], args.reward_shaping_threshold,
                                                              args.reward_shaping_alpha)
        weighted = weighted_rewards(rewards_per_func, self.reward_weights)
        adv = grpo.group_advantages(weighted, self.num_generations, args.scale_rewards)
        local = slice(start, start + len(items))
        self._log_rollout(items, texts, rewards_per_func, weighted, adv, lengths, truncated,
                          self.accelerator.gather(is_gt))
        if args.log_completions:
            self._completions = {"query": gather_object([it["query"] for it in items]),
                                 "qid": gather_object([it["qid"] for it in items]),
                                 "completion": gather_object(texts),
                                 "rewards": rewards_per_func.cpu(), "advantage": adv.advantages.cpu()}
        return {"items": items, "batch": batch, "completion_ids": completion_ids, "completion_mask": mask,
                "advantages": adv.advantages[local], "zero_std": adv.group_zero_std[local], "is_gt": is_gt,
                "sampling_logps": sampling_logps}

    def _inject_ground_truth(self, completion_ids, items, is_gt):
        """``completion_ids`` with the rows of ``is_gt`` replaced by the ground-truth answer
        (:func:`grounding_rl.prompts.templates.answer_text` in the run's template, then EOS), widened if needed.

        Raises:
            UserError: a ground-truth answer does not fit in ``max_completion_length`` tokens.
        """
        from grounding_rl.errors import UserError

        tokenizer = self.processing_class.tokenizer
        rows = is_gt.nonzero().flatten().tolist()
        if not rows:
            return completion_ids
        answers = []
        for r in rows:
            item = items[r]
            text = answer_text(item["start"], item["end"], template=self.args.prompt_template)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [self.eos_token_ids[0]]
            if len(ids) > self.args.max_completion_length:
                raise UserError(f"use_gt_injection: the ground-truth answer of sample {item['index']} (qid "
                                f"{item['qid']}) is {len(ids)} tokens with EOS, more than max_completion_length "
                                f"{self.args.max_completion_length}; raise max_completion_length")
            answers.append(ids)
        width = max(completion_ids.size(1), max(len(ids) for ids in answers))
        pad = self.pad_token_id
        out = completion_ids.new_full((completion_ids.size(0), width), pad)
        out[:, :completion_ids.size(1)] = completion_ids
        for r, ids in zip(rows, answers):
            out[r] = pad
            out[r, :len(ids)] = torch.tensor(ids, dtype=out.dtype, device=out.device)
        return out

    def _dynamic_sampling(self, first: dict) -> dict:
        """DAPO's dynamic sampling over :meth:`_rollout` draws (see ``GroundingGRPOConfig.dynamic_sampling``).

        Every process keeps its groups with non-zero reward std, draw after draw, until the process with the fewest
        holds a generation batch's worth (a global minimum, so all processes draw equally often) or
        ``max_num_gen_batches`` batches were drawn. Each process then trains on exactly its usual number of rows:
        its first kept groups in draw order, filled up with zero-std groups of the first draw (masked out of the
        loss by the caller). Under ``scale_rewards: batch`` a group's std is that of the draw it came from.
        """
        args, G = self.args, self.num_generations
        groups = len(first["items"]) // G
        draws = [first]
        kept = [(0, g) for g in grpo.kept_groups(first["zero_std"], G)]
        while len(draws) < args.max_num_gen_batches:
            fewest = self.accelerator.gather(torch.tensor([len(kept)], device=self.accelerator.device)).min().item()
            if fewest >= groups:
                break
            draw = self._rollout(self._extra_generation_batch(len(draws)))
            kept += [(len(draws), g) for g in grpo.kept_groups(draw["zero_std"], G)]
            draws.append(draw)
        chosen = kept[:groups]
        chosen += [(0, g) for g in range(groups) if (0, g) not in chosen][:groups - len(chosen)]
        counts = torch.tensor([len(draws) * groups, groups - min(len(kept), groups), max(len(kept) - groups, 0)],
                              device=self.accelerator.device)
        drawn, filled, surplus = self.accelerator.gather(counts.unsqueeze(0)).sum(dim=0).tolist()
        self._metrics["dynamic_sampling/gen_batches"].append(float(len(draws)))
        self._metrics["dynamic_sampling/groups_drawn"].append(float(drawn))
        self._metrics["dynamic_sampling/groups_dropped"].append(float(drawn - (groups * self.accelerator.num_processes
                                                                               - filled)))
        self._metrics["dynamic_sampling/groups_filled"].append(float(filled))
        if len(draws) == 1 and chosen == [(0, g) for g in range(groups)]:
            return first
        rows = [(d, g * G + j) for d, g in chosen for j in range(G)]
        items = [draws[d]["items"][r] for d, r in rows]
        batch = batching.to_device(batching.prompt_batch(self.processing_class, items, args.prompt_template,
                                                         share_videos=args.share_video_encoding,
                                                         video_layout=args.video_layout),
                                   self.accelerator.device)
        width = max(draw["completion_ids"].size(1) for draw in draws)
        widen = {"completion_ids": self.pad_token_id, "completion_mask": 0, "sampling_logps": float("nan")}

        def stacked(key):
            values = [draw[key] if key not in widen else
                      torch.nn.functional.pad(draw[key], (0, width - draw[key].size(1)), value=widen[key])
                      for draw in draws]
            return torch.stack([values[d][r] for d, r in rows])

        keys = ("completion_ids", "completion_mask", "advantages", "zero_std", "is_gt")
        out = {key: stacked(key) for key in keys + (("sampling_logps",) if first.get("sampling_logps") is not None
                                                    else ())}
        return {"items": items, "batch": batch, **out}

    def _extra_generation_batch(self, draw: int) -> list[dict]:
        """This process's share of the ``draw``-th extra generation batch of this step: generation_batch_size / G
        clips drawn without replacement (with replacement from a smaller set), G rows each, the same on every
        process (seeded by the run's seed, the global step and ``draw``, so a resumed run draws the same)."""
        # with online_difficulty_range, from the samples the filter keeps
        pool = list(range(len(self.train_dataset))) if self.online_filter is None else self.online_filter.active
        G, size = self.num_generations, len(pool)
        groups = self.args.generation_batch_size // G
        generator = torch.Generator().manual_seed(self.args.seed * 1_000_003 + self.state.global_step * 1_009 + draw)
        picks = (torch.randperm(size, generator=generator)[:groups] if size >= groups
                 else torch.randint(size, (groups,), generator=generator))
        rows = [pool[i] for i in picks.repeat_interleave(G).tolist()]
        local = len(rows) // self.accelerator.num_processes
        mine = rows[self.accelerator.process_index * local:(self.accelerator.process_index + 1) * local]
        return self.data_collator([self.train_dataset[i] for i in mine])

    def _correct_for_engine(self, batch, sampling_logps, mask):
        """TRL 1.16's vLLM importance-sampling correction (:func:`grpo.engine_importance_weights`) into the batch, and
        its metrics (``sampling/sampling_logp_difference/{mean,max}``, ``sampling/importance_sampling_ratio/*``)."""
        args, gather = self.args, self.accelerator.gather
        out = grpo.engine_importance_weights(
            batch["old_logps"], sampling_logps.to(batch["old_logps"].device), mask,
            args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_min,
            args.vllm_importance_sampling_clip_max)
        batch["importance_weights"] = out.weights
        stats = gather(torch.tensor([[out.logp_difference_mean, out.logp_difference_max, out.ratio_min,
                                      out.ratio_mean, out.ratio_max]], device=self.accelerator.device))
        metrics = self._metrics
        metrics["sampling/sampling_logp_difference/mean"].append(stats[:, 0].mean().item())
        metrics["sampling/sampling_logp_difference/max"].append(stats[:, 1].max().item())
        metrics["sampling/importance_sampling_ratio/min"].append(stats[:, 2].min().item())
        metrics["sampling/importance_sampling_ratio/mean"].append(stats[:, 3].mean().item())
        metrics["sampling/importance_sampling_ratio/max"].append(stats[:, 4].max().item())

    def _micro_batched(self, fn, batch):
        """Apply a forward ``fn`` per micro-batch of ``per_device_train_batch_size`` rows (bounded memory)."""
        parts = batching.split_rows(batch, self.args.steps_per_generation)
        return torch.cat([fn(part) for part in parts], dim=0)

    def _log_rollout(self, items, texts, rewards_per_func, weighted, adv, lengths, truncated, is_gt):
        """TRL's rollout metrics over the sampled completions (the injected ground truth left out, as TempSamp-R1's
        ``gt_log_exclude``); ``gt/advantage`` is the injected rows' mean advantage. ``is_gt`` is gathered (N,)."""
        metrics, gather = self._metrics, self.accelerator.gather
        sampled = ~is_gt
        for j, name in enumerate(self.reward_func_names):
            metrics[f"rewards/{name}/mean"].append(torch.nanmean(rewards_per_func[sampled, j]).item())
            metrics[f"rewards/{name}/std"].append(nanstd(rewards_per_func[sampled, j]).item())
        metrics["reward"].append(torch.nanmean(weighted[sampled]).item())
        metrics["reward_std"].append(nanstd(weighted[sampled]).item())
        metrics["frac_reward_zero_std"].append(adv.zero_std.float().mean().item())
        if is_gt.any():
            metrics["gt/advantage"].append(adv.advantages[is_gt].mean().item())
        all_lengths = gather(lengths)[sampled]
        metrics["completions/mean_length"].append(all_lengths.float().mean().item())
        clipped = gather(truncated.int())[sampled].float().mean().item()
        metrics["completions/clipped_ratio"].append(clipped)
        if clipped == 1.0 and self.accelerator.is_main_process:
            logger.warning("every completion of this batch hit max_completion_length (%d tokens): answers are cut "
                           "off, rewards carry no signal; raise max_completion_length", self.args.max_completion_length)
        unparsed = [parse_answer(t) is None for t, gt in zip(gather_object(texts), is_gt.tolist()) if not gt]
        metrics["parse_failure_rate"].append(sum(unparsed) / max(len(unparsed), 1))
        skipped = len({it["substituted_from"] for it in items if it.get("substituted_from") is not None})
        self._skipped_total += int(gather(torch.tensor([skipped], device=self.accelerator.device)).sum().item())
        metrics["data/skipped_samples"].append(float(self._skipped_total))
        failed = gather_object([it["substituted_from"] for it in items if it.get("substituted_from") is not None])
        self._unreadable_videos.update(self.train_dataset.samples[i]["video"] for i in failed)
        check_fraction(sorted(self._unreadable_videos), self._num_videos, self.max_missing_fraction,
                       "training: unreadable", "check the videos (grounding-rl prepare --video-root lists them)")

    # ------------------------------------------------------------------------------------------------ loss
    def training_step(self, model, inputs, num_items_in_batch=None):
        output = super().training_step(model, inputs, num_items_in_batch)
        self._step += 1
        return output

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if return_outputs:
            raise ValueError("GroundingGRPOTrainer does not return outputs")
        args = self.args
        logps = completion_logps(model, inputs, args.temperature, self.share_prompt)
        old_logps = inputs.get("old_logps")
        mask = inputs["completion_mask"]
        accumulation = getattr(self, "current_gradient_accumulation_steps", args.gradient_accumulation_steps)
        num_items = None
        if args.loss_type == "dapo":  # TRL: global active tokens, per process, per accumulation window
            num_items = grpo.dapo_normaliser(inputs["num_items_in_batch"], self.accelerator.num_processes,
                                             accumulation, args.steps_per_generation)
        out = grpo.grpo_loss(
            logps, logps.detach() if old_logps is None else old_logps, inputs["advantages"], mask,
            ref_logps=inputs.get("ref_logps"), beta=args.beta, use_bias_correction_kl=args.use_bias_correction_kl,
            epsilon_low=args.epsilon,
            epsilon_high=args.epsilon_high, loss_type=args.loss_type,
            max_completion_length=args.max_completion_length, num_items=num_items,
            importance_weights=inputs.get("importance_weights"))
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

    def grounding_config(self):
        """The config's settings, with the reward functions this trainer actually scores with (by logged name)."""
        import dataclasses

        return dataclasses.replace(self.args.grounding_config(), reward_funcs=list(self.reward_func_names))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add the averaged GRPO metrics (TRL's names) to Trainer's logs, then reset them."""
        metrics = {key: sum(v) / len(v) for key, v in self._metrics.items() if v}
        if "loss" not in logs:  # an evaluation log: nothing of ours to add
            return super().log(logs, start_time)
        if "data/skipped_samples" in metrics:
            metrics["data/skipped_samples"] = self._metrics["data/skipped_samples"][-1]  # a running count
        self._metrics.clear()
        super().log({**logs, **metrics}, start_time)
        if self.args.log_completions and self.accelerator.is_main_process and self._completions is not None:
            self._write_completions()

    def _write_completions(self) -> None:
        """TRL's ``log_completions``: the last generation batch's queries, completions, rewards and advantages, as
        JSON lines in ``output_dir/completions.jsonl`` (and a ``wandb`` table when that run is active)."""
        import json
        from pathlib import Path

        logged, limit = self._completions, self.args.num_completions_to_print
        rows = []
        for i, completion in enumerate(logged["completion"][:limit]):
            rewards = {name: None if torch.isnan(logged["rewards"][i, j]) else float(logged["rewards"][i, j])
                       for j, name in enumerate(self.reward_func_names)}
            rows.append({"step": self.state.global_step, "qid": logged["qid"][i], "query": logged["query"][i],
                         "completion": completion, "rewards": rewards, "advantage": float(logged["advantage"][i])})
        path = Path(self.args.output_dir) / "completions.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        if "wandb" in (self.args.report_to or []):
            import wandb

            if wandb.run is not None:
                columns = ["step", "qid", "query", "completion", *self.reward_func_names, "advantage"]
                data = [[r["step"], r["qid"], r["query"], r["completion"], *r["rewards"].values(), r["advantage"]]
                        for r in rows]
                wandb.log({"completions": wandb.Table(columns=columns, data=data)})
        self._completions = None
