"""The base of a recipe: its config dataclass and the hooks the trainer calls (each default does nothing). The
registry of recipes is :mod:`grounding_rl.update.recipes`."""
from __future__ import annotations


def range_problem(key: str, value) -> list[str]:
    """The message for a ``[low, high]`` range field that is not ``0 ≤ low < high ≤ 1`` (empty when fine)."""
    if value is not None and (len(value) != 2 or not 0.0 <= value[0] < value[1] <= 1.0):
        return [f"{key} must be [low, high] with 0 ≤ low < high ≤ 1 (got {value})"]
    return []


class Recipe:
    """Base of a recipe. Subclasses set :attr:`name` and :attr:`arguments` and override the hooks they need."""

    name = ""
    arguments: type | None = None  # the dataclass of the recipe's config fields
    fingerprint_keys: tuple[str, ...] = ()  # fields a resume must keep (the run fingerprint's ``data_selection``)
    refused: dict[str, dict[str, str]] = {}  # stage ("distill") → {field: why that stage refuses it set}
    drops_zero_std_groups = False  # mask groups with G equal rewards out of the loss
    trainer_mixin: type | None = None  # a class mixed into the GRPO trainer (validation's evaluate)
    conflicts: tuple[str, ...] = ()  # names of the recipes this one does not run with (checked by the registry)
    switch = ""  # the field that turns the recipe on, as a conflict message names it
    conflict_message = ""  # "... {} ...": the message when enabled with recipes of :attr:`conflicts` ({}: their switches)

    @classmethod
    def conflicts_of(cls, args) -> tuple[str, ...]:
        """The recipes this one does not run with, given its own ``args`` (by default :attr:`conflicts`)."""
        return cls.conflicts

    @staticmethod
    def enabled(args, config) -> bool:
        """Whether the recipe runs with its own ``args`` and the training ``config``."""
        return False

    @staticmethod
    def problems(args, config) -> list[str]:
        """One message per invalid setting of the recipe's own ``args`` (given the training ``config``; checked
        whether or not it is enabled)."""
        return []

    @staticmethod
    def resolve_paths(args) -> None:
        """Make the recipe's path fields absolute, once parsed (:func:`grounding_rl.paths.resolve_model_path`)."""

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

    def setup(self, trainer) -> None:
        """Once, at the end of the trainer's ``__init__`` (models a recipe holds, e.g. a teacher)."""

    def prepare_data(self, trainer, dataset):
        return dataset

    def sampler(self, trainer, dataset):
        return None

    def pool(self, trainer) -> list[int] | None:
        return None

    def converse(self, trainer, items):
        """None, or a draw made otherwise than by one sampled completion per row (the crop tool's conversations):
        ``(batch, clean, texts, items)`` — the loss batch's prompt tensors,
        :func:`grounding_rl.update.rollout.sanitise`'s dict, the texts the rewards score and the rows' items (with any columns added)."""
        return None

    def inject(self, trainer, items, completion_ids, start):
        """None, or ``(completion_ids, rows)``: new (B, C') ids and the (B,) bool rows that were replaced."""
        return None

    def observe(self, trainer, items, rewards_per_func, is_gt) -> None:
        """See the gathered (N, F) rewards as scored and the gathered (N,) injected rows."""

    def shape(self, trainer, rewards_per_func):
        return rewards_per_func

    def resample(self, trainer, rollout, draw):
        """The rollout to train on; ``draw(items, group_offset, generate=None)`` builds an extra rollout of this step
        (:func:`grounding_rl.update.rollout.build_rollout`)."""
        return rollout

    def loss_inputs(self, trainer, rollout, batch) -> None:
        """Add to (or change) the loss batch in place."""

    needs_logits = False  # loss_term reads the policy's completion logits

    def loss_term(self, trainer, inputs, logits, num_items):
        """None, or a scalar added to the micro-batch's loss (before gradient-accumulation scaling); ``logits``:
        (B, C, V) float32 completion logits, not divided by the temperature, when :attr:`needs_logits`
        (:func:`grounding_rl.update.logprobs.completion_logps` with ``return_logits``), else None."""
        return None

    def save(self, trainer, folder: str) -> None:
        """Write the recipe's state into a checkpoint folder."""

    def load(self, trainer, folder: str) -> None:
        """Restore it from a checkpoint folder (UserError when it cannot)."""
