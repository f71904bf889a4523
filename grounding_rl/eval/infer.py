"""``grounding-rl infer``: ask when something happens in a video.

    grounding-rl infer --model DIR --video FILE --query TEXT [--query TEXT ...] [--gt S E ...] [--plot OUT.png] [--json]
                       [--print-prompt]

For each query it prints the start and end in seconds (clamped to the video), the answer text and the reasoning. With
``--json`` stdout is exactly one JSON list with an object per query, ``{"query", "start", "end", "answer",
"reasoning"}`` (start/end null when the answer cannot be parsed); everything else goes to stderr. ``--plot`` writes a
timeline picture (frames with timestamps, predicted intervals, and the ground truth given by one ``--gt S E`` per
query, in order). ``--print-prompt`` first prints, per query, the exact prompt the model is given (special tokens
and Qwen3-VL's textual timestamps shown, video tokens collapsed to a count; on stderr with ``--json``). A missing or
unreadable video is a one-line error and exit code 2.

Preprocessing and prompt are the checkpoint's (``grounding_config.json``), overridable, as in ``grounding-rl eval``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from grounding_rl.data.video import SampledVideo, VideoLoadError, sample_frames
from grounding_rl.errors import UserError, check_number
from grounding_rl.eval.settings import (add_preprocessing_overrides, check_generation_length, check_video_flags,
                                        describe_config, resolve_config, video_overrides)
from grounding_rl.family import DEFAULT_VIDEO_LAYOUT
from grounding_rl.models.loading import load_for_inference
from grounding_rl.prompts.preprocessing import build_inputs, prompt_text
from grounding_rl.reward.iou import clamp_interval
from grounding_rl.reward.parsing import extract_think, parse_answer
from grounding_rl.rollout.generation import SamplingParams, generate_answers

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
    parser = argparse.ArgumentParser(prog="grounding-rl infer", description="Ask when something happens in a video.")
    parser.add_argument("--model", required=True, help="checkpoint folder")
    parser.add_argument("--video", required=True, help="video file")
    parser.add_argument("--query", action="append", required=True, help="event to find (repeat for several)")
    parser.add_argument("--gt", nargs=2, type=float, action="append", metavar=("S", "E"), default=None,
                        help="ground truth in seconds for the plot, one per --query in order")
    parser.add_argument("--plot", default=None, help="write a timeline PNG here")
    parser.add_argument("--json", action="store_true", help="print one JSON list on stdout, nothing else")
    parser.add_argument("--print-prompt", action="store_true",
                        help="print the exact prompt of each query (video tokens collapsed to a count, timestamps "
                             "shown)")
    parser.add_argument("--batch-size", type=int, default=4, help="queries per generate call")
    add_preprocessing_overrides(parser)
    parser.add_argument("--max-new-tokens", type=int, default=256, help="generation budget")
    parser.add_argument("--device", default=None, help="cuda, cuda:1 or cpu (default: cuda when available)")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU), bfloat16, float32")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                        help="hf: transformers generate (default); vllm: vLLM with the same frames, clip metadata and "
                             "prompt ids (needs vllm)")
    return parser


def answer_result(query: str, answer: str, duration: float) -> dict:
    """The output object for one query: ``{"query", "start", "end", "answer", "reasoning"}``.

    ``start``/``end`` are the parsed answer clamped to [0, duration] seconds (order kept), None when unparseable;
    ``reasoning`` is the ``<think>`` text or None.
    """
    parsed = parse_answer(answer)
    start, end = clamp_interval(parsed, duration) if parsed is not None else (None, None)
    return {"query": query, "start": start, "end": end, "answer": answer, "reasoning": extract_think(answer)}


def infer(model, processor, video: SampledVideo, queries: list[str], template: str, max_new_tokens: int,
          batch_size: int = 4, engine=None, video_layout: str = DEFAULT_VIDEO_LAYOUT) -> list[dict]:
    """Answer every query on one sampled clip (greedy, batched). The clip was decoded once and is encoded once per
    batch of queries (the rows share its vision features). ``engine``: another rollout engine (``--engine vllm``;
    ``model`` unused); ``video_layout``: see :data:`grounding_rl.family.VIDEO_LAYOUTS`. Returns one
    :func:`answer_result` per query, with the rate and size the clip was sampled at (``sampling``:
    :meth:`grounding_rl.data.video.SampledVideo.sampling`)."""
    results = []
    step = max(1, batch_size)
    for i in range(0, len(queries), step):
        chunk = queries[i:i + step]
        answers = generate_answers(model, processor, chunk, [video] * len(chunk), template,
                                   SamplingParams.greedy(max_new_tokens), **({"engine": engine} if engine else {}),
                                   video_layout=video_layout)
        results += [{**answer_result(q, a, video.duration), "sampling": video.sampling()}
                    for q, a in zip(chunk, answers)]
    return results


def format_prompt(processor, video: SampledVideo, query: str, template: str,
                  video_layout: str = DEFAULT_VIDEO_LAYOUT) -> str:
    """The exact prompt the model is given for one query on a clip
    (:func:`grounding_rl.prompts.preprocessing.prompt_text` of the :func:`build_inputs` row)."""
    features = build_inputs(processor, [query], [video], template, video_layout=video_layout)
    return prompt_text(processor, features["input_ids"][0], features["attention_mask"][0])


def format_text(results: list[dict], video: SampledVideo) -> str:
    """Human-readable output: per query its interval, answer text and reasoning."""
    lines = [f"{video.path}  ({video.duration:.2f} s; {video.num_frames} frames of {video.frames.shape[1]}x"
             f"{video.frames.shape[2]} at {video.sampled_fps:.4g} fps)"]
    for i, r in enumerate(results, 1):
        lines.append(f"[{i}] {r['query']}")
        if r["start"] is None:
            lines.append("    interval: (no parseable answer)")
        else:
            lines.append(f"    interval: {r['start']:.2f} s to {r['end']:.2f} s")
        lines.append(f"    answer: {r['answer'].strip()!r}")
        lines.append(f"    reasoning: {r['reasoning'] if r['reasoning'] is not None else '(none)'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point. Exit codes: 0 ok (a plot that cannot be written is a one-line warning after the answer), 2
    missing/unreadable video or bad arguments: an empty ``--query`` (``prepare`` drops such lines), ``--batch-size``
    or ``--max-new-tokens`` below 1, ``--max-new-tokens`` above the model's context, a frame-sampling override ≤ 0
    (a :class:`grounding_rl.errors.UserError`, one line, before the model loads)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.gt is not None and len(args.gt) != len(args.query):
        parser.error(f"--gt was given {len(args.gt)} time(s) for {len(args.query)} --query; give one per query")
    for number, query in enumerate(args.query, 1):
        if not query.strip():
            raise UserError(f"--query {number} of {len(args.query)} is {'empty' if not query else 'only whitespace'}"
                            "; give the event to find (prepare drops such queries too)")
    check_number("--batch-size", args.batch_size, minimum=1)
    check_number("--max-new-tokens", args.max_new_tokens, minimum=1)
    check_video_flags(args)
    log = sys.stderr if args.json else sys.stdout

    try:
        config, source = resolve_config(args.model, prompt_template=args.prompt_template,
                                        video_layout=args.video_layout, **video_overrides(args))
    except ValueError as err:
        print(f"grounding-rl infer: error: {err}", file=sys.stderr)
        return EXIT_VIDEO
    check_generation_length("--max-new-tokens", args.max_new_tokens, args.model)
    if not Path(args.video).is_file():
        print(f"grounding-rl infer: error: video not found: {args.video}", file=sys.stderr)
        return EXIT_VIDEO
    try:
        with _quiet_native_stderr():
            video = sample_frames(args.video, config.video)
    except VideoLoadError as err:
        print(f"grounding-rl infer: error: {str(err).splitlines()[0]}", file=sys.stderr)
        return EXIT_VIDEO
    print(f"infer: settings from {source}", file=log)
    print(f"infer: {describe_config(config)}", file=log)

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    engine = None
    if args.engine == "vllm":
        from grounding_rl.models.loading import check_weight_files, load_processor
        from grounding_rl.rollout.vllm import engine_for_inference

        check_weight_files(args.model)
        model, processor = None, load_processor(args.model)
        engine = engine_for_inference(args.model, processor, args.dtype)
    else:
        model, processor = load_for_inference(args.model, device, args.dtype)
    if args.print_prompt:
        for query in args.query:
            prompt = format_prompt(processor, video, query, config.prompt_template, config.video_layout)
            print(f"infer: prompt for {query!r}:\n{prompt}", file=log)
    results = infer(model, processor, video, args.query, config.prompt_template, args.max_new_tokens,
                    args.batch_size, engine=engine, video_layout=config.video_layout)
    if args.json:  # the answer first; optional files after it
        sys.stdout.write(json.dumps(results, ensure_ascii=False) + "\n")
    else:
        print(format_text(results, video))
    sys.stdout.flush()
    if args.plot:
        from grounding_rl.eval.report import plot_timeline

        try:
            path = plot_timeline(video, results, args.plot, gts=args.gt)
            print(f"infer: wrote {path}", file=log)
        except OSError as err:
            print(f"infer: warning: no plot written: {args.plot}: {err.strerror or err}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
