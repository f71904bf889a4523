"""``grounding-rl plot RUN [RUN ...] [--out FILE]``: the training curves of one run, or several overlaid
(:mod:`grounding_rl.update.curves`: reward per function with its spread, IoU, KL, loss, length, learning rate, phase
timings), from each folder's ``trainer_state.json``, or its newest checkpoint's where that is missing or behind (a
run going on or stopped, also one continued with ``--resume_from_checkpoint`` past its first end)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grounding_rl.errors import UserError


def main(argv: list[str] | None = None) -> int:
    from grounding_rl.eval.report import plot_path
    from grounding_rl.update.curves import draw_curves, read_log_history

    parser = argparse.ArgumentParser(prog="grounding-rl plot", description="Training curves of one or more runs "
                                     "(each run's output_dir), overlaid.")
    parser.add_argument("runs", nargs="+", metavar="RUN", help="a training run's folder (output_dir)")
    parser.add_argument("--out", default="training_curves.png",
                        help="the picture to write (PNG, or any extension matplotlib writes: .svg, .pdf)")
    args = parser.parse_args(argv)
    out = Path(plot_path(args.out, "--out"))
    histories = {}
    resolved = [Path(run).resolve() for run in args.runs]
    twice = next((run for i, run in enumerate(args.runs) if resolved[i] in resolved[:i]), None)
    if twice is not None:  # it would be drawn twice, as two runs
        raise UserError(f"{twice} is given twice; name each run once")
    for run in args.runs:
        label = Path(run).resolve().name
        while label in histories:  # two runs of the same folder name: keep both
            label += "'"
        histories[label] = read_log_history(run)
    out.parent.mkdir(parents=True, exist_ok=True)
    print(draw_curves(histories, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
