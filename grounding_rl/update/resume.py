"""Resuming a run exactly: a checkpoint's weights load back with every key accounted for, and a run resumed at its last
step trains nothing.

``transformers.Trainer._load_from_checkpoint`` (5.24) reads ``model.safetensors`` with ``load_state_dict(strict=False)``,
without the checkpoint conversion mapping that ``from_pretrained`` applies: Qwen2.5-VL saves ``visual.*`` /
``model.layers.*`` and expects ``model.visual.*`` / ``model.language_model.*``, so every key is missing, the starting
weights stay, and a warning is all one sees (huggingface/transformers#43701). Here full weights load through
``from_pretrained`` itself (its own key mapping and tied weights) and are copied in with ``strict=True``; adapters
load through PEFT's ``load_adapter`` and every adapter key must be found. Any missing or unexpected key is an error.
DeepSpeed checkpoints are DeepSpeed's own (``global_stepN/``, keys as in ``state_dict()``) and load strictly there.

Resuming from the last checkpoint of a finished run: ``Trainer`` skips the trained batches of the current epoch and
then runs one more optimizer step before it checks ``max_steps``; :meth:`ExactResumeMixin._run_epoch` stops first.
"""
from __future__ import annotations

import json
import logging
import os

import torch

from grounding_rl.errors import UserError

logger = logging.getLogger(__name__)


class CheckpointLoadError(RuntimeError):
    """A checkpoint whose weights do not match the model (missing, unexpected or differently shaped keys)."""


def _keys_problem(folder, missing, unexpected, mismatched=()) -> str | None:
    parts = []
    for label, keys in (("missing", missing), ("unexpected", unexpected), ("shape-mismatched", mismatched)):
        keys = sorted(str(k) for k in keys)
        if keys:
            more = f" (+{len(keys) - 3} more)" if len(keys) > 3 else ""
            parts.append(f"{len(keys)} {label} keys: {', '.join(keys[:3])}{more}")
    return f"{folder}: the checkpoint does not match the model: " + "; ".join(parts) if parts else None


def load_full_weights(model: torch.nn.Module, folder: str | os.PathLike) -> None:
    """Copy a checkpoint's full weights (``model.safetensors`` or its shards) into ``model``, bit for bit.

    The checkpoint is read with ``type(model).from_pretrained`` on the CPU in the model's dtype (transformers' own key
    conversion and tied weights), then copied with ``load_state_dict(strict=True)``. Memory: one extra CPU copy of the
    weights while it runs.

    Raises:
        CheckpointLoadError: a key is missing, unexpected or of another shape.
    """
    dtype = next(model.parameters()).dtype
    loaded, info = type(model).from_pretrained(str(folder), dtype=dtype, output_loading_info=True,
                                               trust_remote_code=False)
    problem = _keys_problem(folder, info.get("missing_keys", ()), info.get("unexpected_keys", ()),
                            [k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys", ())])
    if problem:
        raise CheckpointLoadError(problem)
    result = model.load_state_dict(loaded.state_dict(), strict=False)
    problem = _keys_problem(folder, result.missing_keys, result.unexpected_keys)
    if problem:
        raise CheckpointLoadError(problem)


def load_adapter_weights(model, folder: str | os.PathLike) -> None:
    """Load a PEFT checkpoint's adapter (``adapter_model.safetensors``) into ``model``'s active adapter.

    Raises:
        CheckpointLoadError: an adapter key of the checkpoint found no place in the model, or a trainable adapter
            weight of the model was not in the checkpoint.
    """
    from peft.utils import load_peft_weights

    adapter = model.active_adapters[0] if hasattr(model, "active_adapters") else "default"
    saved = load_peft_weights(str(folder), device="cpu")
    result = model.load_adapter(str(folder), adapter, is_trainable=True)
    missing = [k for k in result.missing_keys if "lora_" in k or "modules_to_save" in k]
    problem = _keys_problem(folder, missing, result.unexpected_keys)
    if problem is None and not saved:
        problem = f"{folder}: the adapter checkpoint holds no weights"
    if problem:
        raise CheckpointLoadError(problem)


class ExactResumeMixin:
    """Mixed into a ``transformers.Trainer``: strict checkpoint weights (:func:`load_full_weights`,
    :func:`load_adapter_weights`) on resume and for ``load_best_model_at_end``, and no training past ``max_steps``
    after a resume."""

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        if self.is_fsdp_enabled:
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        model = self.model if model is None else model
        logger.info("loading the weights of %s", resume_from_checkpoint)
        if hasattr(model, "peft_config"):
            load_adapter_weights(model, resume_from_checkpoint)
        else:
            load_full_weights(model, resume_from_checkpoint)

    def _load_best_model(self):
        """``load_best_model_at_end``: the best checkpoint's weights, loaded as strictly as a resume (Trainer's own
        loader has the same key-mapping hole as its ``_load_from_checkpoint``)."""
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            return super()._load_best_model()
        logger.info("loading the best model from %s (score %s)", self.state.best_model_checkpoint,
                    self.state.best_metric)
        return self._load_from_checkpoint(self.state.best_model_checkpoint)

    def _run_epoch(self, *args, **kwargs):
        if self.state.max_steps > 0 and self.state.global_step >= self.state.max_steps:
            logger.info("the run already reached max_steps (%d): nothing to train", self.state.max_steps)
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)


ROLLOUT_FORMAT_FILE = "rollout_format.json"  # in every GRPO checkpoint written since groups are shuffled
ROLLOUT_FORMAT = 2  # 2: micro-batches of shuffled groups; dynamic sampling chooses groups over the global batch


def write_rollout_format(folder: str | os.PathLike) -> None:
    """Mark a GRPO checkpoint with the rollout format it was trained with (``rollout_format.json``)."""
    with open(os.path.join(folder, ROLLOUT_FORMAT_FILE), "w", encoding="utf-8") as handle:
        json.dump({"rollout_format": ROLLOUT_FORMAT}, handle)


def check_resume(folder: str | os.PathLike, args) -> None:
    """Refuse a checkpoint that this version would not continue as the run that wrote it.

    A checkpoint inside a generation window (:attr:`GroundingGRPOConfig.generation_window`) is refused, except one at
    ``max_steps`` (nothing left to train). A checkpoint without ``rollout_format.json`` was written before the
    micro-batches were shuffled by group and before dynamic sampling chose its groups over all processes: it resumes
    bit-exactly where neither applies (``steps_per_generation`` 1, and no dynamic sampling on several processes), and
    is refused otherwise.

    Raises:
        UserError: one line saying which setting makes the checkpoint continue differently.
    """
    from transformers.trainer_callback import TrainerState

    path, window = os.path.join(folder, "trainer_state.json"), args.generation_window
    step = TrainerState.load_from_json(path).global_step if os.path.isfile(path) else None
    if step is not None and step % window and not 0 < args.max_steps <= step:
        raise UserError(f"{folder}: step {step} is inside a generation window of {window} optimizer steps "
                        "(steps_per_generation × num_iterations / gradient_accumulation_steps); resume from a "
                        f"checkpoint at a multiple of {window}, or with the settings that wrote it")
    path = os.path.join(folder, ROLLOUT_FORMAT_FILE)
    version = 1
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            version = int(json.load(handle).get("rollout_format", 1))
    if version > ROLLOUT_FORMAT:
        raise UserError(f"{folder}: rollout format {version} is newer than this version's {ROLLOUT_FORMAT}; "
                        "resume it with the version that wrote it")
    if version == 1:
        from grounding_rl.update.recipes import active_recipes

        why = ("steps_per_generation > 1 shuffles the groups before cutting micro-batches"
               if args.steps_per_generation > 1 else
               "dynamic_sampling on several processes chooses its groups over all of them"
               if args.world_size > 1 and any(r.name == "dynamic_sampling" for r in active_recipes(args)) else None)
        if why:
            raise UserError(f"{folder}: written by an older version, and with these settings this version trains "
                            f"differently ({why}), so it cannot resume bit-exactly; resume it with the version "
                            "that wrote it, or start the run again")
