"""The package's import graph (README, "Layout"): a table of the edges allowed between stages, and no circles.

Stages and what each may import (besides itself):

    base     grounding_rl/__init__.py, paths.py, errors.py, yaml_files.py, jsonl_files.py, run_record.py, stopping.py:
             nothing
    data     base
    family   base, data
    prompts  base, data, family
    models   base, data, family, prompts
    rollout  base, data, family, prompts, models          (rollout and reward are siblings)
    reward   base, data, family, prompts
    update   base, data, family, prompts, models, rollout, reward   (update and eval are siblings)
    eval     base, data, family, prompts, models, rollout, reward
    dev      base, data, family, prompts, models          (development tools; no runtime stage imports them)
    cli      everything (the entry layer)

Every import of ``grounding_rl.…`` in the package, also inside functions, is read with ``ast``. An edge that is not in
the table is an arrow that runs back up (or sideways between siblings); a circle is a set of modules that import each
other, directly or through others (Tarjan's strongly connected components over modules).
"""
import ast
from pathlib import Path

import grounding_rl

BASE = {"__init__", "paths", "errors", "yaml_files", "jsonl_files", "run_record", "stopping"}
_BELOW_MODELS = {"base", "data", "family", "prompts"}
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "data": {"base"},
    "family": {"base", "data"},
    "prompts": {"base", "data", "family"},
    "models": _BELOW_MODELS,
    "rollout": _BELOW_MODELS | {"models"},
    "reward": _BELOW_MODELS,
    "update": _BELOW_MODELS | {"models", "rollout", "reward"},
    "eval": _BELOW_MODELS | {"models", "rollout", "reward"},
    "dev": _BELOW_MODELS | {"models"},
    "cli": {"base", "data", "family", "prompts", "models", "rollout", "reward", "update", "eval", "dev"},
}
PACKAGE = Path(grounding_rl.__file__).parent


def stage_of(module: str) -> str:
    """The stage of a module name (``base`` for the base modules). KeyError for a module outside any stage."""
    parts = module.split(".")
    assert parts[0] == "grounding_rl", module
    if len(parts) == 1 or parts[1] in BASE:
        return "base"
    if parts[1] not in ALLOWED:
        raise KeyError(f"{module} belongs to no stage of tests/test_layout.py's table")
    return parts[1]


def module_of(path: Path) -> str:
    parts = ("grounding_rl",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, known: set[str] | None = None) -> list[tuple[int, str]]:
    """(line, module) of every absolute import of grounding_rl in a file; ``from grounding_rl.x import y`` names the
    module ``grounding_rl.x.y`` when that is one of ``known``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "grounding_rl"]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import"
            if node.module and node.module.split(".")[0] == "grounding_rl":
                for alias in node.names:
                    name = f"{node.module}.{alias.name}"
                    out.append((node.lineno, name if known and name in known else node.module))
    return out


def graph() -> dict[str, set[str]]:
    """Module → the package modules it imports."""
    paths = {module_of(p): p for p in PACKAGE.rglob("*.py")}
    return {m: {t for _, t in imports_of(p, set(paths)) if t in paths and t != m} for m, p in paths.items()}


def back_arrows(edges: dict[str, set[str]]) -> list[str]:
    """The imports whose stage edge is not in :data:`ALLOWED`."""
    return sorted(f"{m} imports {t} ({stage_of(m)} may not import {stage_of(t)})"
                  for m, targets in edges.items() for t in targets
                  if stage_of(t) != stage_of(m) and stage_of(t) not in ALLOWED[stage_of(m)])


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_belongs_to_a_stage():
    for path in PACKAGE.rglob("*.py"):
        stage_of(module_of(path))


def test_no_arrow_runs_back_up():
    assert back_arrows(graph()) == []


def test_no_circles():
    assert circles(graph()) == []


def test_every_subcommand_and_parser_lives_in_cli():
    """Each ``main()`` and each ``argparse`` parser of the package is in ``grounding_rl/cli/``."""
    outside = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "cli":
            continue
        tree = ast.parse(path.read_text())
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        uses_argparse = any(isinstance(n, (ast.Import, ast.ImportFrom)) and "argparse" in ast.unparse(n)
                            for n in ast.walk(tree))
        if "main" in names or uses_argparse:
            outside.append(str(path.relative_to(PACKAGE)))
    assert outside == []


def test_the_checker_sees_a_sibling_import_and_a_circle(tmp_path):
    """eval importing update is an arrow sideways, update importing cli one back up; two modules importing each other
    are a circle."""
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from grounding_rl.update.sft import answer_text\n")
    assert imports_of(bad) == [(2, "grounding_rl.update.sft")]
    edges = {"grounding_rl.eval.evaluate": {"grounding_rl.update.sft"},
             "grounding_rl.update.sft": {"grounding_rl.cli.common"}, "grounding_rl.cli.common": set()}
    assert len(back_arrows(edges)) == 2
    assert circles({"grounding_rl.data.a": {"grounding_rl.data.b"}, "grounding_rl.data.b": {"grounding_rl.data.a"},
                    "grounding_rl.data.c": {"grounding_rl.data.a"}}) == [["grounding_rl.data.a",
                                                                           "grounding_rl.data.b"]]


LONGEST = 60  # lines of a function, ``def`` to its body's last line (decorators excluded)
SHORT_FOLDERS = ("eval", "rollout", "cli")


def long_functions(root: Path = PACKAGE, folders=SHORT_FOLDERS, most: int = LONGEST) -> dict[tuple[str, str], str]:
    """``{(path under root, function name): "path:line name N lines"}`` of every function (``def`` or ``async def``,
    methods and nested functions included) longer than ``most`` lines in ``folders``."""
    out = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > most:
                        name = path.relative_to(root).as_posix()
                        out[(name, node.name)] = f"{name}:{node.lineno} {node.name} {lines} lines"
    return out


def test_no_function_in_eval_rollout_or_cli_is_longer_than_60_lines():
    found = long_functions()
    assert sorted(found.values()) == []


def test_the_length_check_sees_methods_and_async_functions(tmp_path):
    """61 lines (a method, an async one) are too long, 60 are not."""
    (tmp_path / "cli").mkdir()

    def function(head: str, lines: int, indent: str = "") -> str:
        return indent + head + "\n" + "".join(f"{indent}    x = {i}\n" for i in range(lines - 1))

    (tmp_path / "cli" / "m.py").write_text("class A:\n" + function("async def f(self):", 61, "    ")
                                           + function("def g():", 61) + function("def h():", 60))
    assert sorted(long_functions(tmp_path, ("cli",))) == [("cli/m.py", "f"), ("cli/m.py", "g")]


def test_no_family_is_named_outside_the_family_stage():
    """Family differences live on :class:`grounding_rl.family.Family` : no string literal naming a family
    (``"qwen2_5_vl"``, ``"qwen3_vl"``, or any other family's name) outside ``grounding_rl/family/``, whatever its use
    (a comparison, ``in``, a dict key)."""
    from grounding_rl.family import families

    names = {name for family in families() for name in (family.name, *family.model_types)}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "family":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.value!r}")
    assert found == []


def trainer_uses(folder: Path) -> list[str]:
    """``file:line`` of every ``trainer.<attribute>`` and every parameter named ``trainer`` under ``folder``."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            used = (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "trainer"
                    or isinstance(node, ast.arg) and node.arg == "trainer")
            if used:
                found.append(f"{path.relative_to(folder.parent)}:{node.lineno}")
    return found


def test_recipes_never_see_the_trainer(tmp_path):
    """Hooks receive a :class:`grounding_rl.update.recipes.base.StepContext`, not the trainer: no ``trainer.`` read or
    set and no parameter named ``trainer`` in ``update/recipes/``; the check sees each kind."""
    assert trainer_uses(PACKAGE / "update" / "recipes") == []
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.py").write_text("def f(trainer):\n    pass\n\n\ndef g(t):\n    t.x = 1\n\n\n"
                                               "def h(c):\n    trainer = c\n    trainer.y = c.trainer\n")
    assert trainer_uses(tmp_path / "recipes") == ["recipes/r.py:1", "recipes/r.py:11"]
