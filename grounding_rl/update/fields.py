"""Who honours each parsed field: one table for everything ``grounding-rl train`` and ``grounding-rl sft`` parse.

``trl.TrlParser`` fills three dataclasses per stage (:func:`grounding_rl.cli.common.parse_training_args`): the script
arguments (:class:`grounding_rl.cli.common.GroundingScriptArguments`), the stage's training config
(:class:`grounding_rl.update.config.GroundingGRPOConfig`: ``transformers.TrainingArguments`` + TRL 1.16's GRPO knobs +
ours; :class:`grounding_rl.update.sft.GroundingSFTConfig`) and ``trl.ModelConfig``. :data:`FIELDS` maps every field of
them to who honours it in each stage:

- ``ours``: code of this package reads it (the GRPO loop, the loaders, the CLI);
- ``transformers.Trainer``: the ``Trainer`` our trainers subclass does what its documentation says;
- ``peft``: the LoRA wrapping (``trl.get_peft_config`` → ``peft.get_peft_model``);
- ``refused``: nothing here would honour it, so a value other than the field's default is an error (one line, exit 2,
  before any model loads; :func:`refused_settings`). A field of an installed transformers/TRL version that the table
  does not know is refused alike when set.

``None`` for a stage: not a field of that stage's config. ``tests/test_fields.py`` fails on a field missing here and
walks every refused field through the ``grounding-rl`` dispatcher.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from grounding_rl.prompts.preprocessing import PreprocessingArguments
from grounding_rl.update.recipes import recipe_fields

OURS, TRAINER, PEFT, REFUSED = "ours", "transformers.Trainer", "peft", "refused"
HONOURS = (OURS, TRAINER, PEFT, REFUSED)


class Honour(NamedTuple):
    """Who honours a field in ``grounding-rl train`` (``grpo``) and ``grounding-rl sft`` (``sft``): one of
    :data:`HONOURS`, or None where the stage's config has no such field; ``why`` says why a refused field is
    (``why_sft``, when given, for ``sft``)."""

    grpo: str | None
    sft: str | None
    why: str = ""
    why_sft: str = ""


def _both(who: str, why: str = "") -> Honour:
    return Honour(who, who, why)


def _grpo(who: str, why: str = "") -> Honour:
    return Honour(who, None, why)


_T, _O, _P = _both(TRAINER), _both(OURS), _both(PEFT)  # shorthands below
_NO_EVAL_SFT = "sft has no evaluation set (run grounding-rl eval on its checkpoints)"
_GRPO_EVAL = "GRPO validates with its own greedy evaluate(), not Trainer's loss loop"
_HUB = ("every push here waits for the one before and none is skipped (grounding_rl.update.hub), as "
        "hub_always_push: true would ask")
_SAMPLER = "GRPO's sampler repeats each clip num_generations times (TRL's RepeatSampler)"
_SAMPLER_SFT = "the samples have no length column before the collator tokenises them"
_SFT = ("think_text", "crop_trajectory_fraction", "max_tool_calling_iterations")  # GroundingSFTConfig's own fields


def _refused(grpo_why: str, sft_why: str | None = None) -> Honour:
    """Refused in GRPO (``grpo_why``); in SFT refused for ``sft_why``, else honoured by ``transformers.Trainer``."""
    return Honour(REFUSED, REFUSED if sft_why else TRAINER, grpo_why, sft_why or "")


FIELDS: dict[str, Honour] = {
    # --- GroundingScriptArguments (grounding_rl/cli/common.py)
    "train_file": _O, "video_root": _O, "max_train_samples": _O, "freeze_vision_tower": _O, "frame_cache_dir": _O,
    "frame_cache_gb": _O, "max_missing_fraction": _O, "replace_output_dir": _O,
    "min_video_duration": _O, "max_video_duration": _O,  # load_dataset: TimeLens2's video filter
    "tiny_model": _O,  # scripts/train.sh and scripts/demo.sh build it (grounding-rl tiny-model) when the model is missing
    # --- trl.ModelConfig
    "model_name_or_path": _O, "model_revision": _O, "dtype": _O, "attn_implementation": _O,
    "use_peft": _P, "lora_r": _P, "lora_alpha": _P, "lora_dropout": _P, "lora_target_modules": _P,
    "lora_target_parameters": _P, "lora_modules_to_save": _P, "use_rslora": _P, "use_dora": _P,
    "lora_task_type": _both(REFUSED, "the policy is a causal LM (PEFT's CAUSAL_LM); another task type would wrap it "
                                     "with the wrong head"),
    # k-bit: trl.get_quantization_config + the vision rules of grounding_rl.models.loading.quantization_config
    "load_in_8bit": _O, "load_in_4bit": _O, "bnb_4bit_quant_type": _O, "use_bnb_nested_quant": _O,
    "bnb_4bit_quant_storage": _O,
    # --- transformers.TrainingArguments (5.24)
    "output_dir": _O,  # claim_output_dir, checkpoints, completions.jsonl
    "per_device_train_batch_size": Honour(OURS, TRAINER),  # GRPO: the generation batch (TRL's rules)
    "num_train_epochs": _T, "max_steps": _T, "learning_rate": _T, "lr_scheduler_type": _T,
    "lr_scheduler_kwargs": _T, "warmup_steps": _T, "optim": _T, "optim_args": _T, "weight_decay": _T,
    "adam_beta1": _T, "adam_beta2": _T, "adam_epsilon": _T, "optim_target_modules": _T,
    "gradient_accumulation_steps": _T,
    "average_tokens_across_devices": _refused("GRPO's loss normalises itself (loss_type: dapo counts the global "
                                              "active tokens; the others are per sequence or constant)"),
    "max_grad_norm": _T,
    "label_smoothing_factor": _refused(
        "GRPO has no labels", "Trainer's label smoother shifts labels only for causal-LM classes, not "
        "...ForConditionalGeneration, so it would smooth against unshifted targets"),
    "bf16": _T, "fp16": _T,
    "bf16_full_eval": _refused(_GRPO_EVAL, _NO_EVAL_SFT), "fp16_full_eval": _refused(_GRPO_EVAL, _NO_EVAL_SFT),
    "tf32": _T,
    "activation_checkpointing": _T, "activation_checkpointing_kwargs": _T, "gradient_checkpointing": _T,
    "gradient_checkpointing_kwargs": _T,
    "torch_compile": _refused("not wired into GRPO's own forwards (shared video encoding, packed prefix rows) "
                              "and generation; untested"),
    "torch_compile_backend": _refused("setting it turns torch_compile on (see torch_compile)"),
    "torch_compile_mode": _refused("setting it turns torch_compile on (see torch_compile)"),
    "use_liger_kernel": _refused("Liger replaces the model's forward, which would drop the mm_encoder_outputs and "
                                 "4-D masks GRPO's log-prob forward passes"),
    "liger_kernel_config": _refused("only used with use_liger_kernel (see use_liger_kernel)"),
    "use_cache": _T,
    "neftune_noise_alpha": _refused("noise on the input embeddings would make the trained log-probs differ from "
                                    "the sampling policy's"),
    "torch_empty_cache_steps": _T,
    "auto_find_batch_size": _refused("the generation batch must hold whole groups of num_generations"),
    "logging_strategy": _T, "logging_steps": _T, "logging_first_step": _T, "log_on_each_node": _T,
    "logging_nan_inf_filter": _T,
    "include_num_input_tokens_seen": _refused("Trainer would count the raw generation batch (video rows), not the "
                                              "prompt and completion tokens"),
    "log_level": _T, "log_level_replica": _T, "disable_tqdm": _T, "report_to": _T, "run_name": _T, "project": _T,
    "trackio_space_id": _T, "trackio_bucket_id": _T, "trackio_static_space_id": _T,
    "eval_strategy": Honour(OURS, REFUSED, _NO_EVAL_SFT),  # GRPO: the validation recipe
    "eval_steps": Honour(TRAINER, REFUSED, _NO_EVAL_SFT), "eval_delay": Honour(TRAINER, REFUSED, _NO_EVAL_SFT),
    "per_device_eval_batch_size": Honour(OURS, REFUSED, _NO_EVAL_SFT),
    "prediction_loss_only": _refused(_GRPO_EVAL, _NO_EVAL_SFT),
    "eval_on_start": Honour(TRAINER, REFUSED, _NO_EVAL_SFT),
    "eval_do_concat_batches": _refused(_GRPO_EVAL, _NO_EVAL_SFT),
    "eval_use_gather_object": _refused(_GRPO_EVAL, _NO_EVAL_SFT),
    "eval_accumulation_steps": _refused(_GRPO_EVAL, _NO_EVAL_SFT),
    "include_for_metrics": _refused(_GRPO_EVAL, _NO_EVAL_SFT),
    "batch_eval_metrics": _refused(_GRPO_EVAL, _NO_EVAL_SFT),
    "save_only_model": _T, "save_strategy": _T, "save_steps": _T, "save_on_each_node": _T, "save_total_limit": _T,
    "enable_jit_checkpoint": _refused("a checkpoint written on SIGTERM may sit inside a generation window, which "
                                      "cannot resume exactly"),
    # grounding_rl.update.hub pushes after the run's files and checkpoints' marks; Trainer creates the repository
    "push_to_hub": _O, "hub_token": _O, "hub_private_repo": _T, "hub_model_id": _O, "hub_strategy": _O,
    "hub_revision": _O, "hub_always_push": _both(REFUSED, _HUB),
    "load_best_model_at_end": Honour(TRAINER, REFUSED, _NO_EVAL_SFT),
    "metric_for_best_model": Honour(OURS, REFUSED, _NO_EVAL_SFT),  # GRPO: one of the validation recipe's metrics
    "greater_is_better": Honour(TRAINER, REFUSED, _NO_EVAL_SFT),
    "ignore_data_skip": _T, "restore_callback_states_from_checkpoint": _T,
    "full_determinism": _O, "seed": _O,  # seed_everything before the model; the GRPO sampler
    "data_seed": Honour(OURS, TRAINER),
    "use_cpu": _T, "accelerator_config": _T,
    "parallelism_config": _both(REFUSED, "tensor/context parallelism is untested with the video models here; the GRPO "
                                         "groups and gathers assume data-parallel ranks"),
    "dataloader_drop_last": _T, "dataloader_num_workers": _T, "dataloader_pin_memory": _T,
    "dataloader_persistent_workers": _T, "dataloader_prefetch_factor": _T, "dataloader_multiprocessing_context": _T,
    "dataloader_in_order": _T,
    "remove_unused_columns": _both(REFUSED, "the reward functions and the collators need the raw sample fields "
                                            "(start, end, duration, video)"),
    "label_names": _both(REFUSED, "GRPO has no labels; SFT's collator names them 'labels'"),
    "train_sampling_strategy": _refused(_SAMPLER, _SAMPLER_SFT), "length_column_name": _refused(_SAMPLER, _SAMPLER_SFT),
    "ddp_find_unused_parameters": _T, "ddp_bucket_cap_mb": _T, "ddp_broadcast_buffers": _T, "ddp_static_graph": _T,
    "ddp_backend": _T, "ddp_timeout": _T,
    "fsdp": _T, "fsdp_config": _T,  # untested here; DeepSpeed ZeRO-3 is the tested sharding
    "deepspeed": _T, "debug": _T, "skip_memory_metrics": _T,
    "do_train": _both(REFUSED, "grounding-rl train and sft always train; the flag would change nothing"),
    "do_eval": _both(REFUSED, "grounding-rl train and sft do not evaluate after training (use grounding-rl eval)"),
    "do_predict": _both(REFUSED, "grounding-rl train and sft do not predict (use grounding-rl eval)"),
    "resume_from_checkpoint": _O,  # resolve_resume: exact resume, fingerprint checked
    "local_rank": _T,
    # --- PreprocessingArguments (both stages: prompt and frames)
    **{f.name: _O for f in dataclasses.fields(PreprocessingArguments)},
    # --- GroundingSFTConfig; GRPO honours a name that is also a recipe's field (the crop trajectories' K)
    **{name: Honour(OURS if name in recipe_fields() else None, OURS) for name in _SFT},
    # --- GroundingGRPOConfig: TRL 1.16's GRPO knobs and ours (grounding_rl/update/config.py)
    **{name: _grpo(OURS) for name in (
        "disable_dropout", "num_generations", "max_completion_length", "ds3_gather_for_generation", "shuffle_dataset",
        "generation_batch_size", "steps_per_generation", "temperature", "top_p", "top_k", "repetition_penalty", "beta",
        "num_iterations", "epsilon", "epsilon_high", "use_bias_correction_kl", "reward_weights", "scale_rewards",
        "loss_type", "mask_truncated_completions", "log_completions", "num_completions_to_print", "use_vllm",
        "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size", "vllm_enable_sleep_mode", "vllm_max_model_length",
        "share_video_encoding", "share_prompt_prefix", "reward_funcs")},
    **{name: _grpo(OURS) for name in recipe_fields() if name not in _SFT},  # the recipes' (update/recipes)
    "vllm_mode": _grpo(REFUSED, "only 'colocate' is supported here (vLLM inside the training processes); TRL's "
                                "'server' mode is not implemented"),
}
assert all(h.grpo in HONOURS + (None,) and h.sft in HONOURS + (None,) for h in FIELDS.values())


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def is_default(value, default) -> bool:
    """Whether a parsed ``value`` means the field's ``default``: equal (enums by their value), or both "unset"
    (None, False, "", "no", "none", an empty list: e.g. ``debug: ""`` and ``include_num_input_tokens_seen: false``)."""
    value, default = getattr(value, "value", value), getattr(default, "value", default)
    if value == default:
        return True

    def unset(v):
        return v is None or v is False or (isinstance(v, str) and v.lower() in ("", "no", "none", "false")) or \
            (isinstance(v, (list, tuple, dict)) and not v)

    return unset(value) and unset(default)


def refused_settings(settings, stage: str) -> list[str]:
    """One message per field of the dataclass instance ``settings`` that ``stage`` (``"grpo"`` or ``"sft"``) refuses
    (:data:`FIELDS`; a field the table lacks counts as refused) and that holds a value other than its default
    (:func:`is_default`). Read before the dataclass's own ``__post_init__`` changes any value.

    Returns:
        ``["torch_compile True is refused: not wired into ... (default False)", ...]``; empty when nothing refused is set.
    """
    problems = []
    for f in dataclasses.fields(settings):
        honour = FIELDS.get(f.name)
        who = None if honour is None else getattr(honour, stage)
        if who not in (REFUSED, None):
            continue
        default, value = _default(f), getattr(settings, f.name)
        if default is dataclasses.MISSING or is_default(value, default):
            continue
        why = (honour.why_sft if stage == "sft" and honour.why_sft else honour.why) if who == REFUSED else \
            "a field of the installed version that grounding_rl has not reviewed"
        problems.append(f"{f.name} {getattr(value, 'value', value)!r} is refused: {why} (default "
                        f"{getattr(default, 'value', default)!r})")
    return problems
