"""The record a development tool (``tiny-model``, ``demo-data``) leaves in its output folder, so that a rerun replaces
what the tool wrote there itself and nothing else: a finished training run, a user's ``train.jsonl`` or notes are
refused (one line naming the folder and the first such file) unless ``--overwrite`` is given.

The record (e.g. ``tiny_model.json``) is ``{"tool": ..., "files": [paths relative to the folder]}``.
"""
from __future__ import annotations

import os
from pathlib import Path

from grounding_rl.errors import UserError
from grounding_rl.run_record import read_record, write_record


def _files_under(out: Path) -> list[str]:
    """Every file (and symlink) under ``out``, as sorted POSIX paths relative to it, and every empty folder (its path
    and a final ``/``)."""
    found = []
    for root, dirs, names in os.walk(out):
        for name in names + [d for d in dirs if (Path(root) / d).is_symlink()]:
            found.append((Path(root) / name).relative_to(out).as_posix())
        if not dirs and not names and Path(root) != out:
            found.append(Path(root).relative_to(out).as_posix() + "/")
    return sorted(found)


def claim_folder(out: str | os.PathLike, record_name: str, overwrite: bool, tool: str = "this tool",
                 unrecorded=None) -> dict:
    """Make ``out`` ready for a tool that writes there: a missing or empty folder, or one holding only the files the
    tool's own record ``out/record_name`` lists (those are removed, with the record), is taken as is; with
    ``overwrite`` the listed files are removed and the others left as they are (the tool writes over its own names).
    ``unrecorded(out)``, when given, names the files of an output the tool wrote before it left records (taken as
    listed when there is no record; None when the folder is not such). A listed name outside ``out`` is never removed.

    Returns:
        The files left in ``out`` (relative path -> stat key), for :func:`record_folder` to tell them from the tool's.

    Raises:
        UserError: ``out`` is a file; or it holds a file the record does not list (a training run's
            ``model.safetensors``, a user's ``train.jsonl``; the first one, sorted, is named) and ``overwrite`` is
            false. Checked before anything is removed or written.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder")
    if not out.is_dir():
        return {}
    record = read_record(out / record_name)
    if record is None:
        record = {"files": (unrecorded(out) if unrecorded else None) or []}
    listed = {str(name) for name in record.get("files", [])} | {record_name}
    foreign = [name for name in _files_under(out) if name not in listed]
    if foreign and not overwrite:
        raise UserError(f"--out {out} holds files {tool} did not write ({foreign[0]}"
                        f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}); give a new or empty --out, "
                        f"or --overwrite to write over it")
    emptied = set()
    for name in listed:
        path = out / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            continue
        if path.is_file() or path.is_symlink():
            path.unlink()
            emptied.update(p for p in path.parents if out in p.parents)
    for folder in sorted(emptied, key=lambda p: len(p.parts), reverse=True):  # folders the removal left empty
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return _snapshot(out)


def _snapshot(out: Path) -> dict:
    """Relative path -> (inode, size, modification time in ns) of every file under ``out``."""
    stats = {}
    for name in _files_under(out):
        st = (out / name).lstat()
        stats[name] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return stats


def record_folder(out: str | os.PathLike, record_name: str, tool: str, before: dict) -> None:
    """Write ``out/record_name``: ``{"tool": tool, "files": [...]}``, the files under ``out`` that are new or changed
    since ``before`` (:func:`claim_folder`'s snapshot; a file left by someone else and not written over stays out of
    the record). Call it last, once the tool has written everything."""
    out = Path(out)
    names = [n for n, st in _snapshot(out).items() if n != record_name and before.get(n) != st]
    write_record(out / record_name, {"tool": tool, "files": names})
