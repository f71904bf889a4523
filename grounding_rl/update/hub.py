"""Pushing a training run to the Hugging Face Hub (``push_to_hub``, ``hub_model_id``, ``hub_strategy``,
``hub_private_repo``, ``hub_token``, ``hub_revision``) only after the run's own files are written.

``transformers.Trainer`` pushes from inside its saves: ``save_model`` pushes before :class:`GroundingSaveMixin
<grounding_rl.update.saving.GroundingSaveMixin>` writes ``grounding_config.json``, ``run_fingerprint.json`` and the
model card, and ``_save_checkpoint`` pushes before the checkpoint's mark
(:mod:`grounding_rl.update.checkpoints`). The mixin switches both off (Trainer still creates the repository when the
trainer is built, so a wrong token or name fails before training); the pushes are here instead:

- :class:`HubPushCallback` (``on_save``, after Trainer's whole checkpoint save: mark written, old checkpoints
  rotated): with ``hub_strategy`` ``every_save``, ``checkpoint`` or ``all_checkpoints``, a *complete* checkpoint
  (:func:`grounding_rl.update.checkpoints.checkpoint_problem` is None; an incomplete one is never pushed) goes up in
  one commit: its model files and the run's files at the repository's top level (the run's files first), and for
  ``checkpoint`` / ``all_checkpoints`` the whole folder, its mark last, under ``last-checkpoint/`` /
  ``checkpoint-N/`` (Trainer's layout; ``--resume_from_checkpoint`` takes such a folder once downloaded);
- :func:`push_run` at the end of training (every strategy, ``end`` included): ``output_dir`` without its
  ``checkpoint-N`` folders, once the final model, its run files, ``trainer_state.json`` and the metrics are written.

Each push is one ``HfApi.create_commit`` and blocks training until it is uploaded (no push is ever skipped, so
``hub_always_push`` is not needed; a checkpoint cannot be rotated away while it uploads). Only the global main process
pushes. A checkpoint push that fails is logged and training goes on; a final push that fails is the user's one line
(the run is complete on disk).
"""
from __future__ import annotations

import logging
from pathlib import Path

from transformers import TrainerCallback

from grounding_rl.errors import UserError

logger = logging.getLogger(__name__)

RUN_FILES = ("grounding_config.json", "run_fingerprint.json", "README.md")  # pushed first in every commit
STATE_FILES = ("optimizer.pt", "scheduler.pt", "trainer_state.json", "latest", "zero_to_fp32.py")  # not at the top
STRATEGIES = ("end", "every_save", "checkpoint", "all_checkpoints")  # transformers' HubStrategy, every one
HUB_FIELDS = ("hub_model_id", "hub_strategy", "hub_revision", "hub_token")  # used only when pushing


def _value(value):
    return getattr(value, "value", value)


def settings_problems(args) -> list[str]:
    """Messages for hub settings no run could honour (empty when all is well), read before anything is written:
    ``push_to_hub`` while ``huggingface_hub`` is offline (``HF_HUB_OFFLINE``), and a ``hub_model_id``,
    ``hub_strategy``, ``hub_revision`` or ``hub_token`` given without ``push_to_hub`` (nothing would read it).

    Args:
        args: the stage's training config (``transformers.TrainingArguments``), after its ``__post_init__``.
    """
    if not getattr(args, "push_to_hub", False):
        defaults = {"hub_strategy": "every_save"}
        stray = [name for name in HUB_FIELDS if _value(getattr(args, name, None)) not in (None, defaults.get(name))]
        # the token's value is a secret: never in a message
        shown = {name: "" if name == "hub_token" else f" {_value(getattr(args, name))!r}" for name in stray}
        return [f"{name}{shown[name]} is set without push_to_hub: true, so nothing would be pushed; add push_to_hub: "
                "true or drop it" for name in stray]
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return ["push_to_hub: true needs the Hub, but HF_HUB_OFFLINE is set (huggingface_hub's offline mode): unset "
                "HF_HUB_OFFLINE to push, or drop push_to_hub and upload output_dir later (hf upload REPO OUTPUT_DIR)"]
    return []


def _files(folder: Path, top_level_only_model: bool) -> list[Path]:
    """The files of ``folder`` in push order: the run's files (:data:`RUN_FILES`) first, the rest sorted, the
    checkpoint's mark last. ``top_level_only_model``: leave out the training state (optimizer, scheduler, RNG,
    ``trainer_state.json``, DeepSpeed's ``global_stepN/``, the mark): a checkpoint's files for the repository's top
    level."""
    from grounding_rl.update.checkpoints import MARK, SAVING

    found = [p for p in sorted(folder.rglob("*")) if p.is_file()]
    skip_top = set(STATE_FILES) | {MARK}

    def kept(path: Path) -> bool:
        rel = path.relative_to(folder)
        if rel.name == SAVING or rel.parts[0].startswith(("_", ".")):
            return False
        if not top_level_only_model:
            return True
        return not (rel.name in skip_top or rel.name.startswith("rng_state") or rel.parts[0].startswith("global_step"))

    found = [p for p in found if kept(p)]
    first = [folder / name for name in RUN_FILES if folder / name in found]
    last = [p for p in found if p.name == MARK and p.parent == folder]
    return first + [p for p in found if p not in first and p not in last] + last


def _operations(folder: Path, prefix: str = "", top_level_only_model: bool = False) -> list:
    from huggingface_hub import CommitOperationAdd

    return [CommitOperationAdd(path_in_repo=prefix + path.relative_to(folder).as_posix(), path_or_fileobj=str(path))
            for path in _files(folder, top_level_only_model)]


def _commit(trainer, operations: list, message: str) -> None:
    """One ``HfApi.create_commit`` of ``operations`` to the run's repository; with ``hub_token`` set, without any
    ``training_args.bin`` (Trainer pickles the whole ``TrainingArguments`` into it, the token included)."""
    from huggingface_hub import HfApi

    args = trainer.args
    if args.hub_token:
        operations = [op for op in operations if op.path_in_repo.rsplit("/", 1)[-1] != "training_args.bin"]
    HfApi().create_commit(repo_id=trainer.hub_model_id, operations=operations, commit_message=message,
                          token=args.hub_token, revision=args.hub_revision)


def push_checkpoint(trainer, folder: str | Path) -> bool:
    """Push the complete checkpoint ``folder`` as ``hub_strategy`` asks (see the module docstring); returns whether
    it was pushed. An incomplete checkpoint (no mark, or a file missing or cut short) is not pushed (a warning); a
    failed upload is a warning and training goes on."""
    from grounding_rl.update.checkpoints import checkpoint_problem

    folder = Path(folder)
    strategy = _value(trainer.args.hub_strategy)
    problem = checkpoint_problem(folder)
    if problem is not None:
        logger.warning("push_to_hub: %s is not pushed: it is not complete (%s)", folder, problem)
        return False
    operations = _operations(folder, top_level_only_model=True)
    if strategy in ("checkpoint", "all_checkpoints"):
        operations += _operations(folder, "last-checkpoint/" if strategy == "checkpoint" else f"{folder.name}/")
    try:
        _commit(trainer, operations, f"Training in progress, step {trainer.state.global_step}")
    except Exception as err:  # noqa: BLE001 - a lost connection must not end a long run; the end push reports it
        logger.warning("push_to_hub: pushing %s to %s failed (%s); training goes on", folder, trainer.hub_model_id,
                       err)
        return False
    logger.info("push_to_hub: pushed %s to %s (%s)", folder.name, trainer.hub_model_id, strategy)
    return True


def push_run(trainer) -> None:
    """Push ``output_dir`` (its ``checkpoint-N`` folders left out) in one commit, the run's files first; called once
    the final model, ``grounding_config.json``, ``run_fingerprint.json``, the model card, ``trainer_state.json`` and
    the metrics are written. Nothing without ``push_to_hub``; only the global main process pushes.

    Raises:
        UserError: the upload failed (the repository and the reason; the run is complete in ``output_dir``).
    """
    if not trainer.args.push_to_hub or not trainer.is_world_process_zero():
        return
    from grounding_rl.update.checkpoints import checkpoint_step

    out = Path(trainer.args.output_dir)
    operations = [op for op in _operations(out) if checkpoint_step(op.path_in_repo.split("/", 1)[0]) is None]
    try:
        _commit(trainer, operations, "End of training")
    except Exception as err:  # noqa: BLE001 - any failure of the upload is the user's line (network, token, quota)
        raise UserError(f"push_to_hub: pushing {out} to {trainer.hub_model_id} failed ({err}); the run is complete "
                        f"there: upload it with hf upload {trainer.hub_model_id} {out}") from err
    logger.info("push_to_hub: pushed %s to https://huggingface.co/%s", out, trainer.hub_model_id)


def create_repo(trainer, token: str | None = None, private: bool | None = None) -> None:
    """Trainer's ``init_hf_repo`` (the repository ``hub_model_id``, or ``output_dir``'s name in the token's namespace,
    created if missing; the main process only) with its failures as one line.

    Raises:
        UserError: no token (``hf auth login`` or ``hub_token``), or the Hub refused (name, permission, network)."""
    from transformers import Trainer

    try:
        Trainer.init_hf_repo(trainer, token=token, private=private)
    except Exception as err:  # noqa: BLE001 - a user's token, name or connection; one line before training
        name = trainer.args.hub_model_id or Path(trainer.args.output_dir).absolute().name
        raise UserError(f"push_to_hub: creating the Hub repository {name} failed ({str(err).splitlines()[0]}); "
                        "log in with hf auth login (or set hub_token) and check hub_model_id") from err


def attach(trainer) -> None:
    """Add :class:`HubPushCallback` to ``trainer`` when it pushes checkpoints (``push_to_hub`` with a
    ``hub_strategy`` other than ``end``)."""
    if trainer.args.push_to_hub and _value(trainer.args.hub_strategy) != "end":
        trainer.add_callback(HubPushCallback(trainer))


class HubPushCallback(TrainerCallback):
    """Push each checkpoint once Trainer's save of it is over (:func:`push_checkpoint`; main process only)."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            push_checkpoint(self.trainer, Path(args.output_dir) / f"checkpoint-{state.global_step}")
