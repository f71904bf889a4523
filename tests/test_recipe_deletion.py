"""A recipe is deletable: in a copy of the package without one recipe's module and its registry line(s), the package
imports (the GRPO trainer included), ``train --help``, ``sft --help`` and ``distill --help`` work (without the
distillation recipe, ``distill`` refuses in one line naming it, exit 2), the help lists the remaining recipes' fields and
none of the deleted one's, and the model-free tests of the remaining recipes pass. One subprocess per deletion, two at a
time (full tier: about 40 s on 2 cores)."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "grounding_rl" / "update" / "recipes"

# model-free tests of the recipes, and the recipes each one needs
RECIPE_TESTS = {
    "tests/test_multiturn.py::test_crop_tool_settings_are_checked": {"crop_tool", "gt_injection"},
    "tests/test_two_pass_zoom.py::test_two_pass_zoom_settings_are_checked": {"two_pass_zoom", "crop_tool"},
    "tests/test_dispersion.py::test_dispersion_recipe_scores_the_rollouts_with_the_training_and_mean_rewards": {
        "difficulty_selection", "online_filter"},
    "tests/test_vllm_engine.py::test_vllm_config_knobs_and_engine_choice": {"vllm_importance_sampling"},
    "tests/test_distill.py::test_distill_refuses_grpo_only_settings_in_one_line": {"distillation"},
    "tests/test_fields.py::test_every_parsed_field_is_in_the_table": set(),
    "tests/test_fields.py::test_the_table_names_no_field_that_is_not_parsed": set(),
}

CHECK = r"""
import contextlib, io, os, sys
import pytest
import grounding_rl.update.trainer  # noqa: F401  the package imports without the recipe
from grounding_rl.cli import main as cli
from grounding_rl.update.config import GroundingGRPOConfig
from grounding_rl.update.recipes import RECIPES, active_recipes, recipe_fields

deleted, gone, tests = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
assert deleted not in RECIPES and grounding_rl.__file__.startswith(os.getcwd())  # the copy
for sub in ("train", "sft", "distill"):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli([sub, "--help"])
        except SystemExit as exit:
            code = exit.code
    if sub == "distill" and deleted == "distillation":
        assert code == 2 and len(err.getvalue().strip().splitlines()) == 1 and "distillation" in err.getvalue(), err
        continue
    assert code in (0, None), (sub, code, err.getvalue())
    if sub == "train":
        assert all(f"--{name} " in out.getvalue() for name in recipe_fields()), sub
        assert not any(f"--{name} " in out.getvalue() for name in gone), (sub, gone)
config = GroundingGRPOConfig.build(output_dir="unused", use_cpu=True)
assert active_recipes(config) == [] and set(config.recipe_args) == set(RECIPES)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *tests]))
"""


def registry_names() -> dict[str, str]:
    """``{recipe name: its module's file name}`` of the registered recipes (read from their modules' source)."""
    out = {}
    for path in sorted(RECIPES.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") == "Recipe" for b in node.bases):
                name = next(s.value.value for s in node.body if isinstance(s, ast.Assign)
                            and getattr(s.targets[0], "id", "") == "name")
                out[name] = path.name
    return out


def fields_of(module: Path) -> list[str]:
    """The field names of the ``...Arguments`` dataclass of a recipe's module."""
    tree = ast.parse(module.read_text())
    return [s.target.id for node in tree.body if isinstance(node, ast.ClassDef) and node.name.endswith("Arguments")
            for s in node.body if isinstance(s, ast.AnnAssign)]


def delete(copy: Path, module: str) -> None:
    """Delete a recipe's module and the lines of the registry that name it (its import and its class)."""
    folder = copy / "grounding_rl" / "update" / "recipes"
    source = (folder / module).read_text()
    cls = next(n.name for n in ast.parse(source).body if isinstance(n, ast.ClassDef)
               and any(getattr(b, "id", "") == "Recipe" for b in n.bases))
    (folder / module).unlink()
    registry = folder / "__init__.py"
    lines = [line for line in registry.read_text().splitlines(keepends=True)
             if f"recipes.{module[:-3]} import" not in line]
    text = "".join(lines)
    assert f"{cls}, " in text or f", {cls}" in text, (module, cls)
    registry.write_text(text.replace(f"{cls}, ", "", 1) if f"{cls}, " in text else text.replace(f", {cls}", "", 1))


def run_one(tmp_path: Path, name: str, module: str) -> tuple[str, int, str]:
    copy = tmp_path / name
    shutil.copytree(REPO / "grounding_rl", copy / "grounding_rl")  # with its bytecode (a deleted module's is never used)
    delete(copy, module)
    tests = [str(REPO / test) for test, needs in RECIPE_TESTS.items() if name not in needs]
    gone = fields_of(RECIPES / module)
    env = {**os.environ, "PYTHONPATH": str(copy), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-c", "import grounding_rl\n" + CHECK, name, ",".join(gone), *tests],
                          cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    return name, done.returncode, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.slow
def test_each_recipe_can_be_deleted(tmp_path):
    names = registry_names()
    assert len(names) >= 10 and all((RECIPES / m).is_file() for m in names.values())
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda item: run_one(tmp_path, *item), names.items()))
    failed = [(name, code, out) for name, code, out in results if code != 0]
    assert not failed, "\n\n".join(f"--- without {name} (exit {code}):\n{out}" for name, code, out in failed)
