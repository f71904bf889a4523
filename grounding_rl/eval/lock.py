"""One evaluation at a time in an output folder: an OS lock (``fcntl.flock``) on ``OUTDIR/.lock``, held for the whole
run by the main process.

The kernel releases the lock when its process ends, however it ends (``kill -9``, the out-of-memory killer), so a
killed run leaves nothing that blocks its resume; the file itself stays (deleting a locked file races with a second
process opening it) and holds the pid of its last holder, which the refusal names.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from grounding_rl.errors import UserError

LOCK_NAME = ".lock"


def lock_output_dir(outdir: str | os.PathLike, flag: str = "--out", holder: str = "eval") -> IO:
    """Create ``outdir`` if needed and take its lock without waiting (``LOCK_EX | LOCK_NB`` on ``outdir/.lock``, the
    first file written there), recording this process's pid in it.

    Returns:
        the open lock file: keep a reference for as long as the run writes to ``outdir``; closing it (or the process
        ending) releases the lock.

    Raises:
        UserError: another process holds the lock: one line, ``--out X is in use by another eval (pid N)``.
        OSError: ``outdir`` cannot be created (e.g. a file is in its path).
    """
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    handle = open(outdir / LOCK_NAME, "a+", encoding="utf-8")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        pid = handle.read().strip() or "unknown"
        handle.close()
        raise UserError(f"{flag} {outdir} is in use by another {holder} (pid {pid}); wait for it to end, or give "
                        f"another {flag}") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle
