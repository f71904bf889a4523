"""Fingerprints of what produced a result, so that a rerun resumes only what is the same.

``eval``'s ``eval_config.json`` and every training checkpoint's ``run_fingerprint.json`` record them; a rerun whose
fingerprint differs refuses and says which entries changed (:func:`changes`). The package version is recorded, not the
git commit, so that a pull does not void every resume.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
CONFIG_FILES = ("config.json", "adapter_config.json", "grounding_config.json", "generation_config.json")


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes (a data file: its content, not its path or modification time)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def model_fingerprint(model: str | os.PathLike, revision: str | None = None) -> str:
    """A short fingerprint of a model: for a local folder, SHA-256 over its config files' bytes and each weight file's
    name, size and modification time (weights are not read: a 7B model is 15 GB); for a hub id, the id and revision.
    Retraining into the same folder changes it; copying a folder with its times (``cp -p``) keeps it."""
    path = Path(model)
    digest = hashlib.sha256()
    if not path.is_dir():
        digest.update(f"hub:{model}@{revision or 'main'}".encode())
        return digest.hexdigest()[:16]
    for item in sorted(path.iterdir()):
        if item.name in CONFIG_FILES:
            digest.update(item.name.encode() + b"\0" + item.read_bytes())
        elif item.suffix in WEIGHT_SUFFIXES and item.is_file():
            stat = item.stat()
            digest.update(f"{item.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def changes(previous: dict, current: dict, keys) -> list[str]:
    """``"key: old → new"`` for each of ``keys`` recorded in ``previous`` whose value differs in ``current`` (keys an
    older file did not record are not compared)."""
    out = []
    for key in keys:
        if key in previous and previous.get(key) != current.get(key):
            old, new = previous.get(key), current.get(key)
            out.append(f"{key}: {old!r} → {new!r}" if len(repr(old)) + len(repr(new)) < 120 else f"{key} changed")
    return out
