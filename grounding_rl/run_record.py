"""The run record: what produced a result, written beside it and checked before a rerun reuses it, so that a rerun
resumes only what is the same. One module writes, reads and compares every record:

* ``run_fingerprint.json`` in a training run's folder and every checkpoint (``train``, ``sft``: the train file and its
  content hash, the model and its fingerprint, prompt and video settings, sampling, data selection, LoRA, seeds);
* ``eval_config.json`` in an evaluation folder (``eval``, and ``difficulty``'s work folder: model, data and hash,
  prompt and video settings, generation budget, dtype);
* ``D_scored.json`` beside a scored data file (``difficulty``: the evaluation's record plus the rewards and counts).

A rerun whose record differs refuses in one line naming what changed (:func:`check_record`, :func:`changes`). The
package version is recorded, not the git commit, so that a pull does not void every resume.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from grounding_rl.errors import UserError

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


def read_record(path: str | os.PathLike) -> dict | None:
    """The record at ``path``, or None when there is no such file.

    Raises:
        UserError: the file is not a JSON object (names it).
    """
    path = Path(path)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not a run record ({err}); delete it or give a new output folder") from None
    if not isinstance(record, dict):
        raise UserError(f"{path}: not a run record (a JSON object); delete it or give a new output folder")
    return record


def write_record(path: str | os.PathLike, record: dict) -> None:
    """Write ``record`` as indented JSON with a final newline, atomically (a temporary file, then ``os.replace``), with
    the permissions ``open()`` would give it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def check_record(path: str | os.PathLike, record: dict, keys, what: str, advice: str) -> None:
    """Refuse when the record at ``path`` differs from ``record`` in any of ``keys`` (nothing to compare when there
    is no file, or for keys the file does not record).

    Args:
        path: the saved record.
        record: this run's.
        keys: the entries that must match.
        what: the start of the message, e.g. ``"out/ holds predictions made by something else"``.
        advice: its end: the ways on.

    Raises:
        UserError: ``"{what} (key: old → new; …); {advice}"``.
    """
    previous = read_record(path)
    differ = changes(previous, record, keys) if previous is not None else []
    if differ:
        raise UserError(f"{what} ({'; '.join(differ)}); {advice}")


# What a training run (``train``, ``sft``, ``distill``) writes into its ``output_dir``: glob patterns of top-level
# names, folders included (``checkpoint-*``, TensorBoard's ``runs``). One place: a stage that starts writing another
# file into a run folder adds it here. Each run records the list in its ``run_fingerprint.json`` (``outputs``);
# ``--replace_output_dir true`` removes only what matches the run's own list (this one for a run written before the
# record had it) and refuses a folder holding anything else (:func:`foreign_to_run`).
RUN_OUTPUTS = (
    "run_fingerprint.json", "trainer_state.json", "training_args.bin", "train_results.json", "all_results.json",
    "eval_results.json", "completions.jsonl", "grounding_config.json", "README.md",  # the model card
    "config.json", "generation_config.json", "model.safetensors", "model-*-of-*.safetensors",
    "model.safetensors.index.json", "pytorch_model*.bin", "adapter_config.json", "adapter_model.safetensors",
    "adapter_model.bin", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "chat_template.json", "chat_template.jinja", "preprocessor_config.json",
    "video_preprocessor_config.json", "processor_config.json", "checkpoint-*", "runs", "wandb", "*.log",
    ".run_fingerprint.json.tmp", "training_curves.png",
)


def foreign_to_run(folder: str | os.PathLike, record: dict | None) -> list[str]:
    """The top-level names in ``folder`` that its run did not write: those matching none of the record's ``outputs``
    patterns (:data:`RUN_OUTPUTS` when ``record`` is None or lists none), sorted."""
    from fnmatch import fnmatchcase

    patterns = (record or {}).get("outputs") or RUN_OUTPUTS
    return sorted(p.name for p in Path(folder).iterdir() if not any(fnmatchcase(p.name, pat) for pat in patterns))
