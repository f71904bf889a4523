"""Decoding workers that end with their parent: a DataLoader worker process whose parent is killed (``kill -9``, the
out-of-memory killer) would otherwise live on holding its decoded clips."""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int, worker_id: int | None = None) -> None:
    """In a DataLoader worker (``torch.utils.data.get_worker_info()`` set): ask Linux to SIGKILL this process when its
    parent dies, however it dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)`` through libc), then SIGKILL it at once if the
    parent ``parent_pid`` is already gone (``os.getppid()`` differs: it died before the ``prctl``). A no-op outside a
    worker (the main process keeps its own fate) and off Linux.

    Use as ``worker_init_fn=functools.partial(die_with_parent, os.getpid())`` where the loader is made
    (:func:`grounding_rl.rollout.greedy.clip_batches`), or call it from code that runs in the workers when the
    loader is someone else's (:class:`grounding_rl.data.dataset.VideoCollator`, for the trainers' loaders); calling
    it again is harmless. The signal fires when the parent *thread* that started the worker exits: DataLoader workers
    are started by the thread that iterates the loader, the main thread here, so it fires when the process dies.
    ``worker_id`` is the argument a ``worker_init_fn`` receives, unused.
    """
    import torch.utils.data

    if not sys.platform.startswith("linux") or torch.utils.data.get_worker_info() is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)
