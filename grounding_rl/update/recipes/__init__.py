"""Recipes: each one a module with its config fields (a dataclass parsed next to
:class:`grounding_rl.update.config.GroundingGRPOConfig`, YAML keys unchanged, held as the config's ``recipe_args``),
their validation, the recipes they conflict with (by name) and the hooks it needs, registered by name in
:data:`RECIPES`; deleting a recipe's module and its lines here leaves the package working. The trainer calls the hooks of the active recipes at fixed points of a step and
never branches on a recipe's field; adding a recipe touches its module and this registry. A recipe declares in its
module the fields a resume must keep (:attr:`Recipe.fingerprint_keys`, read by the run fingerprint) and those a stage
refuses (:attr:`Recipe.refused`, checked here); ``update/fields.py``, the configs, the run fingerprint and the trainer
ask this registry (:func:`each`, :func:`teacher`, ...), whose answers stand when a recipe is deleted. The hooks, in
step order, are :class:`grounding_rl.update.recipes.base.Recipe`'s; each receives a
:class:`grounding_rl.update.recipes.base.StepContext`, never the trainer.
"""
from __future__ import annotations

from dataclasses import fields

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
def recipe_arguments() -> list[type]:
    """The dataclasses of the registered recipes' config fields, in registry order (parsed by
    :func:`grounding_rl.cli.common.parse_training_args` next to the training config)."""
    return [recipe.arguments for recipe in RECIPES.values() if recipe.arguments]


def own_args(config, name: str):
    """The arguments of recipe ``name`` held by ``config`` (its ``recipe_args``), their defaults when none are."""
    return getattr(config, "recipe_args", {}).get(name) or RECIPES[name].arguments()


def recipe_fields() -> list[str]:
    """The names of every registered recipe's config fields (:attr:`Recipe.arguments`)."""
    return [f.name for cls in recipe_arguments() for f in fields(cls)]


def split_settings(settings: dict) -> tuple[dict, dict]:
    """``(config's, {recipe name: its arguments})`` of keyword settings that mix the training config's fields and
    the recipes' (the latter built as their dataclasses, defaults for the rest)."""
    own = {name: {f.name for f in fields(recipe.arguments)} for name, recipe in RECIPES.items()}
    return ({key: value for key, value in settings.items() if not any(key in names for names in own.values())},
            {name: RECIPES[name].arguments(**{k: v for k, v in settings.items() if k in names})
             for name, names in own.items()})


def recipe_problems(config) -> list[str]:
    """Every registered recipe's messages for ``config`` (its own arguments from ``config.recipe_args``): its
    :meth:`Recipe.problems`, its fields that ``config.stage`` refuses set (:attr:`Recipe.refused`, by the field's
    default) and, once per pair, an enabled recipe's :attr:`Recipe.conflicts` with another enabled one."""
    problems, enabled = [], [name for name, recipe in RECIPES.items() if recipe.enabled(own_args(config, name), config)]
    for name, recipe in RECIPES.items():
        args = own_args(config, name)
        problems += recipe.problems(args, config)
        defaults = {f.name: f.default for f in fields(args)} if recipe.arguments else {}
        problems += [f"{key} {getattr(args, key)!r} is refused by {config.stage}: {why}"
                     for key, why in recipe.refused.get(config.stage, {}).items() if getattr(args, key) != defaults[key]]
        clash = [RECIPES[other].switch for other in recipe.conflicts_of(args) if name in enabled and other in enabled]
        if clash:
            problems.append(recipe.conflict_message.format(", ".join(clash)))
    return problems


def teacher(config) -> tuple[str, str, float] | None:
    """``(path, divergence β's field name, its value)`` of the distillation teacher ``config`` names, or None (also
    when the distillation recipe is not registered)."""
    return RECIPES["distillation"].teacher(own_args(config, "distillation"), config) if "distillation" in RECIPES \
        else None


def each(config, hook: str, *args) -> list:
    """Every registered recipe's static ``hook`` (:meth:`Recipe.extra_videos`, :meth:`Recipe.trainer_inputs`) called
    with its own arguments in ``config`` and ``args``, in registry order."""
    return [getattr(recipe, hook)(own_args(config, name), *args) for name, recipe in RECIPES.items()]


def active_recipes(config) -> list[Recipe]:
    """Instances of the recipes enabled by ``config``, in registry order, each with its own arguments."""
    return [recipe(own_args(config, name), config) for name, recipe in RECIPES.items()
            if recipe.enabled(own_args(config, name), config)]
