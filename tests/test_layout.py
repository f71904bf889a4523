"""The package's stages import one way, in data-flow order (README, "Layout"): no module imports from a later stage.

The order: base modules (``grounding_rl/__init__.py``, ``paths.py``, ``errors.py``, ``yaml_files.py``) → ``data`` → ``family`` →
``prompts`` → ``models`` → ``rollout`` → ``reward`` → ``update`` → ``eval`` → ``cli``. Every import of
``grounding_rl.…`` in the package, also inside functions, is read with ``ast``.
"""
import ast
from pathlib import Path

import grounding_rl

ORDER = ("data", "family", "prompts", "models", "rollout", "reward", "update", "eval", "cli")
BASE = {"__init__", "paths", "errors", "yaml_files"}
PACKAGE = Path(grounding_rl.__file__).parent


def stage_of(module: str) -> int:
    """-1 for base modules, else the index of the stage in ORDER. KeyError for a module outside any stage."""
    parts = module.split(".")
    assert parts[0] == "grounding_rl", module
    if len(parts) == 1 or parts[1] in BASE:
        return -1
    return ORDER.index(parts[1])


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import of grounding_rl in a file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "grounding_rl"]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import"
            if node.module and node.module.split(".")[0] == "grounding_rl":
                if node.module == "grounding_rl":  # from grounding_rl import x: a stage, or a name of the base
                    out += [(node.lineno, f"grounding_rl.{a.name}" if a.name in ORDER else "grounding_rl")
                            for a in node.names]
                else:
                    out.append((node.lineno, node.module))
    return out


def test_every_module_belongs_to_a_stage():
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(("grounding_rl",) + path.relative_to(PACKAGE).with_suffix("").parts)
        stage_of(module.removesuffix(".__init__") if module != "grounding_rl.__init__" else "grounding_rl")


def test_imports_run_one_way():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        own = -1 if len(rel.parts) == 1 else ORDER.index(rel.parts[0])
        for line, module in imports_of(path):
            target = stage_of(module)
            if target > own:
                violations.append(f"grounding_rl/{rel}:{line} imports {module} (stage {ORDER[target]} comes after "
                                  f"{'base' if own < 0 else ORDER[own]})")
    assert not violations, "\n".join(violations)


def test_the_checker_sees_a_backward_import(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from grounding_rl.update.sft import answer_text\n")
    assert imports_of(bad) == [(2, "grounding_rl.update.sft")]
    assert stage_of("grounding_rl.update.sft") > stage_of("grounding_rl.models.tiny")
