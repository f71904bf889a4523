"""Checkpoints that are complete or absent: a ``checkpoint-N`` counts only when its mark, ``checkpoint_complete.json``
(every file of the folder with its size), was written last, after every file and every rank's shard.

transformers' ``Trainer._save_checkpoint`` writes a checkpoint in place (weights, optimizer, scheduler, RNG states,
``trainer_state.json``), so a process killed during a save leaves a folder that looks like a checkpoint but cannot
resume. :class:`CompleteCheckpointMixin` starts each save with an empty ``.checkpoint_saving`` file, writes the mark
after the whole save (after a barrier, so a DeepSpeed checkpoint's every shard is in), then removes
``.checkpoint_saving``, and rotates old checkpoints (``save_total_limit``) only after the mark, so the last complete
checkpoint is never deleted for an incomplete one. :func:`checkpoint_problem` reads completeness from the folder: with
a mark, every listed file must be there at its size; with ``.checkpoint_saving`` alone, the save did not finish; a
folder of an earlier version (neither) must have a readable
``trainer_state.json`` and whole ``*.safetensors`` files (the size their header promises) and torch files (a zip
whose directory is at the end). :func:`newest_complete` is what ``resume_from_checkpoint: true`` takes.

Anchors: torchtitan and Megatron-LM count a checkpoint only when complete; orbax writes a commit marker last.

Fault injection (tests only): with ``GROUNDING_RL_FAULT_AFTER=NAME`` set, the process kills itself (SIGKILL) during a
save as soon as a file matching ``NAME`` (a glob against the path inside the folder being written, or with that
folder's name in front: ``optimizer.pt``, ``checkpoint-3/rng_state*.pth``) exists, checked after each stage (weights,
optimizer and scheduler, RNG state, trainer state, the mark).
"""
from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil
import signal
import zipfile
from pathlib import Path

from grounding_rl.errors import UserError, disk_error

logger = logging.getLogger(__name__)

MARK = "checkpoint_complete.json"
SAVING = ".checkpoint_saving"  # written first, removed after the mark: a folder holding it alone was cut short
FAULT_ENV = "GROUNDING_RL_FAULT_AFTER"
PREFIX = "checkpoint-"


def checkpoint_files(folder: str | os.PathLike) -> dict[str, int]:
    """``{relative path: size in bytes}`` of every file under ``folder`` (DeepSpeed's ``global_stepN/`` included),
    except the mark itself."""
    root = Path(folder)
    return {str(path.relative_to(root)): path.stat().st_size for path in sorted(root.rglob("*"))
            if path.is_file() and path.name not in (MARK, f".{MARK}.tmp", SAVING)}


def write_mark(folder: str | os.PathLike, global_step: int) -> None:
    """Write ``folder/checkpoint_complete.json`` (``{"global_step", "files": {path: bytes}}``) atomically and durably
    (a temporary file, ``fsync``, ``os.replace``, then the folder's ``fsync``): the last file of a complete
    checkpoint."""
    folder = Path(folder)
    files = checkpoint_files(folder)
    tmp = folder / f".{MARK}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump({"global_step": global_step, "files": files}, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, folder / MARK)
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _safetensors_problem(path: Path) -> str | None:
    """Why a ``.safetensors`` file is not whole (its 8-byte header length, JSON header and the data its offsets
    promise), or None."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            if size < 8 or 8 + length > size:
                return f"{path.name} is cut short ({size} bytes)"
            header = json.loads(handle.read(length))
    except (OSError, ValueError) as err:
        return f"{path.name} is unreadable ({err})"
    end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
    return None if 8 + length + end == size else f"{path.name} is cut short ({size} of {8 + length + end} bytes)"


def checkpoint_problem(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` is not a complete checkpoint, or None when it is.

    With the mark: every file it lists exists with its size. Without (a checkpoint of an earlier version): a readable
    ``trainer_state.json``, whole ``*.safetensors`` files and whole torch files (``*.pt``, ``*.pth``: a zip archive
    with its directory at the end).

    Returns:
        e.g. ``"no trainer_state.json"``, ``"model.safetensors is cut short (1000 of 98304 bytes)"``,
        ``"optimizer.pt is 1000 bytes, 5000 when saved"``.
    """
    root = Path(folder)
    mark = root / MARK
    if mark.is_file():
        try:
            listed = json.loads(mark.read_text(encoding="utf-8"))["files"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            return f"{MARK} is unreadable ({err})"
        for name, size in listed.items():
            path = root / name
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != size:
                return f"{name} is {path.stat().st_size} bytes, {size} when saved"
        return None
    if (root / SAVING).exists():
        return "its save did not finish"
    state = root / "trainer_state.json"
    if not state.is_file():
        return "no trainer_state.json"
    try:
        json.loads(state.read_text(encoding="utf-8"))["global_step"]
    except (OSError, ValueError, KeyError, TypeError):
        return "trainer_state.json is cut short"
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        if path.suffix == ".safetensors":
            problem = _safetensors_problem(path)
            if problem:
                return problem
        elif path.suffix in (".pt", ".pth") and not zipfile.is_zipfile(path):
            return f"{path.relative_to(root)} is cut short"
    return None


def checkpoint_step(folder: str | os.PathLike) -> int | None:
    """N of a ``checkpoint-N`` folder name, or None for another name."""
    name = Path(folder).name
    return int(name[len(PREFIX):]) if name.startswith(PREFIX) and name[len(PREFIX):].isdigit() else None


def newest_complete(output_dir: str | os.PathLike) -> tuple[str | None, list[tuple[str, str]]]:
    """The complete ``checkpoint-N`` of ``output_dir`` with the largest N, and the incomplete ones newer than it.

    Returns:
        ``(folder or None, [(skipped folder, why), ...])``, newest first; ``(None, [])`` when ``output_dir`` is not
        a folder or holds no ``checkpoint-N``.
    """
    if not os.path.isdir(output_dir):
        return None, []
    folders = sorted((p for p in Path(output_dir).iterdir() if p.is_dir() and checkpoint_step(p) is not None),
                     key=checkpoint_step, reverse=True)
    skipped = []
    for folder in folders:
        problem = checkpoint_problem(folder)
        if problem is None:
            return str(folder), skipped
        skipped.append((str(folder), problem))
    return None, skipped


def fault_point(folder: str | os.PathLike) -> None:
    """Tests only: SIGKILL this process when ``$GROUNDING_RL_FAULT_AFTER`` names (a glob of) a file now in
    ``folder``. Nothing happens without the variable."""
    pattern = os.environ.get(FAULT_ENV)
    if not pattern or not os.path.isdir(folder):
        return
    names = [*checkpoint_files(folder), *([MARK] if os.path.isfile(os.path.join(folder, MARK)) else [])]
    here = Path(folder).name
    if any(fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch(f"{here}/{name}", pattern) for name in names):
        logger.warning("%s=%s: killing this process in the save of %s", FAULT_ENV, pattern, folder)
        _die()


def _die() -> None:
    """SIGKILL this process at once (no handler, no flush: what the out-of-memory killer or a lost node does)."""
    os.kill(os.getpid(), signal.SIGKILL)


def _writer(is_main_process: bool) -> bool:
    """``PreTrainedModel.should_save_on_this_rank`` for a rank the Trainer makes write (``args.should_save``)."""
    return is_main_process


class CompleteCheckpointMixin:
    """Mixed into a ``transformers.Trainer`` (before it): each ``checkpoint-N`` gets its mark last
    (:func:`write_mark`), after ``_save_checkpoint_extras`` and a barrier across ranks; ``save_total_limit`` rotation
    runs after the mark; :func:`fault_point` after each stage of a save. A save that fails for a full disk, a
    file-size limit or a quota (:func:`grounding_rl.errors.disk_error`) removes what it wrote and raises a
    :class:`grounding_rl.errors.UserError` naming the folder (one line, exit 2). Every process that saves
    (``args.should_save``: the main one, or with ``save_on_each_node`` each node's first, into its node's own
    ``output_dir``) writes the whole checkpoint, weights included (:meth:`save_model`), and its mark."""

    def _save_checkpoint_extras(self, folder: str) -> None:
        """Files a trainer adds to a checkpoint before its mark (the GRPO trainer: rollout format, recipe state)."""

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        model = self.accelerator.unwrap_model(self.model)
        if self.args.should_save and self.args.process_index != 0 and hasattr(model, "should_save_on_this_rank"):
            # save_on_each_node: transformers (5.24) writes the weights and config.json on torch.distributed's rank 0
            # alone, whatever is_main_process says, so another node's folder got a checkpoint without weights
            model.should_save_on_this_rank = _writer
        super().save_model(output_dir, _internal_call)
        fault_point(output_dir or self.args.output_dir)

    def _save_optimizer_and_scheduler(self, output_dir):
        super()._save_optimizer_and_scheduler(output_dir)
        fault_point(output_dir)

    def _save_rng_state(self, output_dir):
        super()._save_rng_state(output_dir)
        fault_point(output_dir)

    def _save_checkpoint(self, model, trial):
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        run_dir = self._get_output_dir(trial=trial)
        folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save:  # a save cut short earlier, or a later run's, is never overwritten in place
            if os.path.isdir(folder):
                shutil.rmtree(folder)
            os.makedirs(folder)
            Path(folder, SAVING).touch()
        self.accelerator.wait_for_everyone()
        limit = self.args.save_total_limit
        self.args.save_total_limit = None  # rotated below, once the new checkpoint is complete
        try:
            super()._save_checkpoint(model, trial)
            fault_point(folder)
            if self.args.should_save:
                self._save_checkpoint_extras(folder)
        except Exception as err:  # noqa: BLE001 - only a full disk is turned into a user's line; the rest re-raise
            why = disk_error(err)
            if why is None:
                raise
            if self.args.should_save:
                shutil.rmtree(folder, ignore_errors=True)  # what was written of it, to give the space back
            raise UserError(f"{folder}: writing the checkpoint failed ({why}); the earlier checkpoints are intact: "
                            "free space and run the same command with --resume_from_checkpoint auto") from err
        finally:
            self.args.save_total_limit = limit
        self.accelerator.wait_for_everyone()  # every rank's shard and RNG state is in
        if self.args.should_save:
            write_mark(folder, self.state.global_step)
            fault_point(folder)
            os.remove(os.path.join(folder, SAVING))
            self._rotate_after_mark(run_dir)

    def _rotate_after_mark(self, run_dir: str) -> None:
        """``save_total_limit``'s rotation (transformers' own), run once the newest checkpoint is complete."""
        if not self.args.save_total_limit:
            return
        try:
            from transformers.trainer import rotate_checkpoints
        except ImportError:  # transformers before 5.20: a Trainer method
            self._rotate_checkpoints(use_mtime=True, output_dir=run_dir)
            return
        rotate_checkpoints(output_dir=run_dir, save_total_limit=self.args.save_total_limit,
                           best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)
