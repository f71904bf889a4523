"""``grounding-rl eval``: R1@{0.3,0.5,0.7} and mIoU of a checkpoint on a canonical JSONL.

    grounding-rl eval --model DIR --data TEST.jsonl --out OUTDIR [--batch-size B] [--limit N] [--video-root DIR]
                      [--benchmark evaluation/X.yaml] [--prompt-template NAME] [--fps F] [--max-pixels P]
                      [--total-pixels P] [--max-new-tokens N] [--seed S] [--engine hf|vllm] [--overwrite]
                      [--scoring NAME|all ...]
                      [--zoom [--zoom-margin M] [--zoom-spend fps|resolution] [--zoom-time video|window]]
                      [--max-tool-calling-iterations K] [--device cpu|cuda[:N]] [--print-prompt]

Over a finished OUTDIR the run only scores: every query is already in ``predictions.jsonl`` (nothing pending, no model
loads), so ``--scoring all`` rescores existing predictions under every published evaluator's rule.

The flags become an :class:`grounding_rl.eval.evaluate.EvalRequest`; :func:`grounding_rl.eval.evaluate.evaluate` plans,
runs and reports (its module docstring lists the files written: ``predictions.jsonl``, ``eval_config.json``,
``metrics.json``, ``report.md``, ``iou_hist.png``). Under ``accelerate launch`` / ``torchrun`` the queries are sharded
by video over the processes.
"""
from __future__ import annotations

import argparse
import logging
import sys

from grounding_rl.errors import UserError

DESCRIPTION = "R1@{0.3,0.5,0.7} and mIoU of a checkpoint on a canonical JSONL."  # --help's (plain text)


SHORT_FORMS = ("fps", "min_pixels", "max_pixels", "total_pixels", "max_frames")  # older spellings, kept as aliases
ALIASES = {**{"video_" + name: "--" + name.replace("_", "-") for name in SHORT_FORMS},
           "max_tool_calling_iterations": "--max-turns"}


def add_setting_flags(parser, settings, keep: bool = False) -> None:
    """A flag ``--<key>`` per declared setting (:class:`grounding_rl.prompts.preprocessing.Setting`) with its help and
    choices (a boolean one with its ``--no-`` form; :data:`ALIASES`' older spelling too): dest ``name``, default None
    (keep the checkpoint's) with ``keep``, else dest ``key`` with the declared default."""
    for setting in settings:
        kind = {"action": argparse.BooleanOptionalAction} if setting.type is bool else \
            {"type": setting.type, "choices": setting.field.metadata.get("choices"),
             "metavar": setting.field.metadata.get("metavar")}
        parser.add_argument("--" + setting.key.replace("_", "-"), *filter(None, [ALIASES.get(setting.key)]),
                            dest=setting.name if keep else setting.key, default=None if keep else setting.field.default,
                            help=setting.field.metadata["help"], **kind)


def add_preprocessing_overrides(parser: argparse.ArgumentParser) -> None:
    """The flags of :class:`grounding_rl.eval.settings.PreprocessingOverrides` (None = keep the checkpoint's), shared
    by ``eval``, ``difficulty`` and ``infer``, made from the settings ``grounding_config.json`` records
    (:func:`grounding_rl.prompts.preprocessing.saved_settings`; :func:`add_setting_flags`). One name per setting: the
    flag ``--video-fps`` is the YAML key ``video_fps`` and ``video.fps`` in ``grounding_config.json`` (likewise every
    video setting, and ``--prompt-template``, ``--video-layout``); the short forms :data:`SHORT_FORMS` are aliases."""
    from grounding_rl.prompts.preprocessing import saved_settings

    group = parser.add_argument_group("preprocessing overrides", "Each replaces the checkpoint's value (its "
                                      "grounding_config.json; the YAML key video_fps is --video-fps here); a budget "
                                      "or floor in tokens replaces a saved one in pixels, and the other way round.")
    add_setting_flags(group, saved_settings(), keep=True)


def add_scoring_flag(parser: argparse.ArgumentParser) -> None:
    """``--scoring NAME|all`` (repeatable), shared by ``eval``, ``score`` and ``compare``: the published evaluators'
    scorings to show beside ``standard`` (the headline) and ``clamped`` (:mod:`grounding_rl.reward.scorings`)."""
    parser.add_argument("--scoring", action="append", default=[], metavar="NAME|all",
                        help="also score under this published evaluator's rule (timelens, lmms_timelens, "
                        "lmms_charades_sta, lmms_extremewhenbench, timelens2_vlmevalkit, timezero, time_r1; for "
                        "interval sets: set, against every span of TimeLens-Bench's spans_all, and qvhighlights, "
                        "moment_detr's R1 and mAP, added by itself on qvhighlights data), or 'all'; repeatable. "
                        "standard (the headline) and clamped are always computed")


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """``--device``, ``--dtype`` and ``--print-prompt``, shared by ``eval`` (and so ``difficulty``) and ``infer``."""
    from grounding_rl.eval.engines import DTYPES

    parser.add_argument("--device", default=None,
                        help="cuda, cuda:1 or cpu (default: cuda when available; not under accelerate launch, where "
                             "each process has its own)")
    parser.add_argument("--dtype", default="auto", choices=DTYPES,
                        help="auto (bf16 on GPU, fp32 on CPU), bfloat16, float16, float32")
    parser.add_argument("--print-prompt", action="store_true",
                        help="print the exact prompt (video tokens collapsed to a count, timestamps shown): of each "
                             "query for infer, of the first query to run for eval")


def add_zoom_flags(parser: argparse.ArgumentParser) -> None:
    """``--zoom``, its knobs (:class:`grounding_rl.rollout.zoom.ZoomSettings`' fields) and the crop tool's limit
    (:class:`grounding_rl.rollout.tools.ToolSettings`'), shared by ``eval`` and ``infer``."""
    from grounding_rl.prompts.preprocessing import settings_of
    from grounding_rl.rollout.tools import ToolSettings
    from grounding_rl.rollout.zoom import ZoomSettings

    parser.add_argument("--zoom", action="store_true",
                        help="answer twice: over the whole video, then on the window of the first answer widened by "
                             "--zoom-margin (the centre half when it does not parse), under the same budget")
    add_setting_flags(parser, settings_of(ZoomSettings, "zoom_") + settings_of(ToolSettings))


def zoom_from_args(args: argparse.Namespace):
    """:class:`grounding_rl.rollout.zoom.ZoomSettings` of parsed :func:`add_zoom_flags` arguments, None without
    ``--zoom``. Raises UserError for a knob given without ``--zoom`` (it would change nothing) or out of range."""
    from grounding_rl.prompts.preprocessing import settings_of
    from grounding_rl.rollout.zoom import ZoomSettings

    settings = settings_of(ZoomSettings, "zoom_")
    if not args.zoom:
        given = ["--" + s.key.replace("_", "-") for s in settings if getattr(args, s.key) != s.field.default]
        if given:
            raise UserError(f"{', '.join(given)} given without --zoom; add --zoom or drop them")
        return None
    return ZoomSettings(**{s.name: getattr(args, s.key) for s in settings})


def build_parser(prog: str = "grounding-rl eval", description: str | None = None,
                 out_help: str = "output folder (predictions, metrics, report)", zoom: bool = True
                 ) -> argparse.ArgumentParser:
    """The options of ``eval``; ``grounding-rl difficulty`` reuses them with its own name, description and
    ``--out``, without the zoom and crop tool flags (``zoom=False``)."""
    from grounding_rl.eval.settings import DEFAULT_MAX_NEW_TOKENS

    parser = argparse.ArgumentParser(prog=prog, description=description or DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint folder (or hub id already in the local cache)")
    parser.add_argument("--data", required=True, help="canonical JSONL (grounding-rl prepare)")
    parser.add_argument("--out", required=True, help=out_help)
    parser.add_argument("--batch-size", type=int, default=4, help="queries per generate call (per process)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N queries")
    parser.add_argument("--video-root", default=None, help="folder for relative video paths in --data")
    parser.add_argument("--benchmark", default=None,
                        help="benchmark YAML (evaluation/*.yaml): its paper protocol is used when the checkpoint has "
                             "no grounding_config.json, its expected query count is checked, its anchors are reported")
    add_preprocessing_overrides(parser)
    add_scoring_flag(parser)
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help=f"generation budget (default: the benchmark's, else {DEFAULT_MAX_NEW_TOKENS})")
    parser.add_argument("--seed", type=int, default=0, help="random seed (decoding is greedy; recorded)")
    add_run_flags(parser)
    parser.add_argument("--attn-implementation", default=None, help="e.g. sdpa, flash_attention_2")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                        help="hf: transformers generate (default); vllm: vLLM with the same frames, clip metadata and "
                             "prompt ids (needs vllm: pip install -e \".[vllm]\" on GPUs, .venv-vllm on CPUs)")
    parser.add_argument("--num-workers", type=int, default=2, help="DataLoader workers decoding clips per process")
    parser.add_argument("--frame-cache", default=None, help="folder of the on-disk frame cache (optional)")
    parser.add_argument("--frame-cache-gb", type=float, default=20.0, help="frame cache size limit in GB")
    parser.add_argument("--overwrite", action="store_true", help="discard earlier predictions in --out")
    parser.add_argument("--data-root", default=None,
                        help="folder of the --benchmark's annotation files (default: $GROUNDING_RL_DATA, else the "
                             "test data)")
    parser.add_argument("--max-missing-fraction", type=float, default=0.05,
                        help="fail (exit 2) when more than this share of the videos is missing (checked before the "
                             "model loads) or unreadable (after the run; metrics are written); 1.0 = never")
    if zoom:
        add_zoom_flags(parser)
    return parser


def request_from_args(args: argparse.Namespace, out: str | None = None):
    """The :class:`grounding_rl.eval.evaluate.EvalRequest` of parsed :func:`build_parser` arguments (``out``
    replaces ``--out``: ``difficulty`` evaluates into its work folder)."""
    from grounding_rl.eval.evaluate import EvalRequest
    from grounding_rl.eval.settings import PreprocessingOverrides

    return EvalRequest(model=args.model, data=args.data, out=out or args.out, batch_size=args.batch_size,
                       limit=args.limit, video_root=args.video_root, benchmark=args.benchmark,
                       data_root=args.data_root, overrides=PreprocessingOverrides.from_args(args),
                       max_new_tokens=args.max_new_tokens, seed=args.seed, dtype=args.dtype,
                       attn_implementation=args.attn_implementation, engine=args.engine,
                       num_workers=args.num_workers, frame_cache=args.frame_cache,
                       frame_cache_gb=args.frame_cache_gb, overwrite=args.overwrite,
                       max_missing_fraction=args.max_missing_fraction, scorings=tuple(args.scoring),
                       zoom=zoom_from_args(args) if hasattr(args, "zoom") else None,
                       max_turns=getattr(args, "max_tool_calling_iterations", 0) or 0, device=args.device,
                       print_prompt=args.print_prompt)


def main(argv: list[str] | None = None) -> int:
    """Returns 0 on success; a user's mistake raises :class:`grounding_rl.errors.UserError` (or an ``OSError`` naming
    the path), which the ``grounding-rl`` command prints as one line with exit status 2."""
    from grounding_rl.data.samples import VideoProbeError
    from grounding_rl.eval.evaluate import evaluate

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        payload = evaluate(request_from_args(args))
    except VideoProbeError as err:
        raise UserError(str(err)) from None
    if payload is not None:  # a training run's folder: its model card gets this evaluation (main process)
        from pathlib import Path

        from grounding_rl.eval.evaluate import REPORT
        from grounding_rl.update.saving import add_evaluation

        card = add_evaluation(args.model, payload, Path(args.out) / REPORT)
        if card is not None:
            print(f"eval: added the results to the model card {card}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
