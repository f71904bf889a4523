"""Evaluation of a checkpoint on a canonical JSONL: R1@{0.3,0.5,0.7} and mIoU (what ``grounding-rl eval`` runs,
:mod:`grounding_rl.cli.eval`).

:func:`evaluate` takes an :class:`EvalRequest` (what to evaluate, how) and runs three steps, each its own function:

* :func:`plan` — read and check everything before a model loads: the data (the one validation policy), missing videos
  (``max_missing_fraction``), the durations of the first videos' queries against the clips'
  (:func:`grounding_rl.data.durations.check_first_videos`: milliseconds or frames are refused), unique qids, the
  benchmark definition, the preprocessing and prompt (command-line overrides > the checkpoint's
  ``grounding_config.json`` > the benchmark's paper protocol > built-in defaults; the source is printed and
  recorded), the generation budget and the run record;
* :func:`run` — greedy, batched generation in the request's mode, one call to
  :func:`grounding_rl.rollout.answering.answer_batches` (queries grouped by video, each video decoded once in background
  DataLoader workers, its rows sharing one vision encoding) into
  ``OUTDIR/predictions.jsonl``, one flushed line per query::

      {"qid", "video", "query", "duration", "gt_start", "gt_end", "gt_raw_start", "gt_raw_end", "answer", "reasoning",
       "start", "end", "iou"[, "error"]}

  With ``zoom`` (``eval --zoom``) a record is pass 2's answer, pass 1's under ``pass1``
  (:func:`grounding_rl.eval.zoom.zoom_record`); with ``max_turns`` K (``eval --max-turns K``) the crop tool's final
  turn, every turn under ``conversation`` (:mod:`grounding_rl.eval.turns`). A query's record is written once it is
  answered, so resume and sharding are the same in every mode.

  ``start``/``end`` are the parsed prediction in seconds as the model wrote it (null when unparseable; ``iou`` applies
  the reward's rule: clamped to the clip, reversed → 0), so ``grounding-rl score --predictions OUTDIR/predictions.jsonl
  --annotations TEST.jsonl`` reproduces the metrics. A rerun with the same OUTDIR skips the qids already there and
  ends with the same metrics as an uninterrupted run; a rerun with other settings is refused (``overwrite`` restarts).
  One run at a time per OUTDIR: the main process holds an OS lock on ``OUTDIR/.lock`` (:mod:`grounding_rl.eval.lock`)
  from before its first write there to the end of :func:`report`, released when it ends however it ends (so a run
  killed with ``kill -9`` resumes); a second run on it is refused with one line.
  Under ``accelerate launch`` / ``torchrun`` each rank takes a disjoint shard of whole videos and writes
  ``predictions.rank{r}.jsonl``. A clip that fails to load
  (:class:`~grounding_rl.data.video.VideoLoadError`) is a recorded failure: ``answer`` null, ``iou`` 0 and an
  ``error`` message; it is never dropped and never stops the run;
* :func:`report` — on rank 0, after a barrier: every prediction file merged into ``predictions.jsonl`` in annotation
  order, then ``metrics.json`` (metrics, model, data, sampling settings, seed, package versions), ``report.md`` and
  ``iou_hist.png``. Metrics come under two scorings (:mod:`grounding_rl.reward.metrics`): ``standard`` (the published
  evaluators' rule; the top level of ``metrics.json``, the report's headline and its anchor comparison) and
  ``clamped`` (ours, the reward's rule), both under ``by_scoring``, and the published evaluators' own scorings named
  in ``scorings`` (:mod:`grounding_rl.reward.scorings`), each with its own ``n`` and ``source``.
"""
from __future__ import annotations

import datetime
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from grounding_rl import __version__
from grounding_rl.data.durations import check_first_videos
from grounding_rl.data.missing import check_fraction, missing_videos
from grounding_rl.data.samples import Sample, load_samples
from grounding_rl.errors import UserError, check_number
from grounding_rl.eval.benchmarks import anchors_table, dropped_annotations, load_benchmark
from grounding_rl.eval.settings import (DEFAULT_MAX_NEW_TOKENS, PreprocessingOverrides, check_generation_length,
                                        describe_config, resolve_config)
from grounding_rl.eval.lock import lock_output_dir
from grounding_rl.eval.turns import check_turns_run, turns_summary
from grounding_rl.eval.zoom import ZoomSettings, check_run, zoom_record, zoom_summary
from grounding_rl.rollout.tools import ToolSettings
from grounding_rl.jsonl_files import COUNT, JsonlAppender, JsonLines, write_jsonl_atomic
from grounding_rl.models.loading import check_model_folder, load_processor
from grounding_rl.reward.metrics import format_metrics_table, record_prediction, scoring_names
from grounding_rl.prompts.parsing import parse_spans
from grounding_rl.prompts.templates import is_set_template
from grounding_rl.reward.records import metrics_from_records, standard_ious
from grounding_rl.rollout.answering import Mode, answer_batches
from grounding_rl.rollout.greedy import group_by_video, query_seed, shard_by_video
from grounding_rl.run_record import check_record, file_sha256, model_fingerprint, read_record, write_record

logger = logging.getLogger(__name__)

PREDICTIONS = "predictions.jsonl"
RUN_FILE = "eval_config.json"
METRICS = "metrics.json"
REPORT = "report.md"
REPORT_HTML = "report.html"
HISTOGRAM = "iou_hist.png"
BARRIER_TIMEOUT_H = 12
# Settings that must match for a rerun to reuse earlier predictions.
RUN_KEYS = ("model", "model_fingerprint", "data", "data_sha256", "video_root", "prompt_template", "video_layout",
            "video", "max_new_tokens", "dtype", "attn_implementation", "version", "zoom", "temperature", "max_turns",
            "seed")


# ------------------------------------------------------------------------------------------------------ records
def read_predictions(path: str | Path) -> tuple[list[dict], int]:
    """Prediction records of one file, tolerating what a killed run leaves behind (:class:`grounding_rl.jsonl_files.
    JsonLines` in ``count`` mode).

    Returns:
        (records with a ``qid``, number of skipped lines: invalid JSON such as a half-written last line, or objects
        without ``qid``). A missing file gives ``([], 0)``.
    """
    path = Path(path)
    if not path.is_file():
        return [], 0
    lines = JsonLines(path, COUNT)
    rows = [row for _, row in lines]
    records = [row for row in rows if row.get("qid") is not None]
    return records, lines.skipped + len(rows) - len(records)


def has_prediction(record: dict) -> bool:
    """Whether a prediction record holds a usable prediction, read as ``grounding-rl score`` and the metrics read it
    (:func:`grounding_rl.reward.metrics.record_prediction`): ``start``/``end`` when both are given, else the ``answer``
    parsed (a set-scored record: ``pred_spans``, else the answer parsed as a set). A rescored row with a fresh
    ``answer`` and a stale ``start: null`` has one."""
    answer = record.get("answer")
    if record.get("gt_spans") is not None:
        return bool(record.get("pred_spans") or (isinstance(answer, str) and parse_spans(answer)))
    try:
        return record_prediction({"pred_start": record.get("start"), "pred_end": record.get("end"),
                                  "answer": answer if isinstance(answer, str) else None}) is not None
    except ValueError:  # a non-numeric start/end: no usable prediction
        return False


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
    write_jsonl_atomic(outdir / PREDICTIONS, ordered + list(done.values()))
    for path in prediction_files(outdir)[1:]:
        path.unlink()
    return ordered


# ------------------------------------------------------------------------------------------------------ request
@dataclass(frozen=True)
class EvalRequest:
    """What to evaluate and how: ``grounding-rl eval``'s flags, typed (:mod:`grounding_rl.cli.eval` builds one;
    ``grounding-rl difficulty`` builds one too).

    Attributes:
        model: checkpoint folder (or a hub id already in the local cache).
        data: canonical JSONL (``grounding-rl prepare``).
        out: output folder (predictions, metrics, report).
        batch_size: queries per generate call, per process (≥ 1).
        limit: evaluate only the first N queries (≥ 1), None = all.
        video_root: folder for relative video paths in ``data``.
        benchmark: a benchmark YAML (``evaluation/*.yaml``): its paper protocol is used when the checkpoint has no
            ``grounding_config.json``, its expected query count is checked, its anchors are reported.
        data_root: folder of the benchmark's annotation files (default ``$GROUNDING_RL_DATA``, else the test data).
        overrides: preprocessing and prompt overrides (:class:`grounding_rl.eval.settings.PreprocessingOverrides`).
        max_new_tokens: generation budget; None = the benchmark's, else :data:`DEFAULT_MAX_NEW_TOKENS`.
        seed: random seed (decoding is greedy; recorded), in [0, 2³² − 1].
        dtype: ``auto`` (bf16 on GPU, fp32 on CPU), ``bfloat16``, ``float16``, ``float32``.
        attn_implementation: e.g. ``sdpa``, ``flash_attention_2``; None = transformers' default.
        engine: ``hf`` (transformers generate) or ``vllm`` (the same frames, clip metadata and prompt ids).
        num_workers: DataLoader workers decoding clips per process (≥ 0).
        frame_cache, frame_cache_gb: an optional on-disk frame cache folder and its size bound (GB, > 0).
        overwrite: discard earlier predictions in ``out``.
        max_missing_fraction: fail when more than this share of the videos is missing (checked before the model
            loads) or unreadable (after the run; metrics are written); 1.0 = never.
        scorings: published evaluators' scorings to report beside ``standard`` and ``clamped`` (names of
            :mod:`grounding_rl.reward.scorings`, or ``all``); they change no prediction, so a finished ``out`` is
            rescored without running the model. ``qvhighlights`` is added by itself when every query comes from
            the qvhighlights reader, and a benchmark's own ``scorings`` (its YAML) always.
        zoom: a second pass on the window of each first answer (:class:`grounding_rl.rollout.zoom.ZoomSettings`);
            None = one pass.
        temperature: None = greedy decoding; a temperature > 0 samples instead (top_p 1, top_k off) — the K rollouts
            of ``grounding-rl difficulty --num-rollouts`` (recorded; not with ``zoom``). Each query is sampled alone
            from its own seed, :func:`grounding_rl.rollout.greedy.query_seed` of (``seed``, its qid), so a resumed or
            sharded pass writes the same answers as an uninterrupted one.
        max_turns: run the policy with the crop tool, at most this many crop requests per query
            (:mod:`grounding_rl.eval.turns`); 0 = one turn.
        device: where the model runs (``cpu``, ``cuda``, ``cuda:1``); None = the process's device (cuda when
            available; under ``accelerate launch`` each rank's own, and ``device`` is refused there).
        print_prompt: print the exact prompt of the first query to run before generating (as ``infer
            --print-prompt`` prints it).
    """

    model: str
    data: str
    out: str
    batch_size: int = 4
    limit: int | None = None
    video_root: str | None = None
    benchmark: str | None = None
    data_root: str | None = None
    overrides: PreprocessingOverrides = field(default_factory=PreprocessingOverrides)
    max_new_tokens: int | None = None
    seed: int = 0
    dtype: str = "auto"
    attn_implementation: str | None = None
    engine: str = "hf"
    num_workers: int = 2
    frame_cache: str | None = None
    frame_cache_gb: float = 20.0
    overwrite: bool = False
    max_missing_fraction: float = 0.05
    scorings: tuple[str, ...] = ()
    zoom: ZoomSettings | None = None
    temperature: float | None = None
    max_turns: int = 0
    device: str | None = None
    print_prompt: bool = False

    def check(self) -> None:
        """Every number is in range, before anything is read or loaded (the upper bound of ``max_new_tokens``, the
        model's context, is checked by :func:`plan` once the model's config is known).

        Raises:
            UserError: one line naming the flag and the value, e.g. ``--batch-size must be ≥ 1 (got 0)``.
        """
        for flag, minimum in (("max_new_tokens", 1), ("batch_size", 1), ("limit", 1), ("num_workers", 0)):
            check_number("--" + flag.replace("_", "-"), getattr(self, flag), minimum=minimum)
        check_number("--frame-cache-gb", self.frame_cache_gb, above=0)
        check_number("--max-missing-fraction", self.max_missing_fraction, minimum=0.0, maximum=1.0)
        check_number("--seed", self.seed, minimum=0, maximum=2**32 - 1)
        if self.temperature is not None:
            check_number("--temperature", self.temperature, above=0)
            if self.zoom is not None or self.engine != "hf" or self.max_turns:
                raise UserError("sampled answers (--temperature) run with --engine hf, without --zoom and without "
                                "--max-tool-calling-iterations")
        if self.engine not in ("hf", "vllm"):
            raise UserError(f"--engine must be hf or vllm (got {self.engine!r})")
        try:
            scoring_names(self.scorings)
        except ValueError as err:
            raise UserError(f"--scoring: {err}") from None
        self.overrides.check()
        ToolSettings(self.max_turns)  # refuses K < 0
        from grounding_rl.eval.engines import check_device, check_dtype

        check_dtype(self.dtype)
        check_device(self.device)
        if self.frame_cache is not None and Path(self.frame_cache).exists() and not Path(self.frame_cache).is_dir():
            raise UserError(f"--frame-cache {self.frame_cache} is a file; give a folder (created if absent)")


@dataclass
class EvalPlan:
    """Everything :func:`plan` read and decided before a model loads.

    Attributes:
        request: the request.
        samples: the queries to evaluate (after the validation policy and ``limit``), in file order.
        dropped: annotation lines the validation policy dropped (the ``standard`` scoring counts them, IoU 0).
        absent: videos of ``samples`` that are missing; num_videos: their distinct videos.
        benchmark: the loaded benchmark definition, or None.
        config: the preprocessing and prompt (:class:`grounding_rl.prompts.preprocessing.GroundingConfig`);
            source: where they came from, in words.
        max_new_tokens: the generation budget.
        model_id: the model's absolute path (or its hub id).
        run: the run record written as ``eval_config.json`` (:data:`RUN_KEYS` are compared on a rerun).
    """

    request: EvalRequest
    samples: list[Sample]
    dropped: int
    absent: list[str]
    num_videos: int
    benchmark: object | None
    config: object
    source: str
    max_new_tokens: int
    model_id: str
    run: dict


@dataclass
class RunResult:
    """What :func:`run` did on this process: the queries and videos it ran (on every rank: the pending ones of all
    ranks), and the wall time in seconds."""

    queries_run: int
    videos_run: int
    wall_time_s: float


# ------------------------------------------------------------------------------------------------------ plan
def plan(request: EvalRequest, main_process: bool = True) -> EvalPlan:
    """Read and check what :func:`run` needs, before any model loads or any output is written.

    Raises:
        UserError: a number out of range (:meth:`EvalRequest.check`), an ``out`` holding another tool's predictions or
            metrics (:func:`_check_foreign`), a model path that names no checkpoint, a model
            folder holding full weights beside an adapter, no queries, duplicate qids, too many missing videos, a
            duration off its video's by a factor outside [0.5, 2] (the first videos probed), an unknown template or
            video setting,
            ``max_new_tokens`` above the model's context.
        AnnotationError: a bad data file (names file and line).
    """
    request.check()
    bench = None
    if request.benchmark:
        bench = load_benchmark(request.benchmark, data_root_dir=request.data_root)
    samples, dropped, absent, num_videos = _read_samples(request, bench, main_process)
    check_model_folder(request.model)  # before any output: a mistyped --model, full weights beside an adapter
    if not request.overwrite and Path(request.out).is_dir():
        _check_foreign(Path(request.out))
    try:
        config, source = resolve_config(
            request.model, request.overrides, fallback=bench.protocol if bench else None,
            fallback_name=f"benchmark {bench.name} paper protocol" if bench else "benchmark protocol")
    except ValueError as err:  # an unknown template or video setting, a grounding_config.json that is not JSON
        raise UserError(f"{request.model}: {err}") from None
    if request.max_new_tokens is not None:
        max_new_tokens, flag = request.max_new_tokens, "--max-new-tokens"
    elif bench is not None and bench.max_new_tokens is not None:
        max_new_tokens, flag = bench.max_new_tokens, f"{request.benchmark}: max_new_tokens"
    else:
        max_new_tokens, flag = DEFAULT_MAX_NEW_TOKENS, "--max-new-tokens (default)"
    check_generation_length(flag, max_new_tokens, request.model)
    model_id = str(Path(request.model).resolve()) if Path(request.model).exists() else request.model
    if request.zoom is not None:
        check_run(request.zoom, request.model, request.engine, config.video.sampler, config.prompt_template)
    check_turns_run(request.max_turns, request.zoom is not None, config.video.sampler, config.prompt_template)
    return EvalPlan(request=request, samples=samples, dropped=dropped, absent=absent, num_videos=num_videos,
                    benchmark=bench, config=config, source=source, max_new_tokens=max_new_tokens, model_id=model_id,
                    run=_run_record(request, config, max_new_tokens, model_id))


def _read_samples(request: EvalRequest, bench, main_process: bool) -> tuple[list[Sample], int, list, int]:
    """The queries to evaluate, checked (:func:`plan`): ``(samples, dropped annotations, absent videos, number of
    videos)``. Raises UserError / AnnotationError as :func:`plan` says."""
    counts: dict[str, int] = {}
    samples = load_samples(request.data, video_root=request.video_root, counts=counts)
    total_in_file = len(samples)
    dropped = counts.get("dropped", 0) if request.limit is None else 0  # counted by the standard scoring (IoU 0)
    if request.limit is not None:
        samples = samples[: request.limit]
    if not samples:
        raise UserError(f"{request.data}: no queries to evaluate")
    absent, num_videos = missing_videos(s.video for s in samples)
    check_fraction(absent, num_videos, request.max_missing_fraction, f"{request.data}: missing",
                   "check --video-root" + (" (the benchmark's video_root)" if bench else ""))
    check_first_videos(samples, request.data)  # a file in milliseconds or frames, before any prediction
    qids = [s.qid for s in samples]
    if len(set(qids)) != len(qids):
        dup = next(q for q in qids if qids.count(q) > 1)
        raise UserError(f"{request.data}: duplicate qid {dup!r}; qids must be unique to resume and merge predictions")
    expected = None if bench is None else bench.expected_queries
    if bench is not None and request.limit is None and expected is not None and total_in_file != expected \
            and main_process:
        print(f"warning: {request.data} has {total_in_file} queries; benchmark {bench.name} expects {expected}",
              file=sys.stderr)
    # an unknown expected count (expected_queries: null): the data file is taken as prepared from the benchmark's
    # file, as scripts/eval.sh prepares it
    if bench is not None and request.limit is None and expected in (None, total_in_file) and not dropped:
        dropped = dropped_annotations(bench)  # prepared from the benchmark file, whose dropped queries standard counts
    return samples, dropped, absent, num_videos


def _run_record(request: EvalRequest, config, max_new_tokens: int, model_id: str) -> dict:
    """``eval_config.json``: the settings a rerun must match to reuse the predictions (:data:`RUN_KEYS`)."""
    return {"model": model_id, "model_fingerprint": model_fingerprint(request.model),
              "data": str(Path(request.data).resolve()), "data_sha256": file_sha256(request.data),
              "version": __version__,
              "video_root": str(Path(request.video_root).resolve()) if request.video_root else None,
              "prompt_template": config.prompt_template, "video_layout": config.video_layout,
              "video": config.video.to_dict(), "max_new_tokens": max_new_tokens,
              "dtype": request.dtype, "attn_implementation": request.attn_implementation,
              **({"engine": request.engine} if request.engine != "hf" else {}),
              # sampled answers depend on the seed (per query, query_seed); greedy ones do not, so it is not recorded
              **({"temperature": request.temperature, "seed": request.seed, "seeding": "per query"}
                 if request.temperature is not None else {}),
              "zoom": asdict(request.zoom) if request.zoom is not None else None, "max_turns": request.max_turns}


def _check_foreign(outdir: Path) -> None:
    """Refuse an ``outdir`` holding a ``predictions.jsonl`` or ``metrics.json`` that another tool wrote (no
    ``eval_config.json`` beside it, or prediction rows without ``gt_start``, e.g. ``grounding-rl score``'s input), read
    by :func:`plan` before anything is written there (unless ``overwrite``).

    Raises:
        UserError: one line naming the files and the two ways on (``--overwrite``, or another ``--out``).
    """
    foreign = [] if (outdir / RUN_FILE).is_file() else [n for n in (PREDICTIONS, METRICS) if (outdir / n).is_file()]
    if any("gt_start" not in record for record in existing_predictions(outdir).values()):
        foreign = foreign or [PREDICTIONS]
    if foreign:
        raise UserError(f"{outdir} holds {' and '.join(foreign)} not written by eval (no {RUN_FILE}, or rows without "
                        "gt_start); rerun with --overwrite to replace them, or give a new --out")


def _check_run(outdir: Path, run: dict) -> None:
    """Refuse to resume predictions made by something else: ``eval_config.json`` records the fingerprint of what
    produced them (:data:`RUN_KEYS`: model and its weights fingerprint, data path and content hash, video and sampling
    settings, package version). A folder without predictions holds nothing to resume, whatever its
    ``eval_config.json`` says.

    Raises:
        UserError: one line naming what changed and the two ways on (``--overwrite``, or another ``--out``).
    """
    if existing_predictions(outdir):  # no predictions (e.g. a failed load): nothing to keep, whatever the record says
        previous = read_record(outdir / RUN_FILE)
        if previous is not None and "zoom" not in previous and run.get("zoom") is not None:  # made before --zoom
            raise UserError(f"{outdir} holds predictions made by something else (zoom: None → {run['zoom']!r}); "
                            "rerun with --overwrite to replace them, or give a new --out")
        if previous is not None and "temperature" in previous and "seeding" not in previous:  # one seed for a shard
            raise UserError(f"{outdir} holds sampled predictions made before each query had its own seed (they "
                            "cannot be resumed exactly); rerun with --overwrite to replace them, or give a new --out")
        if previous is not None and "max_turns" not in previous and run.get("max_turns"):  # made before --max-turns
            raise UserError(f"{outdir} holds predictions made by something else (max_turns: 0 → {run['max_turns']}); "
                            "rerun with --overwrite to replace them, or give a new --out")
        check_record(outdir / RUN_FILE, run, RUN_KEYS, f"{outdir} holds predictions made by something else",
                     "rerun with --overwrite to replace them, or give a new --out")


# ------------------------------------------------------------------------------------------------------ run
def run(plan_: EvalPlan, state) -> RunResult:
    """Generate the pending predictions of this process's shard into ``OUTDIR`` (see the module docstring).

    Args:
        plan_: from :func:`plan`.
        state: ``accelerate.PartialState`` (process index and count, barriers).

    Raises:
        UserError: ``OUTDIR`` holds predictions made with other settings (without ``overwrite``).
    """
    from transformers import set_seed

    request, samples = plan_.request, plan_.samples
    outdir, main_process = Path(request.out), state.is_main_process
    if main_process:
        print(f"eval: settings from {plan_.source}")
        decoding = "greedy" if request.temperature is None else \
            f"sampled at temperature {request.temperature:g}, each query from its own seed under --seed {request.seed}"
        print(f"eval: {describe_config(plan_.config)} max_new_tokens={plan_.max_new_tokens} ({decoding})")
        # Every rank reads the same finished set before anyone writes (barrier), so the shards are disjoint.
        outdir.mkdir(parents=True, exist_ok=True)
        if request.overwrite:
            for path in prediction_files(outdir) + [outdir / RUN_FILE, outdir / METRICS, outdir / REPORT,
                                                    outdir / REPORT_HTML, outdir / HISTOGRAM]:
                path.unlink(missing_ok=True)
    state.wait_for_everyone()
    _check_run(outdir, _main_process_run(plan_.run, state))
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
    if main_process and request.print_prompt and pending:
        _print_first_prompt(plan_, pending[0])
    started = time.perf_counter()
    if shard:
        set_seed(request.seed)
        from grounding_rl.eval.engines import load_inference_engine

        model, processor, engine = load_inference_engine(request.model, request.device or state.device, request.dtype,
                                                         request.attn_implementation, request.engine,
                                                         max_videos=request.max_turns + 1)
    # eval_config.json only once every rank that runs queries has its model: a failed load leaves no record
    state.wait_for_everyone()
    if main_process:
        write_record(outdir / RUN_FILE, plan_.run)
    if shard:
        _answer_into(plan_, state, shard, model, processor, engine)
        del model
    state.wait_for_everyone()
    return RunResult(queries_run=len(pending), videos_run=len(group_by_video([s.video for s in pending])),
                     wall_time_s=time.perf_counter() - started)


def _main_process_run(run: dict, state) -> dict:
    """``run`` (``eval_config.json``'s record) with the main process's model path and fingerprint: a rerun is judged
    by the main process's model, since another machine may read its own copy of it."""
    record = dict(run)
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        record.update(broadcast_object_list([{k: record.get(k) for k in ("model", "model_fingerprint")}])[0])
    return record


def _answer_into(plan_: EvalPlan, state, shard: list[Sample], model, processor, engine) -> None:
    """Answer this process's ``shard`` in the request's mode (:func:`grounding_rl.rollout.answering.answer_batches`,
    one call) and append each record to its prediction file as it comes (pass 2's answer and ``pass1`` with the zoom,
    :func:`grounding_rl.eval.zoom.zoom_record`; the ``conversation`` with the crop tool)."""
    from grounding_rl.reward.records import prediction_record

    request, config = plan_.request, plan_.config
    name = PREDICTIONS if state.num_processes == 1 else f"predictions.rank{state.process_index}.jsonl"
    seeds = None if request.temperature is None else [query_seed(request.seed, s.qid) for s in shard]
    batches = answer_batches(model, processor, [s.video for s in shard], [s.query for s in shard], config,
                             plan_.max_new_tokens, request.batch_size,
                             Mode(request.zoom, request.max_turns, request.temperature), request.num_workers,
                             request.frame_cache, int(request.frame_cache_gb * 1e9), engine, seeds)
    writer = JsonlAppender(Path(request.out) / name)
    bar = tqdm(total=len(shard), desc=f"eval (rank 0 of {state.num_processes})", unit="query",
               disable=not state.is_main_process, file=sys.stderr)
    failed = 0
    try:
        for batch in batches:
            for a in batch:
                record = prediction_record(shard[a.position], a.text, a.error, a.sampling,
                                           set_answers=is_set_template(config.prompt_template))
                conversation = {} if a.conversation is None else {"conversation": a.conversation}
                record = zoom_record({**record, **conversation}, a.zoom, shard[a.position])
                writer.write(record)
                failed += record.get("error") is not None
            bar.update(len(batch))
            bar.set_postfix(failed=failed)
    finally:
        writer.close()
        bar.close()


def _print_first_prompt(plan_: EvalPlan, sample: Sample) -> None:
    """``eval --print-prompt``: the exact prompt of ``sample`` (the first query to run) as ``infer --print-prompt``
    prints it (:func:`grounding_rl.eval.infer.format_prompt`: special tokens and Qwen3-VL's timestamps shown, video
    tokens collapsed to a count); pass 1's with ``zoom`` or ``max_turns``. Its clip is decoded once more for it."""
    from grounding_rl.data.video import VideoLoadError, sample_frames
    from grounding_rl.eval.infer import format_prompt

    config = plan_.config
    try:
        video = sample_frames(sample.video, config.video)
    except VideoLoadError as err:
        print(f"eval: no prompt to print for qid {sample.qid}: {str(err).splitlines()[0]}")
        return
    prompt = format_prompt(load_processor(plan_.request.model), video, sample.query, config.prompt_template,
                           config.video_layout)
    print(f"eval: prompt for qid {sample.qid} ({sample.query!r}):\n{prompt}")


# ------------------------------------------------------------------------------------------------------ report
def report(plan_: EvalPlan, result: RunResult, num_processes: int = 1) -> dict:
    """Merge the prediction files and write ``metrics.json``, ``report.md``, ``report.html`` and ``iou_hist.png`` (rank 0
    only).

    Returns:
        the ``metrics.json`` object.

    Raises:
        UserError: more than ``max_missing_fraction`` of the videos were missing or unreadable (the files are written
            first, counting them as IoU 0).
    """
    from grounding_rl.eval import report as files
    from grounding_rl.eval.gallery import write_report_html

    request, config = plan_.request, plan_.config
    outdir = Path(request.out)
    records = merge_predictions(outdir, plan_.samples)
    scorings = tuple(request.scorings) + (plan_.benchmark.scorings if plan_.benchmark else ())
    if all(s.source == "qvhighlights" for s in plan_.samples):
        scorings += ("qvhighlights",)
    metrics = metrics_from_records(records, config.prompt_template, plan_.dropped, scorings)
    metrics["missing_videos"] = len(plan_.absent)
    metrics["missing_predictions"] = sum(1 for r in records if not has_prediction(r))
    if request.zoom is not None:
        metrics["zoom"] = zoom_summary(records, config.prompt_template, plan_.dropped)
    if request.max_turns:
        metrics["turns"] = turns_summary(records)
    info = _run_info(plan_, result, num_processes)
    payload = files.write_metrics_json(outdir / METRICS, metrics, info)
    # the headline's IoUs (standard scoring; a dropped annotation counts as 0), not the records' clamped ``iou``
    hist_ious = standard_ious(records) + [0.0] * metrics.get("dropped_annotations", 0)
    files.plot_iou_hist(hist_ious, outdir / HISTOGRAM, failures=metrics["missing_predictions"], metrics=metrics)
    anchors_md = None
    if plan_.benchmark is not None and plan_.benchmark.anchors:
        anchors_md = anchors_table(plan_.benchmark.anchors, ours=metrics,
                                   ours_label=Path(plan_.model_id).name or "this run")
    files.write_report_md(outdir / REPORT, metrics, info, anchors_md=anchors_md, hist_name=HISTOGRAM,
                          sets_md=files.set_examples_table(records))
    write_report_html(outdir / REPORT_HTML, metrics, info, records, outdir / HISTOGRAM, config.video)
    _print_summary(plan_, metrics)
    unreadable = sorted({r.get("video") or r["qid"] for r in records if r.get("error")})
    check_fraction(unreadable, plan_.num_videos, request.max_missing_fraction,
                   f"{request.data}: missing or unreadable", f"metrics in {outdir / METRICS} count them as IoU 0")
    return payload


def _run_info(plan_: EvalPlan, result: RunResult, num_processes: int) -> dict:
    """What ``metrics.json`` and ``report.md`` say about the run beside the metrics: model, data, sampling settings,
    seed, processes and throughput."""
    request, config = plan_.request, plan_.config
    wall = round(result.wall_time_s, 3)
    return {"model": plan_.model_id, "data": plan_.run["data"],
            "benchmark": plan_.benchmark.name if plan_.benchmark else None, "limit": request.limit,
            "sampling": {"source": plan_.source, "prompt_template": config.prompt_template,
                         "video_layout": config.video_layout, "video": config.video.to_dict(),
                         "max_new_tokens": plan_.max_new_tokens, "do_sample": request.temperature is not None,
                         **({"temperature": request.temperature} if request.temperature is not None else {}),
                         "repetition_penalty": 1.0,
                         "batch_size": request.batch_size, "dtype": request.dtype,
                         **({"zoom": asdict(request.zoom)} if request.zoom is not None else {}),
                         **({"max_turns": request.max_turns} if request.max_turns else {})},
            "seed": request.seed, "num_processes": num_processes,
            "run": {"queries_run": result.queries_run, "videos_run": result.videos_run, "wall_time_s": wall,
                    "queries_per_second": round(result.queries_run / wall, 4) if wall > 0 and result.queries_run
                    else None}}


def _print_summary(plan_: EvalPlan, metrics: dict) -> None:
    """The end of :func:`report` on stdout: the metrics table, failures, the zoom's and crop tool's summaries and
    the files written."""
    request, outdir = plan_.request, Path(plan_.request.out)
    print(format_metrics_table(metrics))
    print(f"eval: {metrics['n']} queries; {metrics['video_load_failures']} failed clips (IoU 0; "
          f"{len(plan_.absent)} of {plan_.num_videos} videos missing), {metrics['missing_predictions']} without a "
          "parsed prediction (IoU 0)")
    if request.zoom is not None:
        z = metrics["zoom"]
        print(f"eval: zoom: pass 1 mIoU {z['pass1']['mIoU']:.2f}, R1@0.5 {z['pass1']['R1@0.5']:.2f}; ground truth "
              f"inside the window for {z['window_recall']}% of {z['queries']} queries; {z['fallbacks']} fallback "
              f"window(s), {z['window_errors']} window(s) not sampled")
    if request.max_turns:
        t = metrics["turns"]
        print(f"eval: crop tool: {t['turns_mean']} model turns and {t['call_frequency']} crop requests per query "
              f"({t['failure_frequency']} of them refused); " + ("no window was sampled" if t["coverage"] is None
              else f"ground truth coverage of the last window {t['coverage']}"))
    print(f"eval: wrote {outdir / PREDICTIONS}, {outdir / METRICS}, {outdir / REPORT}, {outdir / REPORT_HTML}, "
          f"{outdir / HISTOGRAM}")


def evaluate(request: EvalRequest) -> dict | None:
    """:func:`plan` → :func:`run` → :func:`report`, on every process of the run (``accelerate launch`` /
    ``torchrun`` shard the queries by video).

    Returns:
        on the main process, the ``metrics.json`` object; None on the other ranks.

    Raises:
        UserError, AnnotationError: see :func:`plan`, :func:`run` and :func:`report`; also another process holding
            ``request.out`` (:func:`grounding_rl.eval.lock.lock_output_dir`).
    """
    from accelerate import PartialState

    request.check()
    # Ranks wait for the slowest shard at the final barrier: a long timeout instead of NCCL's 10 minutes.
    state = PartialState(cpu=not torch.cuda.is_available(), timeout=datetime.timedelta(hours=BARRIER_TIMEOUT_H))
    if request.device is not None and state.num_processes > 1:
        raise UserError(f"--device {request.device} is for a one-process eval; under accelerate launch / torchrun "
                        f"each of the {state.num_processes} processes uses its own device: drop --device")
    plan_ = plan(request, state.is_main_process)
    # one run at a time in OUTDIR: the main process holds its lock from before its first write to the report's end
    lock = lock_output_dir(request.out) if state.is_main_process else None
    try:
        result = run(plan_, state)
        if not state.is_main_process:
            return None
        return report(plan_, result, state.num_processes)
    finally:
        if lock is not None:
            lock.close()
