"""Training curves: one picture of a run's logged metrics against the optimizer step, from Trainer's
``log_history`` (``trainer_state.json``). Every ``train``, ``sft`` and ``distill`` run writes it as
``output_dir/training_curves.png`` at each save and at the end (:func:`curves_callback`); ``grounding-rl plot RUN
[RUN …]`` overlays several runs (:func:`read_log_history`, :func:`draw_curves`).

Panels (a panel whose metrics a stage never logs is left out, e.g. the rewards of ``sft``): the total reward and each
function's (``reward``, ``rewards/NAME/mean``) with its within-group spread (± ``reward_std``,
``rewards/NAME/std``), IoU (the ``iou``-type rewards' means, validation's mIoU), KL (``kl``), the loss, completion
length (``completions/mean_length``), learning rate, and the phase timings (``timing/*``, seconds per step) stacked
(``timing/dynamic_sampling`` is left out: its seconds are inside generate and reward already).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from grounding_rl.errors import UserError

FILENAME = "training_curves.png"
REWARD = re.compile(r"^rewards/(.+)/mean$")


def _series(history: list[dict], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of the entries of ``history`` that logged ``key`` as a finite number."""
    steps, values = [], []
    for entry in history:
        value = entry.get(key)
        if isinstance(value, (int, float)) and value == value and "step" in entry:
            steps.append(int(entry["step"]))
            values.append(float(value))
    return steps, values


def _keys(history: list[dict]) -> list[str]:
    """Every key logged in ``history``, in first-seen order."""
    return list(dict.fromkeys(key for entry in history for key in entry))


def _panels(keys: list[str]) -> list[tuple[str, str, list[str]]]:
    """``(title, kind, keys)`` of the panels the logged ``keys`` fill: kind ``band`` (a key with its ``std``),
    ``line`` or ``stack``."""
    rewards = ["reward"] * ("reward" in keys) + [k for k in keys if REWARD.match(k)]
    iou = [k for k in keys if (REWARD.match(k) and "iou" in k.lower()) or re.match(r"^eval_.*m?iou", k, re.I)]
    timing = [k for k in keys if k.startswith("timing/") and k != "timing/dynamic_sampling"]
    panels = [("reward (± within-group std)", "band", rewards), ("IoU", "line", iou),
              ("KL", "line", [k for k in ("kl",) if k in keys]), ("loss", "line", [k for k in ("loss",) if k in keys]),
              ("completion length (tokens)", "line", [k for k in ("completions/mean_length",) if k in keys]),
              ("learning rate", "line", [k for k in ("learning_rate",) if k in keys]),
              ("phase timings (s per step, stacked)", "stack", timing)]
    return [panel for panel in panels if panel[2]]


def _label(key: str) -> str:
    """A legend's name for a key: ``total`` for ``reward``, the function for ``rewards/NAME/mean``, the phase for
    ``timing/PHASE``, else the key."""
    match = REWARD.match(key)
    return "total" if key == "reward" else match.group(1) if match else key.split("/", 1)[1] if key.startswith(
        "timing/") else key


def _std_key(key: str) -> str:
    return "reward_std" if key == "reward" else key[: -len("/mean")] + "/std"


def draw_curves(runs: dict[str, list[dict]], out: str | os.PathLike) -> Path:
    """Draw the panels of one or several runs' ``log_history`` into ``out`` (PNG, or any format matplotlib writes).

    Args:
        runs: ``{label: log_history}``; one colour per run when several (their timings drawn as lines, not stacked).
        out: the picture's path; its folder must exist.
    Returns:
        ``out`` as a Path.
    Raises:
        ValueError: no run logged any metric the panels draw.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keys = list(dict.fromkeys(k for history in runs.values() for k in _keys(history)))
    panels = _panels(keys)
    if not panels:
        raise ValueError("no metric to draw (reward, IoU, KL, loss, length, learning rate or timings)")
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure = Figure(figsize=(5.2 * columns, 3.4 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    colours = [f"C{i}" for i in range(10)]
    several = len(runs) > 1
    for index, (title, kind, panel_keys) in enumerate(panels):
        axis = figure.add_subplot(rows, columns, index + 1)
        for number, (label, history) in enumerate(runs.items()):
            prefix = f"{label}: " if several else ""
            if kind == "stack" and not several:
                series = [_series(history, k) for k in panel_keys]
                steps = sorted(set().union(*(set(s) for s, _ in series)))
                if steps:
                    stacked = [[dict(zip(s, v)).get(step, 0.0) for step in steps] for s, v in series]
                    axis.stackplot(steps, stacked, labels=[_label(k) for k in panel_keys], alpha=0.8)
                continue
            for line, key in enumerate(panel_keys):
                steps, values = _series(history, key)
                if not steps:
                    continue
                colour = colours[number % 10] if several else colours[line % 10]
                style = ["-", "--", ":", "-."][line % 4] if several else "-"
                axis.plot(steps, values, style, color=colour, marker="." if len(steps) < 30 else None,
                          label=prefix + _label(key))
                if kind == "band":
                    std = dict(zip(*_series(history, _std_key(key))))
                    if std:
                        low = [v - std.get(s, 0.0) for s, v in zip(steps, values)]
                        high = [v + std.get(s, 0.0) for s, v in zip(steps, values)]
                        axis.fill_between(steps, low, high, color=colour, alpha=0.15, linewidth=0)
        axis.set_title(title.replace(", stacked", "") if several else title, fontsize=10)
        axis.set_xlabel("step", fontsize=8)
        axis.tick_params(labelsize=8)
        axis.grid(alpha=0.3)
        if len(axis.get_legend_handles_labels()[0]) > 1:
            axis.legend(fontsize=7, loc="best")
    figure.suptitle(" vs ".join(runs) if several else next(iter(runs)), fontsize=10)
    figure.savefig(out, dpi=80)
    return Path(out)


def _global_step(path: Path) -> int:
    """``global_step`` of a ``trainer_state.json`` (-1 when unreadable: :func:`read_log_history` then names why)."""
    try:
        step = json.loads(path.read_text(encoding="utf-8")).get("global_step")
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        return -1
    return step if isinstance(step, int) else -1


def read_log_history(folder: str | os.PathLike) -> list[dict]:
    """The ``log_history`` of a run folder: its ``trainer_state.json`` (written at the end of a run), or the newest
    checkpoint's where that one is missing (a run still going or stopped) or behind it (a finished run continued with
    ``--resume_from_checkpoint`` and a larger ``max_steps``, still going or stopped: the top file is the first end's).

    Raises:
        UserError: ``folder`` holds no ``trainer_state.json`` (nor a checkpoint with one), the file is not
            Trainer's JSON, or its ``log_history`` holds no logged step (names the folder or file).
    """
    folder = Path(folder)
    path = folder / "trainer_state.json"
    checkpoints = sorted((p for p in folder.glob("checkpoint-*") if (p / "trainer_state.json").is_file()),
                         key=lambda p: int(p.name.rsplit("-", 1)[1]) if p.name.rsplit("-", 1)[1].isdigit() else -1)
    if not path.is_file() and not checkpoints:
        raise UserError(f"{folder}: no trainer_state.json (nor a checkpoint-* holding one): not a training run's "
                        "folder, or it has not saved yet")
    newest = checkpoints[-1] / "trainer_state.json" if checkpoints else None
    if newest is not None and (not path.is_file() or _global_step(newest) > _global_step(path)):
        path = newest
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        history = state["log_history"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise UserError(f"{path}: not a trainer_state.json with a log_history ({err})") from None
    if not isinstance(history, list) or not any(isinstance(e, dict) and "step" in e and len(e) > 2 for e in history):
        raise UserError(f"{path}: log_history is empty (the run logged no step yet; logging_steps decides when)")
    return [e for e in history if isinstance(e, dict)]


def curves_callback():
    """A new ``TrainerCallback`` that redraws ``output_dir/training_curves.png`` from the state's ``log_history`` at
    each save and at the end of training (world process zero; a run that logged nothing yet draws nothing)."""
    from transformers import TrainerCallback

    class CurvesCallback(TrainerCallback):
        def _draw(self, args, state):
            if not state.is_world_process_zero or not _panels(_keys(state.log_history)):
                return
            Path(args.output_dir).mkdir(parents=True, exist_ok=True)
            draw_curves({Path(args.output_dir).name: state.log_history}, Path(args.output_dir) / FILENAME)

        def on_save(self, args, state, control, **kwargs):
            self._draw(args, state)

        def on_train_end(self, args, state, control, **kwargs):
            self._draw(args, state)

    return CurvesCallback()
