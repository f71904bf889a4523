"""Recipes: each one a module with its config fields (a dataclass mixed into
:class:`grounding_rl.update.config.GroundingGRPOConfig`, YAML keys unchanged), their validation and the hooks it needs,
registered by name in :data:`RECIPES`. The trainer calls the hooks of the active recipes at fixed points of a step and
never branches on a recipe's field; adding a recipe touches its module and this registry.

Hooks, in step order (:class:`Recipe`; every default does nothing): ``prepare_data`` (the training set, once),
``sampler`` (the training sampler), ``pool`` (the samples an extra draw may use), ``inject`` (replace completions,
:func:`grounding_rl.update.rollout.sanitise`), ``observe`` / ``shape`` (the gathered rewards,
:func:`grounding_rl.update.rollout.build_rollout`), ``resample`` (more draws, handed a draw function),
``drops_zero_std_groups``, ``loss_inputs`` (the batch the loss sees), ``save`` / ``load`` (checkpoint files).
"""
from __future__ import annotations


class Recipe:
    """Base of a recipe. Subclasses set :attr:`name` and :attr:`arguments` and override the hooks they need."""

    name = ""
    arguments: type | None = None  # the dataclass of the recipe's config fields
    drops_zero_std_groups = False  # mask groups with G equal rewards out of the loss

    @staticmethod
    def enabled(args) -> bool:
        """Whether the recipe runs with these settings."""
        return False

    @staticmethod
    def problems(args) -> list[str]:
        """One message per invalid setting of the recipe's fields (checked whether or not it is enabled)."""
        return []

    def __init__(self, args):
        self.args = args

    def prepare_data(self, trainer, dataset):
        return dataset

    def sampler(self, trainer, dataset):
        return None

    def pool(self, trainer) -> list[int] | None:
        return None

    def inject(self, trainer, items, completion_ids, start):
        """None, or ``(completion_ids, rows)``: new (B, C') ids and the (B,) bool rows that were replaced."""
        return None

    def observe(self, trainer, items, rewards_per_func, is_gt) -> None:
        """See the gathered (N, F) rewards as scored and the gathered (N,) injected rows."""

    def shape(self, trainer, rewards_per_func):
        return rewards_per_func

    def resample(self, trainer, rollout, draw):
        """The rollout to train on; ``draw(k)`` builds the k-th extra rollout of this step."""
        return rollout

    def loss_inputs(self, trainer, rollout, batch) -> None:
        """Add to (or change) the loss batch in place."""

    def save(self, trainer, folder: str) -> None:
        """Write the recipe's state into a checkpoint folder."""

    def load(self, trainer, folder: str) -> None:
        """Restore it from a checkpoint folder (UserError when it cannot)."""


def _registry() -> dict[str, type[Recipe]]:
    from grounding_rl.update.recipes.difficulty import DifficultySelection
    from grounding_rl.update.recipes.dynamic_sampling import DynamicSampling
    from grounding_rl.update.recipes.engine_correction import EngineCorrection
    from grounding_rl.update.recipes.gt_injection import GroundTruthInjection
    from grounding_rl.update.recipes.online_filter import OnlineFilter
    from grounding_rl.update.recipes.tempsamp import TempSampShaping
    from grounding_rl.update.recipes.validation import Validation

    # order = the order the hooks run in
    return {r.name: r for r in (DifficultySelection, OnlineFilter, GroundTruthInjection, TempSampShaping,
                                DynamicSampling, EngineCorrection, Validation)}


RECIPES = _registry()


def recipe_problems(args) -> list[str]:
    """Every registered recipe's messages for ``args``."""
    return [message for recipe in RECIPES.values() for message in recipe.problems(args)]


def active_recipes(args) -> list[Recipe]:
    """Instances of the recipes enabled by ``args``, in registry order."""
    return [recipe(args) for recipe in RECIPES.values() if recipe.enabled(args)]
