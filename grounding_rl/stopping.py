"""Stopping on a signal without losing work: SIGTERM and SIGUSR1 (what SLURM and Kubernetes send before they kill a
job; ``sbatch --signal=USR1@T``) and SIGINT (Ctrl-C).

Two ways, chosen by the command:

* **graceful** (``train``, ``sft``, ``distill``): the first signal only records itself (:class:`StopRequest`); the
  trainer stops at the next point where it can resume exactly, saves a checkpoint there and the command exits with
  ``128 + signal number`` after one line saying what was kept (:mod:`grounding_rl.update.preemption`);
* **at once** (``eval``, ``difficulty``, ``infer``): the first signal raises :class:`Interrupted` in the main thread;
  what was written line by line (``predictions.jsonl``) stays, and the rerun resumes.

A second signal while a graceful stop is pending exits at once: one line, ``os._exit(128 + signal number)`` (130 for
Ctrl-C twice), no traceback and no clean-up that could hang on a dead peer. Exit codes follow the shell's convention
(``128 + N``: SIGINT 130, SIGUSR1 138, SIGTERM 143).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


def exit_code(signum: int) -> int:
    """The exit status of a command stopped by ``signum``: ``128 + signum`` (SIGINT 130, SIGUSR1 138, SIGTERM 143)."""
    return 128 + int(signum)


class Interrupted(BaseException):
    """A stop signal arrived in a command that stops at once (a ``BaseException``, as ``KeyboardInterrupt``, so that
    no ``except Exception`` swallows it); the ``grounding-rl`` command prints one line and exits with
    :func:`exit_code`."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


class StopRequest:
    """The first stop signal of a graceful command: ``signum`` is None until one arrives."""

    def __init__(self, prog: str):
        self.prog = prog
        self.signum: int | None = None

    @property
    def name(self) -> str:
        """``"SIGTERM"``, ``"SIGINT"``, … of the signal received (empty before one)."""
        return signal.Signals(self.signum).name if self.signum is not None else ""


@contextlib.contextmanager
def stop_signals(prog: str, graceful: bool) -> Iterator[StopRequest]:
    """Handle SIGTERM, SIGUSR1 and SIGINT while the block runs (main thread only; elsewhere nothing changes), then
    restore the previous handlers.

    Args:
        prog: the command, e.g. ``"grounding-rl train"``, for the line a second signal prints.
        graceful: record the first signal in the yielded :class:`StopRequest` (the caller stops at a safe point);
            False: raise :class:`Interrupted` at once.
    Yields:
        the :class:`StopRequest`.
    """
    request = StopRequest(prog)
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handle(signum, frame):
        if not graceful:
            raise Interrupted(signum)
        if request.signum is None:
            request.signum = signum
            return
        print(f"{prog}: {signal.Signals(signum).name} again: exiting at once; the last complete checkpoint is kept "
              "(run the same command with --resume_from_checkpoint auto to continue)", file=sys.stderr, flush=True)
        os._exit(exit_code(signum))

    previous = {signum: signal.signal(signum, handle) for signum in STOP_SIGNALS}
    try:
        yield request
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
