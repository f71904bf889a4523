"""Recipes: each one a module with its config fields (a dataclass mixed into
:class:`grounding_rl.update.config.GroundingGRPOConfig`, YAML keys unchanged), their validation and the hooks it needs,
registered by name in :data:`RECIPES`. The trainer calls the hooks of the active recipes at fixed points of a step and
never branches on a recipe's field; adding a recipe touches its module and this registry. A recipe declares in its
module the fields a resume must keep (:attr:`Recipe.fingerprint_keys`, read by the run fingerprint) and those a stage
refuses (:attr:`Recipe.refused`, read by ``distill``); ``update/fields.py`` reads the recipes' fields from here.

Hooks, in step order (:class:`grounding_rl.update.recipes.base.Recipe`; every default does nothing): ``prepare_data`` (the training set, once),
``sampler`` (the training sampler), ``pool`` (the samples an extra draw may use), ``converse`` (a draw of conversations), ``inject`` (replace completions,
:func:`grounding_rl.update.rollout.sanitise`), ``observe`` / ``shape`` (the gathered rewards,
:func:`grounding_rl.update.rollout.build_rollout`), ``resample`` (more draws, handed a draw function),
``drops_zero_std_groups``, ``loss_inputs`` (the batch the loss sees), ``loss_term`` (added to the loss), ``save`` /
``load`` (checkpoint files); ``setup`` once, when the trainer is built.
"""
from __future__ import annotations

from grounding_rl.update.recipes.base import Recipe
from grounding_rl.update.recipes.crop_tool import CropTool
from grounding_rl.update.recipes.difficulty import DifficultySelection
from grounding_rl.update.recipes.distillation import Distillation
from grounding_rl.update.recipes.dynamic_sampling import DynamicSampling
from grounding_rl.update.recipes.engine_correction import EngineCorrection
from grounding_rl.update.recipes.gt_injection import GroundTruthInjection
from grounding_rl.update.recipes.online_filter import OnlineFilter
from grounding_rl.update.recipes.tempsamp import TempSampShaping
from grounding_rl.update.recipes.two_pass_zoom import TwoPassZoom
from grounding_rl.update.recipes.validation import Validation

# order = the order the hooks run in
RECIPES: dict[str, type[Recipe]] = {r.name: r for r in (DifficultySelection, OnlineFilter, CropTool,
                                                        TwoPassZoom, GroundTruthInjection, TempSampShaping, DynamicSampling,
                                                        EngineCorrection, Distillation, Validation)}
def fingerprint_keys() -> list[str]:
    """The fields a resume must keep, of every registered recipe (:attr:`Recipe.fingerprint_keys`)."""
    return [key for recipe in RECIPES.values() for key in recipe.fingerprint_keys]


def refused_fields(stage: str) -> dict[str, str]:
    """``{field: why}`` of the registered recipes' fields that ``stage`` refuses set (:attr:`Recipe.refused`)."""
    return {name: why for recipe in RECIPES.values() for name, why in recipe.refused.get(stage, {}).items()}


def recipe_fields() -> list[str]:
    """The names of every registered recipe's config fields (:attr:`Recipe.arguments`)."""
    from dataclasses import fields

    return [f.name for recipe in RECIPES.values() if recipe.arguments for f in fields(recipe.arguments)]


def recipe_problems(args) -> list[str]:
    """Every registered recipe's messages for ``args``."""
    return [message for recipe in RECIPES.values() for message in recipe.problems(args)]


def active_recipes(args) -> list[Recipe]:
    """Instances of the recipes enabled by ``args``, in registry order."""
    return [recipe(args) for recipe in RECIPES.values() if recipe.enabled(args)]
