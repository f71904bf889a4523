"""Every shipped YAML resolves to the effective settings in its golden file (tests/fixtures/effective_settings/, made
by tests/effective_settings.py on the code before the recipes were reorganised): a refactor of the configs may move a
field, never change what a YAML means."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import effective_settings as es  # noqa: E402


def test_every_shipped_yaml_has_a_golden():
    assert sorted(p.name for p in es.GOLDEN.glob("*.json")) == sorted(es.golden_path(p).name
                                                                      for p in es.shipped_yamls())


def removed() -> dict:
    """The options issue 46 removed → the value the code now always uses (the presets' constants, the check on)."""
    from grounding_rl.data import selection
    from grounding_rl.reward import shaping

    return {"difficulty_gaussian_mean": selection.TIMELENS_MEAN, "difficulty_gaussian_std": selection.TIMELENS_STD,
            "difficulty_num_bins": selection.TIMELENS_NUM_BINS,
            "difficulty_duration_edges": list(selection.TIMELENS_DURATION_EDGES),
            "reward_shaping_threshold": shaping.TEMPSAMP_THRESHOLD, "reward_shaping_alpha": shaping.TEMPSAMP_ALPHA,
            "drop_zero_std_groups": False, "check_first_batch": True}


def test_shipped_yamls_resolve_to_their_goldens(monkeypatch, shared):
    """A removed option is absent now; its golden value is the one the code always uses (for a command that had it)."""
    monkeypatch.chdir(es.REPO)
    monkeypatch.delenv("GROUNDING_RL_DATA", raising=False)
    fixed = removed()
    for path in es.shipped_yamls():
        golden = json.loads(es.golden_path(path).read_text())
        now = json.loads(json.dumps(es.effective_settings(path)))
        for key in fixed.keys() & golden["settings"].keys():
            assert key not in now["settings"] and golden["settings"].pop(key) == fixed[key], (path.name, key)
        changed = {k: (golden["settings"].get(k, "<absent>"), now["settings"].get(k, "<absent>"))
                   for k in set(golden["settings"]) | set(now["settings"])
                   if golden["settings"].get(k, "<absent>") != now["settings"].get(k, "<absent>")}
        assert (now["command"], changed) == (golden["command"], {}), f"{path.name}: (golden, now) {changed}"


def test_what_the_recipes_declare_is_what_the_hand_lists_held():
    """The run fingerprint's data selection and distill's refusals, read from the recipes' modules, hold the keys the
    hand-written lists of fcc6386 held (config.DATA_SELECTION_KEYS, distill_config.GRPO_ONLY), less the options issue
    46 removed (an older fingerprint's are compared with the preset's values, tests/test_resume.py): a checkpoint
    written before still compares, distill still refuses the same settings."""
    from grounding_rl.update.distill_config import GRPO_ONLY
    from grounding_rl.update.recipes import RECIPES

    assert sorted(key for recipe in RECIPES.values() for key in recipe.fingerprint_keys) == sorted((
        "difficulty_sampling", "difficulty_subset_size", "difficulty_range", "online_difficulty_range",
        "difficulty_p_std", "difficulty_p_mean", "difficulty_mean_reward"))
    refused = [key for recipe in RECIPES.values() for key in recipe.refused.get("distill", {})]
    assert sorted([*GRPO_ONLY, *refused]) == sorted((
        "distillation_beta", "distillation_weight", "epsilon", "epsilon_high", "use_bias_correction_kl",
        "num_iterations", "dynamic_sampling", "max_num_gen_batches", "use_gt_injection",
        "reward_shaping", "online_difficulty_range"))
