"""The trackers ``report_to`` names (transformers' integrations): checked before any model loads, and the one place
that sends the completions table of ``log_completions`` to each of them that is active.

trackio, tensorboard and wandb are the project's extra (``pip install 'grounding-rl[trackers]'``; the ``dev`` extra
includes it). Where each keeps its files: tensorboard's event files under ``output_dir/runs/`` (``logging_dir``),
trackio's local store under ``TRACKIO_DIR`` (default ``~/.cache/huggingface/trackio``), wandb's run under
``WANDB_DIR/wandb/`` (``output_dir`` unless ``WANDB_DIR`` is set; ``WANDB_MODE=offline`` keeps it local).
"""
from __future__ import annotations

import json
import os
import sys

from grounding_rl.errors import UserError

EXTRA = "pip install 'grounding-rl[trackers]'"
OWN = ("trackio", "tensorboard", "wandb")  # the trackers of the extra, each tested in CI


def check_trackers(report_to, where: str) -> None:
    """Refuse a tracker of ``report_to`` that is unknown to transformers or not installed, before any model loads
    (transformers would fail when the Trainer is built, after the weights loaded, with a 29-line traceback).

    Args:
        report_to: ``TrainingArguments.report_to`` after its own normalisation (a list of names; ``[]`` for "none").
        where: the config file (or "command line") the line names.
    Raises:
        UserError: one line naming ``report_to``, the tracker and the install command (the extra for trackio,
            tensorboard and wandb).
    """
    from transformers.integrations import INTEGRATION_TO_CALLBACK, get_available_reporting_integrations

    names = list(report_to or [])
    if not names:
        return
    unknown = [name for name in names if name not in INTEGRATION_TO_CALLBACK]
    if unknown:
        raise UserError(f"{where}: report_to {unknown[0]!r} is not a tracker; one of none, all, "
                        f"{', '.join(INTEGRATION_TO_CALLBACK)}")
    available = set(get_available_reporting_integrations())
    missing = [name for name in names if name not in available]
    if missing:
        how = EXTRA if missing[0] in OWN else f"pip install {missing[0]}"
        raise UserError(f"{where}: report_to {missing[0]!r}: {missing[0]} is not installed ({how}), or drop it "
                        "from report_to")
    if "trackio" in names:
        _trackio_init_to_stderr()


def _trackio_init_to_stderr() -> None:
    """``trackio.init`` prints where its metrics go (``* Trackio project initialized: …``, ``* Created new run: …``)
    on stdout, which carries only a command's own output: while it runs, stdout is stderr (idempotent)."""
    import contextlib
    import functools

    import trackio

    init = trackio.init
    if getattr(init, "prints_to_stderr", False):
        return

    @functools.wraps(init)
    def init_printing_to_stderr(*args, **kwargs):
        with contextlib.redirect_stdout(sys.stderr):
            return init(*args, **kwargs)

    init_printing_to_stderr.prints_to_stderr = True
    trackio.init = init_printing_to_stderr


def default_wandb_dir(report_to, output_dir: str) -> None:
    """With wandb in ``report_to``, keep its run folder in the run's folder (``output_dir/wandb/``) unless
    ``WANDB_DIR`` is set (wandb's own default is the working directory)."""
    if "wandb" in (report_to or []):
        os.environ.setdefault("WANDB_DIR", str(output_dir))


def _cell(value):
    """A table cell: numbers and text as they are, lists and None as JSON text (every tracker's table takes it)."""
    return value if isinstance(value, (str, int, float)) and not isinstance(value, bool) else json.dumps(value)


def log_completions_table(trainer, columns: list[str], rows: list[list]) -> list[str]:
    """Send one generation's completions (``columns``, ``rows``: one list of cells per completion) to every active
    tracker of ``trainer.args.report_to`` that keeps tables: wandb and trackio as a table under ``completions`` (as
    TRL's ``log_completions``), tensorboard as a text summary ``completions`` (a Markdown table: it has no table type),
    at the trainer's global step. Main process only; returns the trackers written to."""
    report_to = trainer.args.report_to or []
    data = [[_cell(v) for v in row] for row in rows]
    step = trainer.state.global_step
    sent = []
    if "wandb" in report_to:
        import wandb

        if wandb.run is not None:
            wandb.log({"completions": wandb.Table(columns=columns, data=data)})
            sent.append("wandb")
    if "trackio" in report_to:
        import trackio

        trackio.log({"completions": trackio.Table(columns=columns, data=data)}, step=step)
        sent.append("trackio")
    if "tensorboard" in report_to:
        from transformers.integrations import TensorBoardCallback

        writer = next((cb.tb_writer for cb in trainer.callback_handler.callbacks
                       if isinstance(cb, TensorBoardCallback) and cb.tb_writer is not None), None)
        if writer is not None:
            def text(value):
                return str(value).replace("|", "\\|").replace("\n", " ")

            lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            lines += ["| " + " | ".join(text(v) for v in row) + " |" for row in data]
            writer.add_text("completions", "\n".join(lines), step)
            writer.flush()
            sent.append("tensorboard")
    return sent
