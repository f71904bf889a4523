"""Zoom: look at the whole video, then again at the part the model picked (``eval --zoom``, ``infer --zoom``).

At a fixed frame budget an hour is seen once every several seconds, and ExtremeWhenBench attributes most long-video
failures to search: the moment is never looked at closely; retrieving a window first and grounding in it is what
TimeLens2 and Zoom-Zero do. Two greedy passes per query:

1. **pass 1** over the whole video at the budget (the single-pass evaluation's own answer);
2. its answer [s, e] widened by a margin is the **window** (:func:`zoom_window`): [s − m, e + m] with
   m = max(``margin`` · (e − s), 2 / f₁) — the margin scales with the answer, and is never below one temporal patch
   (two frames) of pass 1 at its rate f₁, the resolution pass 1 answers at. We use the model's own greedy answer, not
   a merge of top-k sampled answers: one generation, deterministic, the same answer single-pass evaluation scores (so
   pass 1 *is* the single-pass result) and no seed or k to choose. An answer that does not parse gives the
   **fallback** window, the centre half [d/4, 3d/4] (``zoom_fallback: true``);
3. **pass 2** samples the window (:func:`grounding_rl.data.video.sample_window`, decoded by seeking) under the same
   budget — what pass 1 spent, T₁ frames of H₁ × W₁ — spent on frame rate (``spend="fps"``: T₁ frames over the
   window, the default) or on resolution (``spend="resolution"``: pass 1's rate, so fewer frames, each up to
   T₁·H₁·W₁ / T₂ pixels) (:func:`window_settings`), and the model answers again;
4. the answer is mapped to the video's absolute time (:func:`to_absolute`).

Default ``fps``, although Zoom-Zero spends the zoom on resolution: an answer's boundaries cannot be finer than the
frame period it was made at, and the failure the zoom addresses is temporal (the event falls between frames seen
every few seconds); resolution helps recognising small things, which a temporal grounding checkpoint trained at one
frame size also sees out of distribution.

Time in pass 2 (``time``). Qwen3-VL reads time as text: the window's frames carry their true absolute timestamps
``<t seconds>`` and its answer is absolute. Qwen2.5-VL's time is positional (3D RoPE, ``second_per_grid_ts``), which
transformers starts at the window's first frame: ``time="window"`` (its default) keeps that and adds the window's
first frame time t₀ to the answer; ``time="video"`` shifts the window's temporal position ids so they start where t₀
sits in the whole video (``round(t₀ · tokens_per_second)``, :func:`video_time_offsets`), and the answer is taken as
absolute. ``window`` is the default because every clip a Qwen2.5-VL checkpoint is trained and evaluated on starts at
temporal position 0, so it reads time from the clip's first frame (a window is then a trimmed clip); measured on the
long demo's checkpoint, with ``video`` positions it still answered window-relative times ("10.00 to 11.00" for a
window at 104-117 s): 30 of 50 final answers inside the window against 39 with ``window``, mIoU 0.98 against 1.48
(docs/BENCHMARKS.md, "Zoom on the long demo").

The window, its time and pass 2 are :mod:`grounding_rl.rollout.zoom`'s (shared with training's two-pass zoom).
"""
from __future__ import annotations

from grounding_rl.errors import UserError
from grounding_rl.rollout.zoom import ZoomSettings, window_problems


def check_run(zoom: ZoomSettings, model: str, engine: str, sampler: str, prompt_template: str) -> None:
    """Raises UserError (one line) when ``zoom`` cannot run with the checkpoint ``model`` (its family, see
    :meth:`ZoomSettings.check_family`), the ``engine``, the video ``sampler`` (windows are sampled exactly) or a
    ``prompt_template`` that asks for a set of intervals (the window is one answer's)."""
    from grounding_rl.eval.settings import checkpoint_family

    family = checkpoint_family(model)
    if family is not None:
        zoom.check_family(family, engine)
    for problem in window_problems("--zoom", sampler, prompt_template, "the zoom looks again at one"):
        raise UserError(problem)


def zoom_record(record: dict, zoom: dict | None, sample) -> dict:
    """A pass-1 ``predictions.jsonl`` record turned into the zoom record: ``answer``, ``start``, ``end``, ``iou``
    and ``sampling`` become pass 2's (absolute seconds), pass 1's are kept under ``pass1`` (``{"answer", "start",
    "end", "iou", "sampling"}``), plus ``zoom_window`` [a, b] seconds, ``zoom_fallback`` (pass 1 gave no parseable
    answer: the window is :data:`FALLBACK_WINDOW`) and, when the window could not be sampled, ``zoom_error`` (the
    final answer is then pass 1's). A record without ``zoom`` (its clip did not load) is returned unchanged.
    ``sample`` gives the ground truth for the IoU (:func:`grounding_rl.reward.rewards.query_iou`)."""
    from grounding_rl.prompts.parsing import extract_think
    from grounding_rl.reward.rewards import query_iou

    if zoom is None:
        return record
    out = dict(record)
    out["pass1"] = {k: record.get(k) for k in ("answer", "start", "end", "iou", "sampling")}
    out["zoom_window"], out["zoom_fallback"] = zoom["window"], zoom["fallback"]
    if zoom["error"] is not None:
        out["zoom_error"] = zoom["error"]
        return out
    interval = zoom["interval"]
    out.update(answer=zoom["answer"], reasoning=extract_think(zoom["answer"]),
               start=None if interval is None else round(interval[0], 6),
               end=None if interval is None else round(interval[1], 6),
               iou=query_iou(interval, (sample.start, sample.end), sample.duration), sampling=zoom["sampling"])
    return out


def zoom_summary(records: list[dict], prompt_template: str = "default", dropped_annotations: int = 0) -> dict:
    """What the zoom did over a run's records (``metrics.json`` ``zoom``): ``{"queries", "fallbacks",
    "window_errors", "window_recall", "pass1": {"R1@0.3", "R1@0.5", "R1@0.7", "mIoU"}}`` — queries with a zoom,
    those whose window was the fallback, those whose window could not be sampled, the percentage of queries whose
    ground truth lies wholly inside the window (the most pass 2 can find), and pass 1's metrics (the single-pass
    answers, ``standard`` scoring) over the same records."""
    from grounding_rl.reward.records import metrics_from_records

    zoomed = [r for r in records if "zoom_window" in r]
    first = [{**r, **{k: r["pass1"][k] for k in ("answer", "start", "end")}} if "pass1" in r else r for r in records]
    pass1 = metrics_from_records(first, prompt_template, dropped_annotations)
    inside = sum(1 for r in zoomed if r["zoom_window"][0] <= r["gt_start"] and r["gt_end"] <= r["zoom_window"][1])
    return {"queries": len(zoomed), "fallbacks": sum(1 for r in zoomed if r["zoom_fallback"]),
            "window_errors": sum(1 for r in zoomed if r.get("zoom_error")),
            "window_recall": round(100.0 * inside / len(zoomed), 2) if zoomed else None,
            "pass1": {k: pass1[k] for k in ("R1@0.3", "R1@0.5", "R1@0.7", "mIoU")}}
