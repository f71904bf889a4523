"""Every sample of a training file scored with a model, for difficulty-aware GRPO (:func:`score_difficulty`, what
``grounding-rl difficulty`` runs, :mod:`grounding_rl.cli.difficulty`).

The greedy evaluation is ``grounding-rl eval`` itself (:func:`grounding_rl.eval.evaluate.evaluate`: queries grouped
by video, background decoding, multi-process under ``accelerate launch`` / ``torchrun``, a progress bar, resumable),
run into a work folder (default ``D_scored.jsonl.eval/``: ``predictions.jsonl``, ``metrics.json``, ``report.md`` and
``iou_hist.png``, the histogram of the scores). Then every line of ``--data`` is written to ``--out`` as it was, plus

    "difficulty": {"iou": IoU of the greedy answer (the iou reward's clamped rule), "reward": its weighted reward,
                   "pred": [start, end] in seconds or null, "answer": the raw text,
                   "timelens_iou": the IoU TimeLens's own filter gives it (its parser, the raw span)}

(lines the evaluation policy drops stay unscored and are counted), and ``D_scored.json`` beside it records the model,
its fingerprint, the data file and its hash, prompt and video settings, generation budget, reward functions and
weights, and the counts. This is TimeLens's offline scoring (its
``training/filter/infer_qwen3_vl_tvg_dataloader_filter_data.py`` writes ``iou`` and ``pred`` per annotation) and
Time-R1's (``src/vllm_inference/calc_difficulty.py``, IoU in percent); GRPO reads the field with
``difficulty_sampling`` / ``difficulty_range`` (:mod:`grounding_rl.data.selection`).
"""
from __future__ import annotations

import datetime
import os
from pathlib import Path

from grounding_rl.data.selection import FIELD
from grounding_rl.errors import UserError
from grounding_rl.jsonl_files import JsonLines, write_jsonl_atomic
from grounding_rl.reward.scorings.timelens import timelens_filter_iou
from grounding_rl.run_record import read_record, write_record

DEFAULT_REWARD_FUNCS = ("iou", "format")  # GroundingGRPOConfig's default, for a checkpoint that records none


def score_record(record: dict, reward_funcs, weights, prompt_template: str) -> dict:
    """The ``difficulty`` object of one prediction record: ``{"iou", "reward", "pred", "answer", "timelens_iou"}``
    (``timelens_iou``: :func:`grounding_rl.reward.scorings.timelens.timelens_filter_iou` of the raw answer against the
    annotation's first span as written, what ``difficulty_sampling: timelens`` draws by); ``reward`` is
    ``sum_k weights[k] · f_k(answer)`` with the training columns (ground truth clamped into the clip, seconds), an
    empty answer for a failed clip, and a function's None counted as 0 (TRL's ``nansum``)."""
    answer = record.get("answer") or ""
    columns = {"start": [record["gt_start"]], "end": [record["gt_end"]], "duration": [record["duration"]],
               "query": [record["query"]], "qid": [record["qid"]], "prompt_template": [prompt_template]}
    reward = 0.0
    for func, weight in zip(reward_funcs, weights):
        value = func(completions=[answer], **columns)[0]
        reward += 0.0 if value is None else float(weight) * float(value)
    pred = None if record.get("start") is None or record.get("end") is None else [record["start"], record["end"]]
    first = (record["gt_spans"][0] if record.get("gt_spans")
             else (record.get("gt_raw_start", record["gt_start"]), record.get("gt_raw_end", record["gt_end"])))
    return {"iou": float(record["iou"]), "reward": reward, "pred": pred, "answer": answer,
            "timelens_iou": timelens_filter_iou(answer, first, float(record["duration"]))}


def write_scored(data: str | os.PathLike, out: str | os.PathLike, scores: dict[str, dict],
                 video_root: str | os.PathLike | None = None) -> dict[str, int]:
    """Copy ``data`` to ``out`` line by line, adding ``difficulty`` to each line whose qid (its ``qid``, else its
    0-based line number) is in ``scores``; atomic (temporary file, then ``os.replace``). A relative ``video`` is
    rewritten relative to ``out``'s folder (it was relative to ``video_root``, else to ``data``'s folder), so the
    scored file finds the same videos wherever it is written.

    Returns:
        ``{"lines", "scored", "unscored"}``.
    """
    out = Path(out).resolve()
    base = os.path.abspath(video_root) if video_root is not None else os.path.dirname(os.path.abspath(data))
    counts = {"lines": 0, "scored": 0, "unscored": 0}

    def rows():
        for number, row in JsonLines(data):
            if isinstance(row.get("video"), str) and not os.path.isabs(row["video"]):
                row["video"] = os.path.relpath(os.path.join(base, row["video"]), out.parent)
            qid = str(row["qid"]) if row.get("qid") is not None else str(number - 1)
            counts["lines"] += 1
            if qid in scores:
                row[FIELD] = scores[qid]
                counts["scored"] += 1
            else:
                row.pop(FIELD, None)  # a score from another model must not survive
                counts["unscored"] += 1
            yield row

    write_jsonl_atomic(out, rows())
    return counts


def sidecar_of(out: Path) -> Path:
    """``D_scored.json`` for ``D_scored.jsonl`` (``X.meta.json`` when the output itself ends in ``.json``)."""
    return out.with_suffix(".json") if out.suffix != ".json" else out.with_name(out.stem + ".meta.json")


def rollout_spans(record: dict) -> list[list[float]]:
    """A prediction record's answer as an interval set ``[[s, e], ...]`` (seconds): its ``pred_spans`` when the
    template asks for sets, else ``[[start, end]]``; ``[]`` when nothing parsed."""
    if record.get("pred_spans"):
        return [[float(a), float(b)] for a, b in record["pred_spans"]]
    if record.get("start") is None or record.get("end") is None:
        return []
    return [[float(record["start"]), float(record["end"])]]


def rollouts_score(records: list[dict], reward_funcs, weights, prompt_template: str) -> dict:
    """The ``difficulty`` object of one sample's K sampled answers (one prediction record each, rollout order):
    ``{"iou", "reward"}`` their means, ``rollout_intervals`` (K interval sets, :func:`rollout_spans`),
    ``rollout_rewards`` and ``rollout_ious`` (K each, :func:`score_record`'s rules) — what ``difficulty_sampling:
    dispersion`` reads, in the shape of TimeLens2's rollout files."""
    scored = [score_record(r, reward_funcs, weights, prompt_template) for r in records]
    k = len(scored)
    return {"iou": sum(s["iou"] for s in scored) / k, "reward": sum(s["reward"] for s in scored) / k,
            "rollout_intervals": [rollout_spans(r) for r in records],
            "rollout_rewards": [s["reward"] for s in scored], "rollout_ious": [s["iou"] for s in scored]}


def score_difficulty(request, out: str | os.PathLike, reward_funcs: list[str] | None = None,
                     reward_weights: list[float] | None = None, work_dir: str | os.PathLike | None = None,
                     num_rollouts: int = 0, temperature: float = 1.0) -> dict | None:
    """Evaluate ``request`` (an :class:`grounding_rl.eval.evaluate.EvalRequest`; its ``out`` is ignored) into
    ``work_dir`` (default ``OUT.eval``), then write the scored copy of ``request.data`` to ``out`` and its sidecar
    (:func:`sidecar_of`).

    Args:
        request: what to evaluate (model, data, preprocessing, …).
        out: the scored JSONL to write.
        reward_funcs: reward registry names (or ``module:function``) for the ``reward`` score; default the
            checkpoint's ``grounding_config.json``, else :data:`DEFAULT_REWARD_FUNCS`.
        reward_weights: their weights; default the checkpoint's (with its functions), else 1.0 each.
        work_dir: the evaluation's folder (resumable).
        num_rollouts: 0 = one greedy answer per sample; K > 0 = K sampled answers at ``temperature``, each pass an
            evaluation of its own (``work_dir/rollout_k``, seed ``request.seed + k``; resumable and multi-process as
            the greedy one, and as exactly: each query is sampled alone from
            :func:`grounding_rl.rollout.greedy.query_seed` of the pass's seed and its qid, so an interrupted and
            resumed pass, or one on several processes, writes the same bytes as an uninterrupted one), scored by
            :func:`rollouts_score` (TimeLens2's off-policy rollouts, its
            ``grpo/timelens/rollout.py``: 8 at temperature 1.0, top_p 1.0).
        temperature: the sampling temperature of the rollouts (> 0).

    Returns:
        on the main process the sidecar object (counts, mean IoU, model, settings); None on other ranks.

    Raises:
        UserError: ``out`` is the data file, an unknown reward function, weights that do not match the functions, and
            what :func:`grounding_rl.eval.evaluate.evaluate` raises.
    """
    out = Path(out)
    if out.resolve() == Path(request.data).resolve():
        raise UserError(f"--out {out}: give another file than --data (the scores are written beside the data)")
    names, weights, funcs = _rewards(request, reward_funcs, reward_weights)
    work = Path(work_dir) if work_dir else out.with_name(out.name + ".eval")
    if num_rollouts < 0:
        raise UserError(f"--num-rollouts must be ≥ 0 (got {num_rollouts})")
    scored = _scores(request, work, funcs, weights, num_rollouts, temperature)
    if scored is None:  # another rank: rank 0 writes the files
        return None
    scores, run = scored
    template = run["prompt_template"]
    counts = write_scored(request.data, out, scores, request.video_root)
    ious = [s["iou"] for s in scores.values()]
    sidecar = {
        "scored_file": str(out.resolve()), "data": run["data"], "data_sha256": run["data_sha256"],
        "model": run["model"], "model_fingerprint": run["model_fingerprint"], "prompt_template": template,
        "video": run["video"], "max_new_tokens": run["max_new_tokens"],
        "decoding": "greedy" if not num_rollouts else {"num_rollouts": num_rollouts, "temperature": temperature,
                                                       "top_p": 1.0, "seeds": [request.seed + k
                                                                               for k in range(num_rollouts)],
                                                       "seeding": "per query: query_seed(seed of the pass, qid)"},
        "dtype": run["dtype"], "seed": request.seed, "limit": request.limit, "reward_funcs": names,
        "reward_weights": list(weights), "iou_rule": "clamped (the iou reward's)", "work_dir": str(work.resolve()),
        "counts": counts, "mean_iou": sum(ious) / len(ious) if ious else None,
        "version": run["version"],
        "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    write_record(sidecar_of(out), sidecar)
    return sidecar


def _rewards(request, reward_funcs, reward_weights) -> tuple[list[str], list[float], list]:
    """``(names, weights, functions)`` of the ``reward`` score (:func:`score_difficulty`'s defaults). Raises
    UserError for an unknown function or weights that do not match the functions."""
    from grounding_rl.eval.settings import resolve_config
    from grounding_rl.reward.rewards import get_reward_funcs

    try:
        config, _ = resolve_config(request.model, request.overrides)
    except ValueError as err:
        raise UserError(f"{request.model}: {err}") from None
    names = list(reward_funcs or config.reward_funcs or DEFAULT_REWARD_FUNCS)
    weights = reward_weights or (config.reward_weights if not reward_funcs and config.reward_funcs
                                 else None) or [1.0] * len(names)
    if len(weights) != len(names):
        raise UserError(f"--reward-weights has {len(weights)} values for {len(names)} reward functions {names}")
    try:
        funcs = get_reward_funcs(names)
    except ValueError as err:
        raise UserError(f"--reward-funcs: {err}") from None
    return names, weights, funcs


def _scores(request, work: Path, funcs, weights, num_rollouts: int, temperature: float):
    """:func:`score_difficulty`'s evaluation into ``work`` (one greedy pass, or ``num_rollouts`` sampled passes) and
    each query's scores: ``({qid: score}, the run record)``; None on the other ranks."""
    import dataclasses

    from grounding_rl.eval.evaluate import PREDICTIONS, RUN_FILE, evaluate, read_predictions

    if not num_rollouts:
        if evaluate(dataclasses.replace(request, out=str(work))) is None:
            return None
        records, _ = read_predictions(work / PREDICTIONS)
        run = read_record(work / RUN_FILE)
        return {str(r["qid"]): score_record(r, funcs, weights, run["prompt_template"]) for r in records}, run
    passes = []
    for k in range(num_rollouts):
        folder = work / f"rollout_{k}"
        if evaluate(dataclasses.replace(request, out=str(folder), seed=request.seed + k,
                                        temperature=temperature)) is not None:
            passes.append(read_predictions(folder / PREDICTIONS)[0])
    if not passes:
        return None
    run = read_record(work / "rollout_0" / RUN_FILE)
    by_qid = [{str(r["qid"]): r for r in records} for records in passes]
    common = [qid for qid in by_qid[0] if all(qid in p for p in by_qid)]
    return {qid: rollouts_score([p[qid] for p in by_qid], funcs, weights, run["prompt_template"])
            for qid in common}, run
