"""Preemption: after a stop signal (:mod:`grounding_rl.stopping`), training stops at the next point where it can resume
exactly — the end of an optimizer step that closes a generation window (GRPO: ``steps_per_generation ×
num_iterations / gradient_accumulation_steps`` steps; SFT: every step) — and saves a checkpoint there.

Every rank stops at the same step: the stop request is reduced across ranks (max) at each step's end, so a signal
that reached one process stops them all. The time from the signal to the exit is at most the rest of one generation
window plus one save.
"""
from __future__ import annotations

from collections.abc import Callable

from transformers import TrainerCallback

from grounding_rl.stopping import StopRequest


class PreemptionCallback(TrainerCallback):
    """Stops the run and saves at the first generation-window boundary after a stop signal.

    Args:
        request: the command's :class:`grounding_rl.stopping.StopRequest`.
        window: optimizer steps per generation window (1 for SFT).
        any_rank: ``flag -> bool``, True when ``flag`` is True on any rank (identity in one process).

    Attributes:
        stopped_at: the global step the run stopped and saved at, or None.
    """

    def __init__(self, request: StopRequest, window: int, any_rank: Callable[[bool], bool]):
        self.request, self.window, self.any_rank = request, max(1, int(window)), any_rank
        self.stopped_at: int | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if self.any_rank(self.request.signum is not None) and state.global_step % self.window == 0:
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
        return control


def any_rank(accelerator) -> Callable[[bool], bool]:
    """``flag -> bool``: True when the flag is True on any process of ``accelerator`` (a max all-reduce of one
    number per step; no communication in one process)."""
    if accelerator.num_processes == 1:
        return bool
    import torch

    def reduce(flag: bool) -> bool:
        value = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
        return bool(accelerator.reduce(value, reduction="sum").item() > 0)

    return reduce
