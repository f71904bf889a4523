"""Benchmark of ``eval`` at benchmark scale: queries grouped by video with background decoding, against the
per-query sequential path.

    python scripts/bench_eval.py [--threads 1] [--workers 2] [--model DIR]

Workload (Charades-like: several queries per video): the six clips of ``../shared/data/videos``, 3 queries each (18
queries, listed video by video as benchmark files are), TimeZero's video budget (fps 2, total_pixels 3584·28·28,
min_pixels 16·28·28), the 3B-proportioned tiny model of ``scripts/bench_step.py`` (random weights, real tokenizer),
greedy decoding of exactly 32 new tokens (``min_new_tokens`` 32), batches of 8 queries.

Arms, in one run, alternating:

- ``grouped`` — what ``grounding-rl eval`` does (:mod:`grounding_rl.rollout.greedy`): each video decoded once, in
  ``--workers`` background DataLoader workers while the current batch generates; the rows of a clip in a batch share
  one vision encoding;
- ``per_query`` — the sequential path: each query's clip decoded in the main process when its batch comes, every row
  encoded on its own.

For a text-first template (``default``: the query comes before the video, so prompts differ from the query on) and a
video-first one (``timelens``, where it exists). Prints a table and a last line of JSON:
``{"eval_time_ratio": grouped / per_query (text-first), "eval_time_ratio_video_first": … (null without a video-first
template), "vision_encodings_ratio": patch rows encoded grouped / per_query, "same_predictions": true}``. Targets on 2
cores: ``eval_time_ratio`` ≤ 0.7, ``eval_time_ratio_video_first`` ≤ 0.5. Record the results in docs/BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from bench_step import build_model  # noqa: E402  (scripts/ is on sys.path when run as a script)
from bench_video import cpu_model  # noqa: E402

QUERIES_PER_VIDEO = 3
BATCH = 8
NEW_TOKENS = 32


def workload(videos_dir: Path) -> list[tuple[str, str]]:
    """(video path, query) rows, video by video."""
    from grounding_rl.data.samples import VIDEO_EXTENSIONS

    clips = sorted(p for p in videos_dir.iterdir() if p.suffix.lower() in VIDEO_EXTENSIONS)
    phrases = ("a person starts the main action.", "the person stops and looks around.", "someone picks something up.")
    return [(str(clip), phrases[k]) for clip in clips for k in range(QUERIES_PER_VIDEO)]


def run_grouped(model, processor, rows, settings, template, workers) -> tuple[list[str], float]:
    from grounding_rl.rollout.greedy import clip_batches, group_by_video
    from grounding_rl.rollout.generation import SamplingParams, generate_answers

    start = time.perf_counter()
    answers = [None] * len(rows)
    for batch in clip_batches(group_by_video([v for v, _ in rows]), settings, BATCH, workers):
        out = generate_answers(model, processor, [rows[p][1] for p, _, _ in batch], [v for _, v, _ in batch],
                               template, SamplingParams.greedy(NEW_TOKENS))
        for (position, _, _), answer in zip(batch, out):
            answers[position] = answer
    return answers, time.perf_counter() - start


def run_per_query(model, processor, rows, settings, template) -> tuple[list[str], float]:
    from grounding_rl.data.video import sample_frames
    from grounding_rl.rollout.generation import SamplingParams, generate_answers

    start = time.perf_counter()
    answers = []
    for i in range(0, len(rows), BATCH):
        chunk = rows[i:i + BATCH]
        clips = [sample_frames(video, settings) for video, _ in chunk]  # one decode per query
        answers += generate_answers(model, processor, [q for _, q in chunk], clips, template,
                                    SamplingParams.greedy(NEW_TOKENS))
    return answers, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    from grounding_rl.data.video import VideoSettings
    from grounding_rl.models.loading import load_for_inference, vision_tower
    from grounding_rl.paths import shared_dir
    from grounding_rl.prompts.templates import TEMPLATES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the generating process")
    parser.add_argument("--workers", type=int, default=2, help="background decoding workers of the grouped arm")
    parser.add_argument("--model", type=Path, default=None, help="model folder (built there when missing)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    shared = shared_dir()
    if shared is None:
        parser.error("../shared is missing: set GROUNDING_RL_SHARED")
    model_dir = build_model(args.model or Path(tempfile.mkdtemp(prefix="bench_eval_")) / "model",
                            shared / "models" / "Qwen2.5-VL-7B-Instruct")
    model, processor = load_for_inference(model_dir)
    model.generation_config.min_new_tokens = NEW_TOKENS  # every row decodes exactly 32 tokens in both arms
    encoded = []
    vision_tower(model).register_forward_hook(lambda module, inputs, out: encoded.append(inputs[0].shape[0]))
    settings = VideoSettings(fps=2.0, min_pixels=16 * 28 * 28, total_pixels=3584 * 28 * 28)
    rows = workload(shared / "data" / "videos")
    templates = {"text_first": "default", "video_first": "timelens" if "timelens" in TEMPLATES else None}
    print(f"machine: {os.cpu_count()} CPUs ({cpu_model()}), torch {torch.__version__}, threads {args.threads}, "
          f"workers {args.workers}, load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"workload: {len(rows)} queries on {len(rows) // QUERIES_PER_VIDEO} clips, batch {BATCH}, {NEW_TOKENS} new "
          f"tokens, {settings}")
    results, same, patches = {}, True, {}
    for kind, template in templates.items():
        if template is None:
            continue
        run_per_query(model, processor, rows[:2], settings, template)  # warm-up
        times = {}
        for arm in (("grouped", "per_query") if kind == "text_first" else ("per_query", "grouped")):
            encoded.clear()
            if arm == "grouped":
                answers, seconds = run_grouped(model, processor, rows, settings, template, args.workers)
            else:
                answers, seconds = run_per_query(model, processor, rows, settings, template)
            times[arm] = (answers, seconds)
            patches[(kind, arm)] = sum(encoded)
        same &= times["grouped"][0] == times["per_query"][0]
        results[kind] = times["grouped"][1] / times["per_query"][1]
        print(f"{kind:11} ({template}): grouped {times['grouped'][1]:.2f} s, per-query {times['per_query'][1]:.2f} s "
              f"→ {results[kind]:.3f}; patch rows encoded {patches[(kind, 'grouped')]} vs "
              f"{patches[(kind, 'per_query')]}; same answers {times['grouped'][0] == times['per_query'][0]}")
    print(f"load at end {os.getloadavg()[0]:.2f}")
    print(json.dumps({
        "eval_time_ratio": round(results["text_first"], 3),
        "eval_time_ratio_video_first": round(results["video_first"], 3) if "video_first" in results else None,
        "vision_encodings_ratio": round(patches[("text_first", "grouped")] / patches[("text_first", "per_query")], 3),
        "same_predictions": same,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
