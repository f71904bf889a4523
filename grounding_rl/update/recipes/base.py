"""The base of a recipe: the hooks the trainer calls (each default does nothing) and the :class:`StepContext` they
receive instead of the trainer. The registry of recipes is :mod:`grounding_rl.update.recipes`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class StepContext:
    """What a hook sees of the run instead of the trainer (torchtune's components receive what they need), built by
    :meth:`grounding_rl.update.trainer.GroundingGRPOTrainer.step_context` once per draw, loss forward or event.
    Read-only, except what a hook's docstring names (:meth:`Recipe.prepare_data`: the fields set before the trainer
    is built)."""

    accelerator: Any = None  # process index, gather, device, unwrap_model
    model: Any = None  # the policy (PEFT-wrapped for LoRA)
    model_wrapped: Any = None  # as trained: DeepSpeed's engine, DDP's wrapper or the model
    is_deepspeed_enabled: bool = False
    processing_class: Any = None
    rollout_engine: Any = None  # grounding_rl.rollout.generation.RolloutEngine
    sampling: Any = None  # its grounding_rl.rollout.generation.SamplingParams
    share_prompt: bool = False  # prefix sharing in the policy's forwards
    eos_token_ids: list[int] | None = None
    pad_token_id: int | None = None
    placeholder_ids: list[int] | None = None  # vision placeholder ids (never sampled)
    num_generations: int = 0  # G
    reward_funcs: list | None = None
    reward_func_names: list[str] | None = None
    reward_weights: Any = None  # (F,) float32
    train_dataset: Any = None  # GroundingDataset
    data_collator: Any = None  # VideoCollator: items of sample indices
    recipes: list | None = None  # the active recipes, in registry order
    state: Any = None  # transformers' TrainerState (global_step: optimizer steps done)
    metrics: dict | None = None  # {name: [values]}, averaged per log (log)
    timings: dict | None = None  # {phase: seconds} of this generation (grounding_rl.update.rollout.timed)
    extra: dict | None = None  # {column: [one value per completion]}, written with the logged completions

    def log(self, name: str, value: float) -> None:
        """Add one value of metric ``name`` (averaged over the logging window, with the trainer's own metrics)."""
        self.metrics[name].append(value)


def range_problem(key: str, value) -> list[str]:
    """The message for a ``[low, high]`` range field that is not ``0 ≤ low < high ≤ 1`` (empty when fine)."""
    if value is not None and (len(value) != 2 or not 0.0 <= value[0] < value[1] <= 1.0):
        return [f"{key} must be [low, high] with 0 ≤ low < high ≤ 1 (got {value})"]
    return []


class Recipe:
    """Base of a recipe. Subclasses set :attr:`name` and :attr:`arguments` and override the hooks they need. Every hook
    receives a :class:`StepContext` (``context``), never the trainer; what it may change is on its docstring."""

    name = ""
    arguments: type | None = None  # the dataclass of the recipe's config fields
    fingerprint_keys: tuple[str, ...] = ()  # fields a resume must keep (the run fingerprint's ``data_selection``)
    refused: dict[str, dict[str, str]] = {}  # stage ("distill") → {field: why that stage refuses it set}
    drops_zero_std_groups = False  # mask groups with G equal rewards out of the loss
    conflicts: tuple[str, ...] = ()  # names of the recipes this one does not run with (checked by the registry)
    switch = ""  # the field that turns the recipe on (:meth:`enabled`), as a conflict message names it
    conflict_message = ""  # "... {} ...": the message when enabled with recipes of :attr:`conflicts` ({}: their switches)

    @classmethod
    def conflicts_of(cls, args) -> tuple[str, ...]:
        """The recipes this one does not run with, given its own ``args`` (by default :attr:`conflicts`)."""
        return cls.conflicts

    @classmethod
    def enabled(cls, args, config) -> bool:
        """Whether the recipe runs with its own ``args`` and the training ``config`` (by default: :attr:`switch` set)."""
        return bool(cls.switch and getattr(args, cls.switch))

    @staticmethod
    def problems(args, config) -> list[str]:
        """One message per invalid setting of the recipe's own ``args`` (given the training ``config``; checked
        whether or not it is enabled)."""
        return []

    @staticmethod
    def extra_videos(args) -> int:
        """The videos the recipe adds to a conversation's first (a crop tool's windows)."""
        return 0

    @staticmethod
    def trainer_inputs(args, config, script_args) -> dict:
        """Keyword arguments the recipe adds to the trainer's constructor (loaded before the trainer is built)."""
        return {}

    def __init__(self, args, config=None):
        self.args = args  # the recipe's own fields are read from here (``self.args.<field>``)
        self.config = args if config is None else config  # the training config: every other field

    def setup(self, context: StepContext) -> None:
        """Once, at the end of the trainer's ``__init__`` (models a recipe holds, e.g. a teacher). Reads the models,
        processor and accelerator; changes only the recipe."""

    def prepare_data(self, context: StepContext, dataset):
        """The training set to use (return value), once, before the trainer is built; reads ``num_generations``, the
        ``reward_*`` fields, ``recipes`` and :meth:`StepContext.log` (the only ones set, the rest None)."""
        return dataset

    def sampler(self, context: StepContext, dataset):
        """None, or the training sampler (return value) over ``dataset``; may ``context.log`` later."""
        return None

    def pool(self, context: StepContext) -> list[int] | None:
        """None, or the sample indices an extra draw may use (return value)."""
        return None

    def converse(self, context: StepContext, items):
        """None, or a draw made otherwise than by one sampled completion per row (the crop tool's conversations):
        ``(batch, clean, texts, items)`` — the loss batch's prompt tensors,
        :func:`grounding_rl.update.rollout.sanitise`'s dict, the texts the rewards score and the rows' items (with any
        columns added). Generates with ``rollout_engine`` or ``model_wrapped``; may ``log``, add ``timings`` and
        ``extra`` columns."""
        return None

    def inject(self, context: StepContext, items, completion_ids, start):
        """None, or ``(completion_ids, rows)``: new (B, C') ids and the (B,) bool rows that were replaced (return
        value); ``start`` is the global index of the first row."""
        return None

    def observe(self, context: StepContext, items, rewards_per_func, is_gt) -> None:
        """See the gathered (N, F) rewards as scored and the gathered (N,) injected rows; changes only the recipe."""

    def shape(self, context: StepContext, rewards_per_func):
        """The gathered (N, F) rewards the advantages use (return value)."""
        return rewards_per_func

    def resample(self, context: StepContext, rollout, draw):
        """The rollout to train on (return value); ``draw(items, group_offset, generate=None)`` builds an extra
        rollout of this step (:func:`grounding_rl.update.rollout.build_rollout`). May ``log`` and add ``timings``."""
        return rollout

    def loss_inputs(self, context: StepContext, rollout, batch) -> None:
        """Add to (or change) the loss batch (dict) in place; may ``log``."""

    needs_logits = False  # loss_term reads the policy's completion logits

    def loss_term(self, context: StepContext, inputs, logits, num_items):
        """None, or a scalar added to the micro-batch's loss (return value, before gradient-accumulation scaling);
        ``logits``: (B, C, V) float32 completion logits, not divided by the temperature, when :attr:`needs_logits`
        (:func:`grounding_rl.update.logprobs.completion_logps` with ``return_logits``), else None. May ``log``."""
        return None

    def save(self, context: StepContext, folder: str) -> None:
        """Write the recipe's state into a checkpoint folder (``accelerator``: the main process writes)."""

    def load(self, context: StepContext, folder: str) -> None:
        """Restore it from a checkpoint folder (UserError when it cannot); changes only the recipe."""
