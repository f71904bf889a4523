"""Where things live: the repository root, the shared data folder, paths named inside configs, and the permissions of
the files the package writes."""
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


def file_mode() -> int:
    """The mode ``open()`` gives a new file: ``0o666`` less the process umask (``0o644`` under umask 022).

    Reading the umask means setting it (``os.umask`` returns the old value), so it is set back at once."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def follow_umask(path: str | os.PathLike) -> None:
    """Give ``path`` (a file), or every regular file under it (a folder, recursively), the mode ``open()`` would
    (:func:`file_mode`).

    ``tempfile.mkstemp`` creates files ``0o600``, and so does safetensors' ``save_file`` (0.8, hence transformers'
    and PEFT's ``save_pretrained``): without this a checkpoint or report on a shared cluster is readable by its
    writer alone. Files already at the mode, and links, are left as they are.
    """
    mode = file_mode()
    path = Path(path)
    files = [path] if not path.is_dir() else [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    for item in files:
        if item.is_symlink():
            continue
        if item.stat().st_mode & 0o777 != mode:
            os.chmod(item, mode)
