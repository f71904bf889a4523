"""Where things live: the repository root, the shared data folder, and paths named inside configs."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_dir() -> Path | None:
    """The folder of real clips, benchmark annotations and Qwen processor files used by tests and benchmarks.

    ``$GROUNDING_RL_SHARED`` when set, else ``../shared`` beside the repository root. Returns None when it is absent.
    """
    env = os.environ.get("GROUNDING_RL_SHARED")
    path = Path(env) if env else REPO_ROOT.parent / "shared"
    return path.resolve() if path.is_dir() else None


def _shared_path(text: str) -> str | None:
    """``../shared/…`` under ``$GROUNDING_RL_SHARED`` when that is set, else None."""
    parts = Path(text).parts
    if len(parts) >= 2 and parts[0] == ".." and parts[1] == "shared" and os.environ.get("GROUNDING_RL_SHARED"):
        return str(Path(os.environ["GROUNDING_RL_SHARED"]).joinpath(*parts[2:]))
    return None


def resolve_config_path(value: str | os.PathLike | None) -> str | None:
    """A path from the command line or a training config, as the user typed it: absolute paths are kept, relative
    ones resolve against the current working directory (never the package's folder, so an installed package writes
    nothing inside itself). ``../shared/…`` honours ``$GROUNDING_RL_SHARED`` (the test data). None stays None."""
    if value is None:
        return None
    text = str(value)
    shared = _shared_path(text)
    if shared is not None:
        return shared
    path = Path(text).expanduser()
    return str(path if path.is_absolute() else (Path.cwd() / path).resolve())


def resolve_model_path(value: str | os.PathLike | None) -> str | None:
    """A model given as a local folder or a hub id: a path that exists (relative to the working directory) becomes
    absolute; anything else (``Qwen/Qwen2.5-VL-7B-Instruct``) is returned unchanged."""
    if value is None:
        return None
    resolved = resolve_config_path(value)
    return resolved if Path(resolved).exists() else str(value)


DATA_ENV = "GROUNDING_RL_DATA"


def data_root(flag: str | os.PathLike | None = None) -> Path | None:
    """The folder that benchmark definitions (``evaluation/*.yaml``) name their annotation files in: ``flag`` (e.g.
    ``--data-root``), else ``$GROUNDING_RL_DATA``, else the test data's ``benchmarks/`` folder
    (:func:`shared_dir`), else None. data/README.md says where each benchmark's files come from."""
    if flag:
        return Path(resolve_config_path(flag))
    if os.environ.get(DATA_ENV):
        return Path(resolve_config_path(os.environ[DATA_ENV]))
    shared = shared_dir()
    return shared / "data" / "benchmarks" if shared is not None else None
