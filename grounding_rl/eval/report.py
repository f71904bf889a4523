"""Evaluation reports and pictures: ``metrics.json``, ``report.md``, ``iou_hist.png`` and the
``grounding-rl infer --plot`` timeline. Plots use matplotlib's Agg backend (no display needed).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
import textwrap
from importlib import metadata
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from grounding_rl.paths import follow_umask
from grounding_rl.reward.metrics import format_metrics_table, scoring_sources, scoring_table

# Distributions whose versions every metrics.json records, plus a few that change results.
VERSION_PACKAGES = ("torch", "transformers", "trl", "qwen-vl-utils", "decord", "accelerate", "grounding-rl")
THRESHOLDS = (0.3, 0.5, 0.7)


def package_versions(packages: Sequence[str] = VERSION_PACKAGES) -> dict[str, str | None]:
    """``{distribution name: version}`` from the installed metadata; None for one that is not installed."""
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        follow_umask(tmp)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.filename is None:  # a failed write names no file: name the one meant
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise


def write_metrics_json(path: str | Path, metrics: Mapping, info: Mapping) -> dict:
    """Write ``metrics.json``: the metric names at the top level, then ``info`` (model, data, sampling, seed, ...),
    ``versions`` (:func:`package_versions`) and ``created`` (UTC, ISO 8601). Returns the written object."""
    payload = {**metrics, **info, "versions": package_versions(),
               "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    _atomic_write_text(Path(path), json.dumps(payload, indent=2) + "\n")
    return payload


SET_EXAMPLES = 5  # set-scored queries listed in report.md


def set_examples_table(records: Sequence[Mapping], limit: int = SET_EXAMPLES) -> str | None:
    """A markdown table of the first ``limit`` set-scored prediction records (``gt_spans``): qid, ground-truth spans,
    predicted spans and set IoU; None when no record is set-scored."""
    rows = [r for r in records if r.get("gt_spans") is not None][:limit]
    if not rows:
        return None

    def spans(value) -> str:
        return "none" if not value else ", ".join(f"{float(s):.1f}–{float(e):.1f}" for s, e in value)

    lines = ["| qid | ground truth (s) | prediction (s) | set IoU |", "|---|---|---|---:|"]
    lines += [f"| {r['qid']} | {spans(r['gt_spans'])} | {spans(r.get('pred_spans'))} | {float(r['iou']):.3f} |"
              for r in rows]
    return "\n".join(lines)


def _scoring_notes(metrics: Mapping) -> list[str]:
    """report.md's lines under the headline for a ``metrics_by_scoring`` output: every scoring side by side, what
    each means, their sources, and the interval-set scorings when present."""
    lines = ["", f"The headline numbers above use the `{metrics.get('scoring')}` scoring. Every scoring side by "
             "side, each with its own n:", "",
             scoring_table(metrics), "",
             "`standard`: the published evaluators' shared rule (TimeZero, VideoChat-R1, TimeLens: IoU ≥ m) in "
             "exact arithmetic — ground truth as annotated, prediction as parsed. `clamped`: ours, the training "
             "reward's rule — both clamped into [0, duration]. Other rows reproduce one evaluator each, its "
             "parser, denominator and float comparisons included. Sources:", "", scoring_sources(metrics)]
    extra = [name for name in metrics["by_scoring"] if name in ("set", "qvhighlights")]
    if "precision" in metrics or extra:
        lines += ["", "Interval sets: a query with several ground-truth spans (or every query of a template that "
                  "asks for a set) is scored by the IoU of the merged predicted set with the merged ground-truth "
                  "set; `precision` = |pred ∩ gt| / |pred| and `recall` = |pred ∩ gt| / |gt| (clamped, mean "
                  "over all queries, percent)."
                  + (" `set`: the same against every span a TimeLens-Bench entry lists (`spans_all`)."
                     if "set" in extra else "")
                  + (" `qvhighlights`: moment_detr's metric — R1@m of the first predicted window against the "
                     "ground-truth window it overlaps most; mAP@0.5, mAP@0.75 and mAP (IoU 0.5:0.05:0.95) of up "
                     "to 10 windows ranked by their score, else in written order (windows as annotated and as "
                     "written: not merged, not clamped)." if "qvhighlights" in extra else "")]
    return lines


def write_report_md(path: str | Path, metrics: Mapping, info: Mapping, anchors_md: str | None = None,
                    hist_name: str | None = "iou_hist.png", sets_md: str | None = None) -> str:
    """Write ``report.md``: title, the metrics table, run details, the anchors table when known, the histogram.

    Args:
        path: output file.
        metrics: ``metrics_by_scoring`` output (headline scoring at the top level, ``by_scoring``) or a plain
            ``compute_metrics`` output (percentages), plus extra counts.
        info: run details (``model``, ``data``, ``sampling``, ``seed``, ``benchmark``...).
        anchors_md: a markdown table of published results (see ``benchmarks.anchors_table``), or None.
        hist_name: file name of the IoU histogram next to the report, or None.
        sets_md: a table of set-scored queries (:func:`set_examples_table`), or None.

    Returns:
        the markdown text.
    """
    sampling = info.get("sampling", {})
    lines = [f"# Evaluation: {Path(str(info.get('model', '?'))).name or info.get('model')}", "",
             format_metrics_table(metrics), "",
             "R1@m: percent of queries with IoU ≥ m (exact ties count); mIoU: mean IoU in percent. Every query "
             "counts: an unparseable answer or a clip that failed to load is IoU 0."]
    if "by_scoring" in metrics:
        lines += _scoring_notes(metrics)
    lines += ["",
             "## Run", "",
             f"- model: `{info.get('model')}`",
             f"- data: `{info.get('data')}`" + (f" (benchmark `{info['benchmark']}`)" if info.get("benchmark") else ""),
             f"- settings from: {sampling.get('source', '?')}",
             f"- prompt template: `{sampling.get('prompt_template')}`; video: `{json.dumps(sampling.get('video'))}`",
             f"- decoding: greedy, max_new_tokens {sampling.get('max_new_tokens')}, batch size "
             f"{sampling.get('batch_size')}, {info.get('num_processes', 1)} process(es); seed {info.get('seed')}",
             f"- video load failures: {metrics.get('video_load_failures', 0)} (IoU 0; of them "
             f"{metrics.get('missing_videos', 0)} missing videos); queries without a parsed prediction: "
             f"{metrics.get('missing_predictions', 0)}"]
    if sets_md:
        lines += ["", "## Interval sets (first queries)", "", sets_md]
    if anchors_md:
        lines += ["", "## Published results (anchors)", "",
                  "Published numbers come from the cited sources; their protocols (checkpoint, prompt, frames, "
                  "pixel budget) may differ from this run's.", "", anchors_md]
    if hist_name:
        lines += ["", "## IoU distribution", "", f"![IoU histogram]({hist_name})"]
    text = "\n".join(lines) + "\n"
    _atomic_write_text(Path(path), text)
    return text


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def hist_bins(n: int, most: int = 20) -> np.ndarray:
    """Edges of the IoU histogram's equal bins over [0, 1]: ``most`` bins (width 0.05), but no more bins than queries
    ``n`` (at least one), so a small run is not drawn as a comb of one-query bars."""
    return np.linspace(0.0, 1.0, min(most, max(1, n)) + 1)


def plot_iou_hist(ious: Sequence[float], path: str | Path, *, failures: int = 0, title: str | None = None,
                  metrics: Mapping | None = None) -> Path:
    """Histogram of per-query IoU over [0, 1] in :func:`hist_bins` bins (20, fewer for fewer queries; empty bins drawn
    as nothing), with the R1 thresholds marked.

    Args:
        ious: one IoU per query (failures included, as 0).
        path: output PNG.
        failures: how many of the IoU-0 queries had no usable prediction (unparsed answer or unreadable clip);
            drawn as a separate, hatched part of the first bar.
        title: figure title (default: n and mIoU).
        metrics: the headline metrics the IoUs come from (``metrics.json``'s top level, with ``scoring``): the
            R1@m labels and the title's mIoU are then its exact figures, so the picture and the report agree;
            without it they are computed from ``ious``.

    Returns:
        the PNG path.
    """
    plt = _pyplot()
    values = np.asarray(list(ious), dtype=float)
    bins = hist_bins(values.size)
    counts, _ = np.histogram(values, bins=bins)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    width = bins[1] - bins[0]
    drawn = counts > 0
    ax.bar(bins[:-1][drawn], counts[drawn], width=width, align="edge", color="#4C72B0", edgecolor="white",
           label="queries")
    if failures:
        ax.bar([0.0], [failures], width=width, align="edge", color="#DD8452", edgecolor="white", hatch="//",
               label=f"no prediction ({failures})")
    for m in THRESHOLDS:
        share = 100.0 * float((values >= m).mean()) if values.size else 0.0
        if metrics is not None and metrics.get(f"R1@{m}") is not None:
            share = float(metrics[f"R1@{m}"])
        ax.axvline(m, color="0.3", linestyle="--", linewidth=1)
        ax.text(m + 0.005, 0.97, f"R1@{m}\n{share:.1f}%", transform=ax.get_xaxis_transform(), va="top", fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_xlabel("temporal IoU (prediction vs ground truth)")
    ax.set_ylabel("queries")
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts of queries: no 1.25
    miou = 100.0 * float(values.mean()) if values.size else 0.0
    scoring = ""
    if metrics is not None and metrics.get("mIoU") is not None:
        miou = float(metrics["mIoU"])
        scoring = f" ({metrics['scoring']} scoring)" if metrics.get("scoring") else ""
    ax.set_title(title or f"IoU distribution{scoring}: n = {values.size}, mIoU = {miou:.2f}")
    ax.legend(loc="upper right", fontsize=8, bbox_to_anchor=(1.0, 0.8))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _predicted_spans(result: Mapping) -> list[tuple[float, float]]:
    """The predicted spans of one ``infer`` result: its ``spans`` (a set answer), else ``(start, end)``, else none."""
    if result.get("spans"):
        return [(float(s), float(e)) for s, e in result["spans"]]
    if result.get("start") is not None and result.get("end") is not None:
        return [(float(result["start"]), float(result["end"]))]
    return []


_COLORS = ("#1f77b4", "#d62728", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#bcbd22")


def plot_path(path: str | Path, flag: str = "--plot") -> Path:
    """The file a picture named ``path`` is written to: ``path`` itself when its extension is a format matplotlib
    writes (``FigureCanvasBase.get_supported_filetypes``: png, pdf, svg, jpg, …), ``path`` + ``.png`` when it has
    none (matplotlib's default format).

    Raises:
        UserError: an extension matplotlib cannot write, naming ``flag`` and the formats it can.
    """
    from matplotlib.backend_bases import FigureCanvasBase

    from grounding_rl.errors import UserError

    path = Path(path)
    suffix = path.suffix.lstrip(".").lower()
    if not suffix:
        return path.with_name(path.name + ".png")
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix not in formats:
        raise UserError(f"{flag} {path}: matplotlib writes no .{suffix} files; use one of "
                        f"{', '.join('.' + f for f in sorted(formats))}")
    return path


def plot_timeline(video, results: Sequence[Mapping], path: str | Path, *, gts: Sequence[Sequence[float]] | None = None,
                  max_frames: int = 10, title: str | None = None) -> Path:
    """A timeline picture for ``grounding-rl infer --plot``.

    Top: a strip of up to ``max_frames`` of the frames the model saw, each placed in its own slot of the time axis and
    labelled with its timestamp; predicted intervals are shaded over the strip. Below: one lane per query with the
    predicted interval (filled bar, labelled with its times) and the ground truth (green outline) when given.

    Args:
        video: the :class:`~grounding_rl.data.video.SampledVideo` used for generation (frames (T, H, W, 3) uint8,
            ``timestamps`` in seconds, ``duration``).
        results: one mapping per query with ``query``, ``start``, ``end`` (seconds, clamped; None when unparseable)
            and, for a set answer, ``spans`` (``[[s, e], …]``: one bar per span); a zoom result (``infer --zoom``)
            also has ``zoom_window`` [a, b], drawn as a grey band in its lane, and ``pass1`` (its ``start``/``end``),
            drawn as a dashed outline.
        path: output picture (:func:`plot_path`: no extension → ``.png``).
        gts: one (start, end) — or a list of them, a ground-truth set — per query in order, or None.
        max_frames: thumbnails in the strip.
        title: figure title (default: the video file name and duration).

    Returns:
        the PNG path.
    """
    plt = _pyplot()
    from matplotlib.patches import Rectangle

    duration = float(video.duration)
    frames, stamps = video.frames, list(video.timestamps)
    k = max(1, min(max_frames, len(stamps)))
    slot = duration / k
    centers = (np.arange(k) + 0.5) * slot
    picks = [int(np.argmin(np.abs(np.asarray(stamps) - c))) for c in centers]

    h, w = frames.shape[1], frames.shape[2]
    fig_w = 12.0
    strip_h = max(0.9, min(2.4, (fig_w * 0.8 / k) * h / w))  # slot height that keeps the frames' aspect roughly
    lane_h = 0.55
    n = len(results)
    lanes_h = lane_h * max(n, 1) + 0.5
    fig = plt.figure(figsize=(fig_w, strip_h + lanes_h + 1.5), dpi=110, layout="constrained")
    grid = fig.add_gridspec(2, 1, height_ratios=[strip_h + 0.3, lanes_h])
    strip = fig.add_subplot(grid[0])
    lanes = fig.add_subplot(grid[1], sharex=strip)

    for j, i in enumerate(picks):
        strip.imshow(frames[i], extent=(j * slot, (j + 1) * slot, 0, 1), aspect="auto", interpolation="bilinear")
        strip.text((j + 0.5) * slot, -0.03, f"{stamps[i]:.1f}s", ha="center", va="top", fontsize=8)
    for q, result in enumerate(results):
        for s, e in _predicted_spans(result):
            s, e = sorted((s, e))
            strip.axvspan(s, e, color=_COLORS[q % len(_COLORS)], alpha=0.28, linewidth=0)
            strip.axvline(s, color=_COLORS[q % len(_COLORS)], linewidth=1.2)
            strip.axvline(e, color=_COLORS[q % len(_COLORS)], linewidth=1.2)
    strip.set_xlim(0, duration)
    strip.set_ylim(0, 1)
    strip.set_xlabel(" ", fontsize=8)  # room for the timestamp labels under the frames
    strip.set_yticks([])
    strip.tick_params(axis="x", labelbottom=False, bottom=False)
    strip.set_title(title or f"{Path(video.path).name}  ({duration:.2f} s, {video.num_frames} frames at "
                              f"{video.sampled_fps:.2g} fps)", fontsize=10)

    labels = []
    for q, result in enumerate(results):
        y = n - 1 - q
        color = _COLORS[q % len(_COLORS)]
        if result.get("zoom_window") is not None:
            a, b = (float(x) for x in result["zoom_window"])
            lanes.add_patch(Rectangle((a, y - 0.45), b - a, 0.9, color="0.5", alpha=0.22, linewidth=0,
                                      label="zoom window" if q == 0 else None))
            first = result.get("pass1") or {}
            if first.get("start") is not None and first.get("end") is not None:
                lo1, hi1 = sorted((float(first["start"]), float(first["end"])))
                lanes.add_patch(Rectangle((lo1, y - 0.3), max(hi1 - lo1, duration * 0.002), 0.6, fill=False,
                                          edgecolor="0.2", linestyle="--", linewidth=1.2,
                                          label="pass 1" if q == 0 else None))
        if gts is not None and q < len(gts) and gts[q] is not None:
            gt_set = gts[q] if isinstance(gts[q][0], (list, tuple)) else [gts[q]]
            for k, (gs, ge) in enumerate(gt_set):
                gs, ge = float(gs), float(ge)
                lanes.add_patch(Rectangle((gs, y - 0.36), ge - gs, 0.72, fill=False, edgecolor="#2ca02c",
                                          linewidth=2, label="ground truth" if q == 0 and k == 0 else None))
        spans = _predicted_spans(result)
        for k, (s, e) in enumerate(spans):  # one bar per predicted span
            lo, hi = sorted((s, e))
            lanes.add_patch(Rectangle((lo, y - 0.22), max(hi - lo, duration * 0.002), 0.44, color=color, alpha=0.85,
                                      label="prediction" if q == 0 and k == 0 else None))
        if spans:
            hi = max(max(s, e) for s, e in spans)
            text = ", ".join(f"{s:.2f}–{e:.2f}" for s, e in spans) + " s"
            lanes.text(min(hi + duration * 0.01, duration * 0.99), y, text,
                       ha="left" if hi < duration * 0.85 else "right", va="center", fontsize=8)
        else:
            lanes.text(duration / 2, y, "no parseable answer", ha="center", va="center", fontsize=8, color="0.4",
                       style="italic")
        labels.append("\n".join(textwrap.wrap(str(result.get("query", "")), 38)[:2]))
    lanes.set_ylim(-0.6, max(n, 1) - 0.4)
    lanes.set_yticks(list(range(n - 1, -1, -1)))
    lanes.set_yticklabels(labels, fontsize=8)
    for tick, q in zip(lanes.get_yticklabels(), range(n)):
        tick.set_color(_COLORS[q % len(_COLORS)])
    lanes.set_xlabel("time (s)")
    lanes.grid(axis="x", color="0.85", linewidth=0.6)
    lanes.set_axisbelow(True)
    handles, names = lanes.get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False)
    path = plot_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
