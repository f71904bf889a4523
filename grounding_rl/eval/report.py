"""Evaluation reports and pictures: ``metrics.json``, ``report.md`` and ``iou_hist.png`` (``report.html`` and the
``grounding-rl infer --plot`` timeline: :mod:`grounding_rl.eval.gallery`). Plots use matplotlib's Agg backend (no
display needed).
"""
from __future__ import annotations

import datetime as _dt
import json
from importlib import metadata
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from grounding_rl.jsonl_files import write_jsonl_atomic
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


def write_metrics_json(path: str | Path, metrics: Mapping, info: Mapping) -> dict:
    """Write ``metrics.json``: the metric names at the top level, then ``info`` (model, data, sampling, seed, ...),
    ``versions`` (:func:`package_versions`) and ``created`` (UTC, ISO 8601). Returns the written object."""
    payload = {**metrics, **info, "versions": package_versions(),
               "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    write_jsonl_atomic(path, [json.dumps(payload, indent=2)])
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
    write_jsonl_atomic(path, lines)
    return "\n".join(lines) + "\n"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def hist_bins(n: int, most: int = 20) -> np.ndarray:
    """Edges of the IoU histogram's equal bins over [0, 1]: ``most`` bins (width 0.05), but no more bins than queries
    ``n`` (at least one), so a small run is not drawn as a comb of one-query bars."""
    return np.linspace(0.0, 1.0, min(most, max(1, n)) + 1)


def plot_iou_hist(ious: Sequence[float], path: str | Path, *, failures: int = 0,
                  metrics: Mapping | None = None) -> Path:
    """Histogram of per-query IoU over [0, 1] in :func:`hist_bins` bins (20, fewer for fewer queries; empty bins drawn
    as nothing), with the R1 thresholds marked, titled with n and the mIoU.

    Args:
        ious: one IoU per query (failures included, as 0).
        path: output PNG.
        failures: how many of the IoU-0 queries had no usable prediction (unparsed answer or unreadable clip);
            drawn as a separate, hatched part of the first bar.
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
    ax.set_title(f"IoU distribution{scoring}: n = {values.size}, mIoU = {miou:.2f}")
    ax.legend(loc="upper right", fontsize=8, bbox_to_anchor=(1.0, 0.8))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


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
