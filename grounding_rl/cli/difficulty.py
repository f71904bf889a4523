"""``grounding-rl difficulty``: score every sample of a training file with a model, for difficulty-aware GRPO
(:func:`grounding_rl.eval.difficulty_scores.score_difficulty`).

    grounding-rl difficulty --model M --data D.jsonl --out D_scored.jsonl [--work-dir DIR] [--reward-funcs ...]
                            [--reward-weights ...] [--num-rollouts K [--temperature T]]
                            [every option of grounding-rl eval]

Writes ``D_scored.jsonl`` (each line as it was, plus ``"difficulty": {"iou", "reward", "pred"}``) and ``D_scored.json``
(model, settings, counts); the greedy evaluation behind it (resumable, multi-process) is in ``--work-dir``.
"""
from __future__ import annotations

import sys
from pathlib import Path

from grounding_rl.errors import UserError

DESCRIPTION = "Score every sample of a training file with a model, for difficulty-aware GRPO."  # --help's (plain)


def build_parser():
    from grounding_rl.cli.eval import build_parser as eval_parser

    parser = eval_parser(prog="grounding-rl difficulty", description=DESCRIPTION,
                         out_help="the scored JSONL to write (D_scored.jsonl); its sidecar D_scored.json records the "
                                  "model and settings", zoom=False)
    parser.add_argument("--work-dir", default=None,
                        help="folder of the evaluation run (predictions, metrics; resumable); default OUT.eval/")
    parser.add_argument("--reward-funcs", nargs="+", default=None,
                        help="rewards for the 'reward' score (registry names, module:function, file.py:function); "
                             "default: the checkpoint's grounding_config.json, else iou format")
    parser.add_argument("--reward-weights", nargs="+", type=float, default=None,
                        help="their weights (default: the checkpoint's, else 1.0 each)")
    parser.add_argument("--num-rollouts", type=int, default=0,
                        help="K > 0: K sampled answers per sample instead of one greedy answer, recorded as "
                             "difficulty.rollout_intervals / rollout_rewards for difficulty_sampling dispersion "
                             "(TimeLens2: 8); each pass resumable in WORK_DIR/rollout_k, seed --seed + k, each query "
                             "sampled alone from a seed of (that seed, its qid): a resumed or multi-process pass "
                             "writes the bytes of an uninterrupted one")
    parser.add_argument("--temperature", type=float, default=None,
                        help="sampling temperature of the rollouts (needs --num-rollouts; default: 1.0, TimeLens2's "
                             "rollout.py)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Returns 0; a user's mistake raises :class:`grounding_rl.errors.UserError`."""
    from grounding_rl.cli.eval import request_from_args
    from grounding_rl.data.samples import VideoProbeError
    from grounding_rl.eval.difficulty_scores import score_difficulty, sidecar_of

    args = build_parser().parse_args(argv)
    if args.temperature is not None and not args.num_rollouts:
        raise UserError(f"--temperature {args.temperature:g} samples the --num-rollouts rollouts; the greedy pass "
                        "ignores it: give --num-rollouts K too, or drop --temperature")
    try:
        sidecar = score_difficulty(request_from_args(args), args.out, args.reward_funcs, args.reward_weights,
                                   args.work_dir, args.num_rollouts,
                                   1.0 if args.temperature is None else args.temperature)
    except VideoProbeError as err:
        raise UserError(str(err)) from None
    if sidecar is None:  # another rank
        return 0
    counts = sidecar["counts"]
    print(f"difficulty: scored {counts['scored']} of {counts['lines']} lines ({counts['unscored']} unscored: dropped "
          f"by the validation policy or past --limit); mean IoU {sidecar['mean_iou']:.4f}"
          if sidecar["mean_iou"] is not None else f"difficulty: no line scored of {counts['lines']}")
    print(f"difficulty: wrote {args.out} and {sidecar_of(Path(args.out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
