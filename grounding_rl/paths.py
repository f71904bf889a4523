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


def resolve_config_path(value: str | os.PathLike | None) -> str | None:
    """Resolve a path written in a config or script argument.

    Absolute paths are kept. A path starting with ``../shared`` honours ``$GROUNDING_RL_SHARED``. Other relative paths
    resolve against the repository root when they exist there (configs name paths relative to the root), else are kept
    relative to the working directory. Strings that do not look like local paths (hub ids such as ``Qwen/Qwen2.5-VL-7B``)
    are returned unchanged when nothing exists at either place.
    """
    if value is None:
        return None
    text = str(value)
    parts = Path(text).parts
    if len(parts) >= 2 and parts[0] == ".." and parts[1] == "shared" and os.environ.get("GROUNDING_RL_SHARED"):
        return str(Path(os.environ["GROUNDING_RL_SHARED"]).joinpath(*parts[2:]))
    path = Path(text)
    if path.is_absolute():
        return text
    if (REPO_ROOT / path).exists() or (text.startswith(("configs/", "data/", "outputs/", "../")) and not path.exists()):
        return str((REPO_ROOT / path).resolve())
    return text
