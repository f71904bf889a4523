"""Keep third-party chatter off stdout, which carries only a command's own output (``fits --json`` and
``infer --json`` are read by programs), and drop the warnings a user can do nothing about.

* DeepSpeed's logger (``"DeepSpeed"``, created on its first import with a handler on ``sys.stdout``; it prints
  ``[WARNING] [real_accelerator.py:…] Setting accelerator to CPU`` in every command that loads the model stack)
  writes to stderr instead, whenever DeepSpeed is imported;
* transformers' ``FutureWarning: is_gradient_checkpointing is deprecated`` (raised by TRL 1.16's
  ``unwrap_model_for_generation`` at every GRPO step; its replacement, ``is_activation_checkpointing``, is the same
  property) is filtered.
"""
from __future__ import annotations

import logging
import sys
import warnings

DEEPSPEED_LOGGER = "DeepSpeed"  # deepspeed.utils.logging's logger name


class _CurrentStderr:
    """A stream that writes to whatever ``sys.stderr`` is at the time (pytest's capture, a redirection)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _to_stderr(handler: logging.Handler) -> None:
    """A plain stream handler (DeepSpeed's: on the ``sys.stdout`` of its import) now writes to stderr."""
    if type(handler) is logging.StreamHandler and not isinstance(handler.stream, _CurrentStderr):
        handler.setStream(_CurrentStderr())


class _StderrLogger(logging.Logger):
    """A logger whose plain stream handlers are moved to stderr as they are added."""

    def addHandler(self, handler: logging.Handler) -> None:  # noqa: N802 - logging's name
        _to_stderr(handler)
        super().addHandler(handler)


def quiet_third_party() -> None:
    """Move DeepSpeed's log lines to stderr (its logger created now if DeepSpeed is not imported yet, without
    importing it) and filter the per-step ``is_gradient_checkpointing`` deprecation; idempotent."""
    manager = logging.Logger.manager
    existing = manager.loggerDict.get(DEEPSPEED_LOGGER)
    if isinstance(existing, logging.Logger):
        for handler in existing.handlers:
            _to_stderr(handler)
    else:
        previous = logging.getLoggerClass()
        logging.setLoggerClass(_StderrLogger)
        try:
            logging.getLogger(DEEPSPEED_LOGGER)
        finally:
            logging.setLoggerClass(previous)
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
