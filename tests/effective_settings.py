"""The effective settings of every shipped YAML, as golden files: what each one resolves to once parsed and validated.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python tests/effective_settings.py        # (re)writes tests/fixtures/effective_settings/

``configs/*.yaml`` go through the parser of the command that takes them (:func:`grounding_rl.cli.common.
parse_training_args`): ``distill`` when the YAML names a ``teacher_model_name_or_path``, ``sft`` when its file name
says ``sft``, else ``train``. Their effective settings are every field of every dataclass the parser returns (script
arguments, the stage's training config, ``trl.ModelConfig``, and any further dataclass it may return), after parsing
and validation, merged into one mapping by field name (a name in two dataclasses must hold one value), so that the
golden does not depend on how the fields are split between dataclasses. ``evaluation/*.yaml`` go through
:func:`grounding_rl.eval.benchmarks.load_benchmark` (what ``grounding-rl eval --benchmark`` reads): the
:class:`~grounding_rl.eval.benchmarks.Benchmark`'s fields, its protocol as ``GroundingConfig.to_dict()``.

Left out or normalised, because they vary by machine or by time: ``--use_cpu true`` is added to every training YAML
(bf16 needs a GPU otherwise, as tests/test_recipes.py does) so ``use_cpu`` is always true; absolute paths under the
repository root, the benchmark data folder or the shared folder are written relative to them (``<repo>/``,
``<data>/``, ``<shared>/``), and a model path as the YAML wrote it (a local model folder becomes absolute only once it
exists, e.g. after the demo ran); the fields :data:`MACHINE_FIELDS` (process rank and count, the hub token) are left
out. YAMLs resolve from the repository root, as the commands are run.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "fixtures" / "effective_settings"
MODEL_FIELDS = ("model_name_or_path", "teacher_model_name_or_path")
MACHINE_FIELDS = ("local_rank", "hub_token", "_n_gpu", "world_size", "process_index", "local_process_index")


def stage_of(path: Path) -> str:
    """The command that takes a ``configs/`` YAML: ``distill``, ``sft`` or ``train``."""
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    if "teacher_model_name_or_path" in data:
        return "distill"
    return "sft" if "sft" in path.name else "train"


def _plain(value, roots: dict[str, str]):
    """``value`` as JSON-able data, absolute paths under a root written relative to it."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), roots) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return _plain(value.value, roots)
    if isinstance(value, dict):
        return {str(k): _plain(v, roots) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, roots) for v in value]
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        for name, root in roots.items():
            if value == root or value.startswith(root + "/"):
                return f"<{name}>" + value[len(root):]
        return value
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return repr(value)


def _roots() -> dict[str, str]:
    from grounding_rl.paths import data_root, shared_dir

    roots = {}
    if data_root() is not None:
        roots["data"] = str(Path(data_root()).resolve())
    if shared_dir() is not None:
        roots["shared"] = str(shared_dir())
    return {**roots, "repo": str(REPO)}


def training_settings(path: Path) -> dict:
    """The effective settings of a ``configs/`` YAML (see the module docstring)."""
    from grounding_rl.cli.common import parse_training_args

    stage = stage_of(path)
    if stage == "distill":
        from grounding_rl.update.distill_config import DistillationConfig as config_class
    elif stage == "sft":
        from grounding_rl.update.sft import GroundingSFTConfig as config_class
    else:
        from grounding_rl.update.config import GroundingGRPOConfig as config_class
    parsed = parse_training_args(config_class, ["--config", str(path), "--use_cpu", "true"], f"grounding-rl {stage}")
    merged: dict = {}
    roots = _roots()
    for part in (*parsed, *getattr(parsed[1], "recipe_args", {}).values()):  # the recipes' own dataclasses
        for f in dataclasses.fields(part):
            if f.name in MACHINE_FIELDS:
                continue
            value = _plain(getattr(part, f.name), roots)
            if f.name in MODEL_FIELDS and isinstance(value, str) and value.startswith("<repo>/"):
                value = value[len("<repo>/"):]  # as written: absolute only when the folder exists here
            assert merged.get(f.name, value) == value, f"{path.name}: {f.name} differs between the parsed dataclasses"
            merged[f.name] = value
    return {"command": stage, "settings": dict(sorted(merged.items()))}


def benchmark_settings(path: Path) -> dict:
    """The effective settings of an ``evaluation/`` YAML (see the module docstring)."""
    from grounding_rl.eval.benchmarks import load_benchmark

    bench = load_benchmark(path)
    settings = _plain(bench, _roots())
    settings["protocol"] = None if bench.protocol is None else _plain(bench.protocol.to_dict(), _roots())
    return {"command": "eval --benchmark", "settings": settings}


def shipped_yamls() -> list[Path]:
    """Every shipped YAML that a command takes: ``configs/*.yaml`` and ``evaluation/*.yaml`` (not
    ``configs/accelerate/``, which ``accelerate launch`` reads)."""
    return sorted(REPO.glob("configs/*.yaml")) + sorted(REPO.glob("evaluation/*.yaml"))


def effective_settings(path: Path) -> dict:
    """The golden content for one shipped YAML."""
    settings = benchmark_settings(path) if path.parent.name == "evaluation" else training_settings(path)
    return {"yaml": str(path.relative_to(REPO)), **settings}


def golden_path(path: Path) -> Path:
    return GOLDEN / f"{path.parent.name}__{path.stem}.json"


def main() -> int:
    import os

    os.chdir(REPO)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for path in shipped_yamls():
        golden_path(path).write_text(json.dumps(effective_settings(path), indent=1, sort_keys=True) + "\n")
        print(golden_path(path).relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
