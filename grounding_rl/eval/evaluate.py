"""``grounding-rl eval``: R1@{0.3,0.5,0.7} and mIoU of a checkpoint on a canonical JSONL.

    grounding-rl eval --model DIR --data TEST.jsonl --out OUTDIR [--batch-size B] [--limit N] [--video-root DIR]
                      [--benchmark evaluation/X.yaml] [--prompt-template NAME] [--fps F] [--max-pixels P]
                      [--total-pixels P] [--max-new-tokens N] [--seed S] [--overwrite]

* Preprocessing and prompt are the training ones: command-line overrides > the checkpoint's ``grounding_config.json``
  > the benchmark's paper protocol (``--benchmark``) > built-in defaults; the source is printed and recorded.
* Greedy, batched generation with the KV cache on (:func:`grounding_rl.rollout.generation.generate_answers`, the
  generation path of training too).
* ``OUTDIR/predictions.jsonl`` is written incrementally, one flushed line per query::

      {"qid", "video", "query", "duration", "gt_start", "gt_end", "gt_raw_start", "gt_raw_end", "answer", "reasoning",
       "start", "end", "iou"[, "error"]}

  ``start``/``end`` are the parsed prediction in seconds as the model wrote it (null when unparseable; ``iou`` applies
  the reward's rule: clamped to the clip, reversed → 0), so ``grounding-rl score --predictions OUTDIR/predictions.jsonl
  --annotations TEST.jsonl`` reproduces the metrics. A rerun with the same OUTDIR skips the qids already there and ends
  with the same metrics as an uninterrupted run; a rerun with other settings is refused (``--overwrite`` restarts).
* Queries are grouped by video: each video is decoded once (in background DataLoader workers, ahead of generation)
  and its rows in a batch share one vision encoding (:mod:`grounding_rl.rollout.runner`).
* Under ``accelerate launch`` / ``torchrun`` each rank takes a disjoint shard of whole videos and
  writes ``predictions.rank{r}.jsonl``; after a barrier rank 0 merges everything into ``predictions.jsonl`` in
  annotation order. One process works the same way without the rank files.
* A clip that fails to load (:class:`~grounding_rl.data.video.VideoLoadError`) is a recorded failure: ``answer`` null,
  ``iou`` 0 and an ``error`` message; it is never dropped and never stops the run.
* Rank 0 writes ``metrics.json`` (metrics, model, data, sampling settings, seed, package versions), ``report.md`` and
  ``iou_hist.png``. Metrics come under two scorings (:mod:`grounding_rl.reward.metrics`): ``standard`` (the published
  evaluators' rule; the top level of ``metrics.json``, the report's headline and its anchor comparison) and
  ``clamped`` (ours, the reward's rule), both under ``by_scoring``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from grounding_rl.data.samples import Sample, load_samples
from grounding_rl.errors import UserError, check_number
from grounding_rl.eval.settings import (DEFAULT_MAX_NEW_TOKENS, add_preprocessing_overrides, check_generation_length,
                                        check_video_flags, describe_config, resolve_config, video_overrides)
from grounding_rl.models.loading import check_model_folder, load_for_inference
from grounding_rl.reward.metrics import format_metrics_table
from grounding_rl.reward.records import metrics_from_records, prediction_record
from grounding_rl.rollout.runner import greedy_answer_batches, group_by_video, shard_by_video

logger = logging.getLogger(__name__)

PREDICTIONS = "predictions.jsonl"
RUN_FILE = "eval_config.json"
METRICS = "metrics.json"
REPORT = "report.md"
HISTOGRAM = "iou_hist.png"
BARRIER_TIMEOUT_H = 12
# Settings that must match for a rerun to reuse earlier predictions.
RUN_KEYS = ("model", "model_fingerprint", "data", "data_sha256", "video_root", "prompt_template", "video_layout",
            "video", "max_new_tokens", "dtype", "attn_implementation", "version")


# ------------------------------------------------------------------------------------------------------ records
def read_predictions(path: str | Path) -> tuple[list[dict], int]:
    """Prediction records of one file, tolerating what a killed run leaves behind.

    Returns:
        (records with a ``qid``, number of skipped lines: invalid JSON such as a half-written last line, or objects
        without ``qid``). A missing file gives ``([], 0)``.
    """
    path = Path(path)
    if not path.is_file():
        return [], 0
    records, skipped = [], 0
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                skipped += 1
                continue
            if isinstance(obj, dict) and obj.get("qid") is not None:
                records.append(obj)
            else:
                skipped += 1
    return records, skipped


def prediction_files(outdir: Path) -> list[Path]:
    """``predictions.jsonl`` then the rank files of an interrupted sharded run, in a fixed order."""
    return [outdir / PREDICTIONS] + sorted(outdir.glob("predictions.rank*.jsonl"))


def existing_predictions(outdir: Path) -> dict[str, dict]:
    """``{qid: record}`` over all prediction files in ``outdir``: the first record of a qid wins, except that a
    record without ``error`` replaces one with an error (a clip that failed before and loaded on a rerun)."""
    done: dict[str, dict] = {}
    for path in prediction_files(outdir):
        records, skipped = read_predictions(path)
        if skipped:
            logger.warning("%s: skipped %d unreadable line(s) (an interrupted write?)", path, skipped)
        for record in records:
            qid = str(record["qid"])
            if qid not in done or (done[qid].get("error") and not record.get("error")):
                done[qid] = record
    return done


def merge_predictions(outdir: Path, samples: list[Sample]) -> list[dict]:
    """Merge all prediction files of ``outdir`` into ``predictions.jsonl`` (atomically) and delete the rank files.

    Records of ``samples`` come first, in annotation order; records of other qids (an earlier run on a larger
    ``--limit``) are kept after them.

    Returns:
        the records of ``samples`` in order (a missing one raises RuntimeError: every query must have a record).
    """
    done = existing_predictions(outdir)
    ordered, missing = [], []
    for sample in samples:
        record = done.pop(sample.qid, None)
        (ordered.append(record) if record is not None else missing.append(sample.qid))
    if missing:
        raise RuntimeError(f"{outdir}: {len(missing)} querie(s) have no prediction after the run, e.g. {missing[:3]}")
    tmp = outdir / f".{PREDICTIONS}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        for record in ordered + list(done.values()):
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(tmp, outdir / PREDICTIONS)
    for path in prediction_files(outdir)[1:]:
        path.unlink()
    return ordered


class _Writer:
    """Appends one flushed JSON line per record; repairs a half-written last line left by a killed run."""

    def __init__(self, path: Path):
        self.path = path
        needs_newline = path.is_file() and path.stat().st_size > 0 and path.read_bytes()[-1:] != b"\n"
        self.handle = open(path, "a", encoding="utf-8")
        if needs_newline:
            self.handle.write("\n")

    def write(self, record: dict) -> None:
        self.handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.handle.flush()

    def close(self) -> None:
        self.handle.close()


# ------------------------------------------------------------------------------------------------------ data
# ------------------------------------------------------------------------------------------------------ run
def build_parser(prog: str = "grounding-rl eval", description: str | None = None,
                 out_help: str = "output folder (predictions, metrics, report)") -> argparse.ArgumentParser:
    """The options of ``eval``; ``grounding-rl difficulty`` reuses them with its own name, description and
    ``--out``."""
    parser = argparse.ArgumentParser(prog=prog, description=description or __doc__.split("\n\n")[0],
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
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help=f"generation budget (default: the benchmark's, else {DEFAULT_MAX_NEW_TOKENS})")
    parser.add_argument("--seed", type=int, default=0, help="random seed (decoding is greedy; recorded)")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU), bfloat16, float16, float32")
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
    return parser


def check_flags(args: argparse.Namespace) -> None:
    """The numeric flags of :func:`build_parser` are in range, before anything is read or loaded: ``--max-new-tokens``,
    ``--batch-size``, ``--limit`` ≥ 1, ``--num-workers`` ≥ 0, ``--frame-cache-gb`` > 0, ``--max-missing-fraction`` in
    [0, 1], ``--seed`` in [0, 2³² − 1] (numpy's range) and the frame-sampling overrides > 0
    (:func:`grounding_rl.eval.settings.check_video_flags`). The upper bound of ``--max-new-tokens`` (the model's
    context) is checked once the model's config is known.

    Raises:
        UserError: one line naming the flag and the value.
    """
    for flag, minimum in (("max_new_tokens", 1), ("batch_size", 1), ("limit", 1), ("num_workers", 0)):
        check_number("--" + flag.replace("_", "-"), getattr(args, flag, None), minimum=minimum)
    check_number("--frame-cache-gb", args.frame_cache_gb, above=0)
    check_number("--max-missing-fraction", args.max_missing_fraction, minimum=0.0, maximum=1.0)
    check_number("--seed", args.seed, minimum=0, maximum=2**32 - 1)
    check_video_flags(args)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _check_run(outdir: Path, run: dict) -> None:
    """Refuse to resume predictions made by something else: ``eval_config.json`` records the fingerprint of what
    produced them (:data:`RUN_KEYS`: model and its weights fingerprint, data path and content hash, video and sampling
    settings, package version). A folder without predictions holds nothing to resume, whatever its
    ``eval_config.json`` says.

    Raises:
        UserError: one line naming what changed and the two ways on (``--overwrite``, or another ``--out``).
    """
    from grounding_rl.data.fingerprint import changes

    path = outdir / RUN_FILE
    if not path.is_file() or not existing_predictions(outdir):  # no predictions (e.g. a failed load): nothing to keep
        return
    try:
        previous = json.loads(path.read_text())
    except json.JSONDecodeError:
        return
    differ = changes(previous, run, RUN_KEYS)
    if differ:
        raise UserError(f"{outdir} holds predictions made by something else ({'; '.join(differ)}); rerun with "
                        "--overwrite to replace them, or give a new --out")


def evaluate(args: argparse.Namespace) -> dict | None:
    """Run the evaluation described by parsed ``args`` (see :func:`build_parser`).

    Returns:
        on the main process, the ``metrics.json`` object; None on the other ranks.

    Raises:
        UserError: bad settings (a numeric flag out of range, :func:`check_flags`; ``max_new_tokens`` above the
            model's context), duplicate qids, or an OUTDIR holding predictions made with other settings.
        AnnotationError: a bad data file (names file and line).
    """
    from accelerate import PartialState

    check_flags(args)
    # Ranks wait for the slowest shard at the final barrier: a long timeout instead of NCCL's 10 minutes.
    state = PartialState(cpu=not torch.cuda.is_available(), timeout=datetime.timedelta(hours=BARRIER_TIMEOUT_H))
    main_process = state.is_main_process
    outdir = Path(args.out)
    bench = None
    if args.benchmark:
        from grounding_rl.eval.benchmarks import load_benchmark

        bench = load_benchmark(args.benchmark, data_root_dir=args.data_root)

    check_model_folder(args.model)  # before any output: full weights beside an adapter are refused
    counts: dict[str, int] = {}
    samples = load_samples(args.data, video_root=args.video_root, counts=counts)
    total_in_file = len(samples)
    dropped = counts.get("dropped", 0) if args.limit is None else 0  # counted by the standard scoring (IoU 0)
    if args.limit is not None:
        samples = samples[: max(args.limit, 0)]
    if not samples:
        raise UserError(f"{args.data}: no queries to evaluate")
    from grounding_rl.data.missing import check_fraction, missing_videos

    absent, num_videos = missing_videos(s.video for s in samples)
    check_fraction(absent, num_videos, args.max_missing_fraction, f"{args.data}: missing",
                   "check --video-root" + (" (the benchmark's video_root)" if bench else ""))
    qids = [s.qid for s in samples]
    if len(set(qids)) != len(qids):
        dup = next(q for q in qids if qids.count(q) > 1)
        raise UserError(f"{args.data}: duplicate qid {dup!r}; qids must be unique to resume and merge predictions")
    expected = None if bench is None else bench.expected_queries
    if bench is not None and args.limit is None and expected is not None and total_in_file != expected \
            and main_process:
        print(f"warning: {args.data} has {total_in_file} queries; benchmark {bench.name} expects "
              f"{expected}", file=sys.stderr)
    # an unknown expected count (expected_queries: null): the data file is taken as prepared from the benchmark's
    # file, as scripts/eval.sh prepares it
    if bench is not None and args.limit is None and expected in (None, total_in_file) and not dropped:
        from grounding_rl.eval.benchmarks import dropped_annotations

        dropped = dropped_annotations(bench)  # prepared from the benchmark file, whose dropped queries standard counts

    try:
        config, source = resolve_config(
            args.model, prompt_template=args.prompt_template, video_layout=args.video_layout,
            fallback=bench.protocol if bench else None,
            fallback_name=f"benchmark {bench.name} paper protocol" if bench else "benchmark protocol",
            **video_overrides(args))
    except ValueError as err:  # an unknown template or video setting, a grounding_config.json that is not JSON
        raise UserError(f"{args.model}: {err}") from None
    if args.max_new_tokens is not None:
        max_new_tokens, flag = args.max_new_tokens, "--max-new-tokens"
    elif bench is not None and bench.max_new_tokens is not None:
        max_new_tokens, flag = bench.max_new_tokens, f"{args.benchmark}: max_new_tokens"
    else:
        max_new_tokens, flag = DEFAULT_MAX_NEW_TOKENS, "--max-new-tokens (default)"
    check_generation_length(flag, max_new_tokens, args.model)
    model_id = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model
    from grounding_rl import __version__
    from grounding_rl.data.fingerprint import file_sha256, model_fingerprint

    run = {"model": model_id, "model_fingerprint": model_fingerprint(args.model),
           "data": str(Path(args.data).resolve()), "data_sha256": file_sha256(args.data),
           "version": __version__,
           "video_root": str(Path(args.video_root).resolve()) if args.video_root else None,
           "prompt_template": config.prompt_template, "video_layout": config.video_layout,
           "video": config.video.to_dict(), "max_new_tokens": max_new_tokens,
           "dtype": args.dtype, "attn_implementation": args.attn_implementation,
           **({"engine": args.engine} if args.engine != "hf" else {})}
    if main_process:
        print(f"eval: settings from {source}")
        print(f"eval: {describe_config(config)} max_new_tokens={max_new_tokens} (greedy)")

    # Every rank reads the same finished set before anyone writes (barrier), so the shards are disjoint.
    if main_process:
        outdir.mkdir(parents=True, exist_ok=True)
        if args.overwrite:
            for path in prediction_files(outdir) + [outdir / RUN_FILE, outdir / METRICS, outdir / REPORT,
                                                    outdir / HISTOGRAM]:
                path.unlink(missing_ok=True)
    state.wait_for_everyone()
    _check_run(outdir, run)
    done = existing_predictions(outdir)
    state.wait_for_everyone()
    # a failed clip (recorded with an error) is tried again on a rerun
    pending = [s for s in samples if s.qid not in done or done[s.qid].get("error")]
    # shards of whole videos: each video is decoded and encoded once, on one rank, for all its pending queries
    groups = shard_by_video(group_by_video([s.video for s in pending]), state.process_index, state.num_processes)
    shard = [pending[p] for _, positions in groups for p in positions]
    if main_process:
        print(f"eval: {len(samples)} queries, {len(samples) - len(pending)} already in {outdir}, "
              f"{len(pending)} to run on {state.num_processes} process(es)")

    started = time.perf_counter()
    if shard:
        _seed_everything(args.seed)
        model, processor, engine = _load_engine(args, state.device)
    # eval_config.json only once every rank that runs queries has its model: a failed load leaves no record
    state.wait_for_everyone()
    if main_process:
        (outdir / RUN_FILE).write_text(json.dumps(run, indent=2) + "\n")
    if shard:
        name = PREDICTIONS if state.num_processes == 1 else f"predictions.rank{state.process_index}.jsonl"
        writer = _Writer(outdir / name)
        batches = greedy_answer_batches(model, processor, [s.video for s in shard], [s.query for s in shard],
                                        config.video, config.prompt_template, max_new_tokens, args.batch_size,
                                        args.num_workers, args.frame_cache, int(args.frame_cache_gb * 1e9),
                                        engine=engine, video_layout=config.video_layout)
        bar = tqdm(total=len(shard), desc=f"eval (rank 0 of {state.num_processes})", unit="query",
                   disable=not main_process, file=sys.stderr)
        failed = 0
        try:
            for batch in batches:
                for position, answer, error, sampling in batch:
                    record = prediction_record(shard[position], answer, error, sampling)
                    writer.write(record)
                    failed += record.get("error") is not None
                bar.update(len(batch))
                bar.set_postfix(failed=failed)
        finally:
            writer.close()
            bar.close()
        del model
    state.wait_for_everyone()
    if not main_process:
        return None

    wall = time.perf_counter() - started
    records = merge_predictions(outdir, samples)
    metrics = metrics_from_records(records, config.prompt_template, dropped)
    metrics["missing_videos"] = len(absent)
    metrics["missing_predictions"] = sum(1 for r in records if r.get("start") is None or r.get("end") is None)
    info = {"model": model_id, "data": run["data"], "benchmark": bench.name if bench else None,
            "limit": args.limit,
            "sampling": {"source": source, "prompt_template": config.prompt_template,
                         "video_layout": config.video_layout, "video": config.video.to_dict(),
                         "max_new_tokens": max_new_tokens, "do_sample": False, "repetition_penalty": 1.0,
                         "batch_size": args.batch_size,
                         "dtype": args.dtype},
            "seed": args.seed, "num_processes": state.num_processes,
            "run": {"queries_run": len(pending), "videos_run": len(group_by_video([s.video for s in pending])),
                    "wall_time_s": round(wall, 3),
                    "queries_per_second": round(len(pending) / wall, 4) if wall > 0 and pending else None}}
    from grounding_rl.eval import report

    payload = report.write_metrics_json(outdir / METRICS, metrics, info)
    failures = sum(1 for r in records if r.get("start") is None or r.get("end") is None)
    report.plot_iou_hist([r["iou"] for r in records], outdir / HISTOGRAM, failures=failures)
    anchors_md = None
    if bench is not None and bench.anchors:
        from grounding_rl.eval.benchmarks import anchors_table

        anchors_md = anchors_table(bench.anchors, ours=metrics, ours_label=Path(model_id).name or "this run")
    report.write_report_md(outdir / REPORT, metrics, info, anchors_md=anchors_md, hist_name=HISTOGRAM)
    print(format_metrics_table(metrics))
    print(f"eval: {metrics['n']} queries; {metrics['video_load_failures']} failed clips (IoU 0; "
          f"{len(absent)} of {num_videos} videos missing), {metrics['missing_predictions']} without a parsed "
          "prediction (IoU 0)")
    print(f"eval: wrote {outdir / PREDICTIONS}, {outdir / METRICS}, {outdir / REPORT}, {outdir / HISTOGRAM}")
    unreadable = sorted({r.get("video") or r["qid"] for r in records if r.get("error")})
    check_fraction(unreadable, num_videos, args.max_missing_fraction, f"{args.data}: missing or unreadable",
                   f"metrics in {outdir / METRICS} count them as IoU 0")
    return payload


def _load_engine(args, device):
    """``(model, processor, engine)``: the HF model and no engine, or (``--engine vllm``) no HF model and a vLLM
    engine on the checkpoint (:func:`grounding_rl.rollout.vllm.engine_for_inference`)."""
    if getattr(args, "engine", "hf") != "vllm":
        return (*load_for_inference(args.model, device, args.dtype, args.attn_implementation), None)
    from grounding_rl.models.loading import check_weight_files, load_processor
    from grounding_rl.rollout.vllm import engine_for_inference

    check_weight_files(args.model)  # a missing shard or a truncated file: one line, as with the hf engine
    processor = load_processor(args.model)
    return None, processor, engine_for_inference(args.model, processor, args.dtype)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point. Returns 0 on success; a user's mistake raises :class:`grounding_rl.errors.UserError` (or an
    ``OSError`` naming the path), which the ``grounding-rl`` command prints as one line with exit status 2."""
    from grounding_rl.data.samples import VideoProbeError

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        evaluate(args)
    except VideoProbeError as err:
        raise UserError(str(err)) from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
