"""``grounding-rl infer``: ask when something happens in a video (:mod:`grounding_rl.eval.infer`).

    grounding-rl infer --model DIR --video FILE --query TEXT [--query TEXT ...] [--gt S E ...] [--plot OUT.png] [--json]
                       [--print-prompt] [--zoom [--zoom-margin M] [--zoom-spend fps|resolution]
                       [--zoom-time video|window]] [--max-tool-calling-iterations K]

For each query it prints the start and end in seconds (clamped to the video), the answer text and the reasoning. With
``--json`` stdout is exactly one JSON list with an object per query, ``{"query", "start", "end", "answer",
"reasoning", "sampling"}`` (start/end null when the answer cannot be parsed; ``sampling``: the clip's ``fps``,
``frames``, ``height``, ``width``); everything else goes to stderr. ``--plot`` writes a
timeline picture (frames with timestamps, predicted intervals, and the ground truth given by one ``--gt S E`` per
query, in order). ``--print-prompt`` first prints, per query, the exact prompt the model is given (special tokens
and Qwen3-VL's textual timestamps shown, video tokens collapsed to a count; on stderr with ``--json``). A missing or
unreadable video is a one-line error and exit code 2.

``--zoom`` answers each query twice (:func:`grounding_rl.eval.infer.clip_answers`): over the whole video, then on
the window of the first answer; the result is the second answer in the video's seconds, with ``pass1``, ``zoom_window``
and ``zoom_fallback``. With ``--print-prompt`` each query's pass-1 prompt, a line ``--- pass 2 (zoom window S–E s)
---`` and its pass-2 prompt are printed once pass 1 has answered (the window is the model's: the model is loaded for
the prompt anyway).

``--max-tool-calling-iterations K`` (alias ``--max-turns``; training's ``max_tool_calling_iterations``) runs the
policy with the crop tool (:func:`grounding_rl.eval.infer.clip_answers`): the model may request ``crop(start, end)``
up to K times before it answers; each result keeps its ``conversation`` (turns, requested windows); with
``--print-prompt`` every turn of each conversation is printed. With ``--engine vllm`` each turn's prompt holds
every video so far (the clip, then each window). Not with ``--zoom``.

Preprocessing and prompt are the checkpoint's (``grounding_config.json``), overridable, as in ``grounding-rl eval``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from pathlib import Path

from grounding_rl.errors import UserError, check_number

EXIT_VIDEO = 2


@contextlib.contextmanager
def _quiet_native_stderr():
    """Silence file descriptor 2 for the block: decord and FFmpeg print their own error lines from C code when a file
    is unreadable, and the command promises a one-line error."""
    try:
        saved = os.dup(2)
    except OSError:  # no real stderr (e.g. captured by a test harness without a descriptor)
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def build_parser() -> argparse.ArgumentParser:
    from grounding_rl.cli.eval import add_preprocessing_overrides, add_run_flags, add_zoom_flags
    from grounding_rl.eval.settings import DEFAULT_MAX_NEW_TOKENS

    parser = argparse.ArgumentParser(prog="grounding-rl infer", description="Ask when something happens in a video.")
    parser.add_argument("--model", required=True, help="checkpoint folder")
    parser.add_argument("--video", required=True, help="video file")
    parser.add_argument("--query", action="append", required=True, help="event to find (repeat for several)")
    parser.add_argument("--gt", nargs=2, type=float, action="append", metavar=("S", "E"), default=None,
                        help="ground truth in seconds for the --plot picture (needs --plot), one per --query in order; "
                             "S before the clip's end (an E after it: drawn up to the end, with a warning)")
    parser.add_argument("--plot", default=None,
                        help="write a timeline picture here (its format from the extension: png, pdf, svg, …; none: "
                             "OUT.png)")
    parser.add_argument("--json", action="store_true", help="print one JSON list on stdout, nothing else")
    parser.add_argument("--batch-size", type=int, default=4, help="queries per generate call")
    add_preprocessing_overrides(parser)
    add_zoom_flags(parser)
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                        help="generation budget (of each model turn with --max-tool-calling-iterations)")
    add_run_flags(parser)
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                        help="hf: transformers generate (default); vllm: vLLM with the same frames, clip metadata and "
                             "prompt ids (needs vllm)")
    return parser


def _check_args(parser, args) -> None:
    """The command line's own mistakes (before any file is read): ``--gt`` count, range and ``--plot``, empty
    queries, ``--batch-size`` and ``--max-new-tokens`` below 1. Raises UserError (or exits 2 through ``parser``)."""
    if args.gt is not None and len(args.gt) != len(args.query):
        parser.error(f"--gt was given {len(args.gt)} time(s) for {len(args.query)} --query; give one per query")
    if args.gt is not None and args.plot is None:
        raise UserError("--gt is drawn on the --plot picture only; give --plot OUT.png too (or drop --gt)")
    for number, (gt_start, gt_end) in enumerate(args.gt or (), 1):
        if not (math.isfinite(gt_start) and math.isfinite(gt_end) and 0 <= gt_start <= gt_end):
            raise UserError(f"--gt {number} of {len(args.gt)} ({gt_start:g} {gt_end:g}) must be START END in seconds "
                            "with 0 ≤ START ≤ END")
    for number, query in enumerate(args.query, 1):
        if not query.strip():
            raise UserError(f"--query {number} of {len(args.query)} is {'empty' if not query else 'only whitespace'}"
                            "; give the event to find (prepare drops such queries too)")
    check_number("--batch-size", args.batch_size, minimum=1)
    check_number("--max-new-tokens", args.max_new_tokens, minimum=1)


def _check_gt(gts, video) -> None:
    """Each ``--gt`` against the decoded clip (``video.duration``, seconds): one starting at or after the clip's end
    would not be drawn at all, and is refused; one ending after it is drawn up to the end, with a one-line warning.

    Raises:
        UserError: names the ``--gt``, the video and its duration (before the model loads).
    """
    for number, (gt_start, gt_end) in enumerate(gts or (), 1):
        where = f"--gt {number} of {len(gts)} ({gt_start:g} {gt_end:g})"
        if gt_start >= video.duration:
            raise UserError(f"{where} starts at or after the end of {video.path} ({video.duration:.2f} s): nothing of "
                            "it would be drawn; give seconds within the clip")
        if gt_end > video.duration:
            print(f"infer: warning: {where} ends after {video.path} ({video.duration:.2f} s); drawn up to its end",
                  file=sys.stderr)


def _load_video(path: str, settings):
    """The clip at ``path`` sampled with ``settings``; None after one error line on stderr (missing, unreadable)."""
    from grounding_rl.data.video import VideoLoadError, sample_frames

    if not Path(path).is_file():
        print(f"grounding-rl infer: error: video not found: {path}", file=sys.stderr)
        return None
    try:
        with _quiet_native_stderr():
            return sample_frames(path, settings)
    except VideoLoadError as err:
        print(f"grounding-rl infer: error: {str(err).splitlines()[0]}", file=sys.stderr)
        return None


def _answer(args, config, video, zoom, log) -> list[dict]:
    """Load the model (or vLLM engine) and answer every ``--query`` on ``video`` in the mode the flags give, one
    call (:func:`grounding_rl.eval.infer.clip_answers`); ``--print-prompt`` prints to ``log``."""
    import torch

    from grounding_rl.eval.engines import load_inference_engine
    from grounding_rl.eval.infer import clip_answers
    from grounding_rl.rollout.answering import Mode

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model, processor, engine = load_inference_engine(args.model, device, args.dtype, engine=args.engine,
                                                     max_videos=(args.max_tool_calling_iterations or 0) + 1)
    printer = (lambda text: print(text, file=log)) if args.print_prompt else None
    return clip_answers(model, processor, video, args.query, config, args.max_new_tokens, args.batch_size,
                        Mode(zoom, args.max_tool_calling_iterations), engine, printer)


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 ok (a plot that cannot be written is a one-line warning after the answer), 2 missing/unreadable
    video or bad arguments: an empty ``--query`` (``prepare`` drops such lines), a ``--gt`` without ``--plot``,
    not ``0 ≤ S ≤ E`` or starting at or after the clip's end (one ending after it: a warning), a ``--plot``
    extension matplotlib cannot write, ``--device cuda`` without a GPU, ``--batch-size`` or
    ``--max-new-tokens`` below 1, ``--max-new-tokens`` above the model's context, a frame-sampling override ≤ 0 (a
    :class:`grounding_rl.errors.UserError`, one line, before the model loads)."""
    from grounding_rl.eval.infer import format_text
    from grounding_rl.eval.settings import (PreprocessingOverrides, check_generation_length, describe_config,
                                            resolve_config)

    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    from grounding_rl.eval.engines import check_device
    from grounding_rl.eval.report import plot_path

    check_device(args.device)
    plot = plot_path(args.plot) if args.plot else None
    overrides = PreprocessingOverrides.from_args(args)
    overrides.check()
    from grounding_rl.cli.eval import zoom_from_args

    zoom = zoom_from_args(args)
    log = sys.stderr if args.json else sys.stdout

    try:
        config, source = resolve_config(args.model, overrides)
    except ValueError as err:
        print(f"grounding-rl infer: error: {err}", file=sys.stderr)
        return EXIT_VIDEO
    check_generation_length("--max-new-tokens", args.max_new_tokens, args.model)
    from grounding_rl.eval.turns import check_turns_run
    from grounding_rl.eval.zoom import check_run

    if zoom is not None:
        check_run(zoom, args.model, args.engine, config.video.sampler, config.prompt_template)
    check_turns_run(args.max_tool_calling_iterations, zoom is not None, config.video.sampler, config.prompt_template)
    video = _load_video(args.video, config.video)
    if video is None:
        return EXIT_VIDEO
    _check_gt(args.gt, video)
    print(f"infer: settings from {source}", file=log)
    print(f"infer: {describe_config(config)}", file=log)
    results = _answer(args, config, video, zoom, log)
    if args.json:  # the answer first; optional files after it
        sys.stdout.write(json.dumps(results, ensure_ascii=False) + "\n")
    else:
        print(format_text(results, video))
    sys.stdout.flush()
    if args.plot:
        from grounding_rl.eval.gallery import plot_timeline

        try:
            path = plot_timeline(video, results, plot, gts=args.gt)
            print(f"infer: wrote {path}", file=log)
        except OSError as err:
            print(f"infer: warning: no plot written: {args.plot}: {err.strerror or err}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
