"""Queries on the time axis: the timeline picture (``grounding-rl infer --plot``) and ``report.html``, the error
gallery ``grounding-rl eval`` writes beside ``report.md``.

A timeline is a strip of the frames the model saw, each thumbnail centred on its frame's true time with a tick at
every sampled frame, over one lane per query: the ground truth (green outline), the prediction (a bar per span), with
``--zoom`` the window of pass 2 (grey band) and pass 1's answer (dashed outline), with ``--max-turns`` each crop
window (hatched). ``report.html`` holds the metrics table, the IoU histogram and one timeline per query for the
:data:`GALLERY` worst, best and random queries, with the model's reasoning and each pass's or turn's text: one file,
images inlined as ``data:`` URIs, no JavaScript, readable offline.
"""
from __future__ import annotations

import base64
import html
import io
import random
import textwrap
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from grounding_rl.eval.report import _pyplot, plot_path
from grounding_rl.jsonl_files import write_jsonl_atomic
from grounding_rl.reward.metrics import format_metrics_table, scoring_table

GALLERY = 8  # queries in each of report.html's three sections: the worst, the best, a random draw (seed 0)
_COLORS = ("#1f77b4", "#d62728", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#bcbd22")


def _spans(value) -> list[tuple[float, float]]:
    return [tuple(sorted((float(s), float(e)))) for s, e in value]


def lane(result: Mapping, gt=None) -> dict:
    """What one lane of a timeline draws, from an ``infer`` result or a ``predictions.jsonl`` record.

    Returns:
        ``{"label", "spans", "gts", "zoom_window", "pass1", "windows"}`` in seconds of the video: the predicted spans
        (a set answer's ``spans``/``pred_spans``, else ``(start, end)``, else none), the ground truth (``gt``: one
        (start, end) or a list of them; else the record's ``gt_spans`` or ``gt_start``/``gt_end``; else none), the
        zoom window and pass 1's span (``--zoom``), the crop windows of the turns (``--max-turns``).
    """
    spans = result.get("spans") or result.get("pred_spans")
    if not spans and result.get("start") is not None and result.get("end") is not None:
        spans = [(result["start"], result["end"])]
    if gt is None:
        gt = result.get("gt_spans") or ([(result["gt_start"], result["gt_end"])] if "gt_start" in result else None)
    elif not isinstance(gt[0], (list, tuple)):
        gt = [gt]
    first = result.get("pass1") or {}
    pass1 = (first["start"], first["end"]) if first.get("start") is not None and first.get("end") is not None else None
    turns = (result.get("conversation") or {}).get("turns") or []
    return {"label": str(result.get("query", "")), "spans": _spans(spans or []), "gts": _spans(gt or []),
            "zoom_window": _spans([result["zoom_window"]])[0] if result.get("zoom_window") is not None else None,
            "pass1": _spans([pass1])[0] if pass1 else None,
            "windows": _spans([t["window"] for t in turns if t.get("window") is not None])}


def _draw_strip(strip, frames, stamps: Sequence[float], duration: float, max_frames: int) -> None:
    """Up to ``max_frames`` thumbnails (every k-th frame, k = ⌈T / max_frames⌉), each centred on its true time
    ``stamps[i]`` (seconds), and a tick at every sampled frame's time; without ``frames`` (the clip did not load) a
    note."""
    strip.set_xlim(0, duration)
    strip.set_ylim(-0.12, 1)
    strip.set_yticks([])
    strip.tick_params(axis="x", labelbottom=False, bottom=False)
    if frames is None or not len(stamps):
        strip.text(duration / 2, 0.5, "clip not loaded", ha="center", va="center", fontsize=9, color="0.4")
        return
    stamps = np.asarray(stamps, dtype=float)
    strip.vlines(stamps, -0.12, -0.02, color="0.25", linewidth=0.8)
    picks = np.arange(0, len(stamps), -(-len(stamps) // max(1, max_frames)))
    gaps = np.diff(stamps[picks])
    width = 0.96 * min(duration / len(picks), float(gaps.min()) if gaps.size else duration)
    for i in picks:
        t = float(stamps[i])
        strip.imshow(frames[i], extent=(t - width / 2, t + width / 2, 0, 1), aspect="auto", interpolation="bilinear")
        strip.text(t, -0.14, f"{t:.1f}s", ha="center", va="top", fontsize=7)
    strip.set_xlim(0, duration)  # imshow widens the limits to a thumbnail past either end


def _draw_lane(ax, y: int, item: dict, color: str, duration: float, first: bool) -> None:
    """One query's lane at height ``y``; legend labels on the ``first`` lane only."""
    from matplotlib.patches import Rectangle

    thin = duration * 0.002

    def label(name: str):
        return name if first else None

    if item["zoom_window"] is not None:
        a, b = item["zoom_window"]
        ax.add_patch(Rectangle((a, y - 0.45), b - a, 0.9, color="0.5", alpha=0.22, linewidth=0,
                               label=label("zoom window")))
    if item["pass1"] is not None:
        a, b = item["pass1"]
        ax.add_patch(Rectangle((a, y - 0.3), max(b - a, thin), 0.6, fill=False, edgecolor="0.2", linestyle="--",
                               linewidth=1.2, label=label("pass 1")))
    for k, (a, b) in enumerate(item["windows"]):
        ax.add_patch(Rectangle((a, y - 0.42), max(b - a, thin), 0.84, fill=False, edgecolor="0.45", hatch="///",
                               linewidth=0.6, label=label("crop window") if k == 0 else None))
    for k, (a, b) in enumerate(item["gts"]):
        ax.add_patch(Rectangle((a, y - 0.36), b - a, 0.72, fill=False, edgecolor="#2ca02c", linewidth=2,
                               label=label("ground truth") if k == 0 else None))
    for k, (a, b) in enumerate(item["spans"]):
        ax.add_patch(Rectangle((a, y - 0.22), max(b - a, thin), 0.44, color=color, alpha=0.85,
                               label=label("prediction") if k == 0 else None))
    if item["spans"]:
        hi = max(b for _, b in item["spans"])
        text = ", ".join(f"{a:.2f}–{b:.2f}" for a, b in item["spans"]) + " s"
        ax.text(min(hi + duration * 0.01, duration * 0.99), y, text, ha="left" if hi < duration * 0.85 else "right",
                va="center", fontsize=8)
    else:
        ax.text(duration / 2, y, "no parseable answer", ha="center", va="center", fontsize=8, color="0.4",
                style="italic")


def draw_timeline(frames, stamps: Sequence[float], duration: float, lanes: Sequence[dict], title: str,
                  max_frames: int = 10, width: float = 12.0):
    """The timeline figure (matplotlib, Agg): :func:`_draw_strip` over one :func:`_draw_lane` per :func:`lane`.

    Args:
        frames: (T, H, W, 3) uint8 of the frames the model saw, or None (the clip did not load).
        stamps: the T frames' times in seconds.
        duration: the video's length in seconds (the time axis).
        lanes: :func:`lane` outputs, drawn top to bottom.
        title: the figure's title.
        max_frames: thumbnails on the strip.
        width: figure width in inches.

    Returns:
        the ``matplotlib.figure.Figure`` (the caller saves and closes it); its axes are the strip, then the lanes.
    """
    plt = _pyplot()
    k = max(1, min(max_frames, len(stamps)))
    aspect = frames.shape[1] / frames.shape[2] if frames is not None else 0.0
    strip_h = max(0.9, min(2.4, (width * 0.8 / k) * aspect))  # keeps the frames' aspect roughly
    n = max(len(lanes), 1)
    lanes_h = 0.55 * n + 0.5
    height = strip_h + lanes_h + 1.8
    # fixed margins in inches (room for the lane labels, the title, the time axis and the legend): a layout engine
    # would draw the figure twice
    fig = plt.figure(figsize=(width, height), dpi=110)
    grid = fig.add_gridspec(2, 1, height_ratios=[strip_h + 0.3, lanes_h], left=2.4 / width, right=1 - 0.2 / width,
                            top=1 - 0.35 / height, bottom=1.0 / height, hspace=0.5 / ((height - 1.35) / 2))
    strip = fig.add_subplot(grid[0])
    axis = fig.add_subplot(grid[1], sharex=strip)
    _draw_strip(strip, frames, stamps, duration, max_frames)
    strip.set_title(title, fontsize=10)
    for q, item in enumerate(lanes):
        color = _COLORS[q % len(_COLORS)]
        for a, b in item["spans"]:
            strip.axvspan(a, b, color=color, alpha=0.28, linewidth=0)
        _draw_lane(axis, len(lanes) - 1 - q, item, color, duration, q == 0)
    axis.set_xlim(0, duration)
    axis.set_ylim(-0.6, n - 0.4)
    axis.set_yticks(list(range(len(lanes) - 1, -1, -1)))
    axis.set_yticklabels(["\n".join(textwrap.wrap(item["label"], 38)[:2]) for item in lanes], fontsize=8)
    for tick, q in zip(axis.get_yticklabels(), range(len(lanes))):
        tick.set_color(_COLORS[q % len(_COLORS)])
    axis.set_xlabel("time (s)")
    axis.grid(axis="x", color="0.85", linewidth=0.6)
    axis.set_axisbelow(True)
    handles, names = axis.get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    return fig


def plot_timeline(video, results: Sequence[Mapping], path: str | Path, *,
                  gts: Sequence[Sequence[float]] | None = None) -> Path:
    """The ``grounding-rl infer --plot`` picture: :func:`draw_timeline` of one clip with a lane per query, titled
    with the video file name, duration, frames and rate.

    Args:
        video: the :class:`~grounding_rl.data.video.SampledVideo` used for generation (frames (T, H, W, 3) uint8,
            ``timestamps`` in seconds, ``duration``).
        results: one ``infer`` result per query (``query``, ``start``, ``end`` in seconds or None, ``spans`` for a
            set answer; ``zoom_window`` and ``pass1`` with ``--zoom``; ``conversation`` with ``--max-turns``).
        path: output picture (:func:`grounding_rl.eval.report.plot_path`: no extension → ``.png``).
        gts: one (start, end) — or a list of them, a ground-truth set — per query in order, or None.

    Returns:
        the picture's path.
    """
    lanes = [lane(r, gts[q] if gts is not None and q < len(gts) else None) for q, r in enumerate(results)]
    title = (f"{Path(video.path).name}  ({float(video.duration):.2f} s, {video.num_frames} frames at "
             f"{video.sampled_fps:.2g} fps)")
    fig = draw_timeline(video.frames, list(video.timestamps), float(video.duration), lanes, title)
    path = plot_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    _pyplot().close(fig)
    return path


def pick(records: Sequence[Mapping], n: int = GALLERY) -> list[tuple[str, list[Mapping]]]:
    """report.html's sections: ``[(title, records)]`` for the ``n`` lowest-IoU records (clamped ``iou``; ties in
    annotation order), the ``n`` highest of the rest, and ``n`` drawn (``random.Random(0)``) from what is left, each
    record shown once; an empty section is left out."""
    order = sorted(range(len(records)), key=lambda i: (float(records[i].get("iou") or 0.0), i))
    worst = order[:n]
    best = [i for i in reversed(order) if i not in worst][:n]
    rest = [i for i in range(len(records)) if i not in worst and i not in best]
    drawn = sorted(random.Random(0).sample(rest, min(n, len(rest))))
    sections = [(f"Worst {len(worst)} queries (lowest IoU)", worst), (f"Best {len(best)} queries (highest IoU)", best),
                (f"{len(drawn)} random queries", drawn)]
    return [(title, [records[i] for i in chosen]) for title, chosen in sections if chosen]


def _data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _figure_uri(fig) -> str:
    """A figure as an inlined JPEG (a photo strip: a tenth of a PNG's bytes)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="jpeg", dpi=64, pil_kwargs={"quality": 85})
    _pyplot().close(fig)
    return _data_uri(buffer.getvalue(), "image/jpeg")


def html_table(markdown: str) -> str:
    """A markdown pipe table (a header row, the ``|---|`` row, body rows) as an HTML ``<table>``, cells escaped."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in markdown.strip().splitlines()]

    def row(cells, tag):
        return "<tr>" + "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in cells) + "</tr>"

    return ("<table>" + row(rows[0], "th") + "".join(row(r, "td") for r in rows[2:]) + "</table>")


def _passes_html(record: Mapping) -> str:
    """Each pass's (``--zoom``) or turn's (``--max-turns``) window and text, else the answer, as HTML."""
    def block(head: str, text) -> str:
        return f"<p class=pass>{html.escape(head)}</p><pre>{html.escape('(none)' if text is None else str(text))}</pre>"

    if record.get("pass1") is not None:
        window = record.get("zoom_window")
        where = f"window {window[0]:.2f}–{window[1]:.2f} s" if window else "no window"
        return block("pass 1 (whole video)", record["pass1"].get("answer")) + block(f"pass 2 ({where})",
                                                                                   record.get("answer"))
    turns = (record.get("conversation") or {}).get("turns")
    if turns:
        return "".join(block(f"turn {k} ({t.get('kind')}" + (f", crop {t['window'][0]:.2f}–{t['window'][1]:.2f} s"
                                                               if t.get("window") else "") + ")", t.get("text"))
                       for k, t in enumerate(turns, 1))
    return block("answer", record.get("answer"))


def _query_html(record: Mapping, video) -> str:
    """One query of the gallery: its facts, its timeline (``video``: the frames the model saw, or None), the model's
    reasoning and each pass's or turn's text."""
    item = lane(record)
    duration = float(video.duration) if video is not None else float(record.get("duration") or 1.0)
    fig = draw_timeline(video.frames if video is not None else None, list(video.timestamps) if video is not None
                        else [], duration, [item], f"{Path(str(record.get('video'))).name}  ({duration:.2f} s)",
                        width=10.0)

    def spans(value):
        return ", ".join(f"{a:.2f}–{b:.2f}" for a, b in value) + " s" if value else "none"

    facts = (f"IoU {float(record.get('iou') or 0.0):.3f} · ground truth {spans(item['gts'])} · prediction "
             f"{spans(item['spans'])}" + "".join(f" · {key.replace('_', ' ')}: {record[key]}"
                                                  for key in ("error", "zoom_error") if record.get(key)))
    reasoning = record.get("reasoning")
    return (f"<section><h3>{html.escape(str(record.get('qid')))}: {html.escape(str(record.get('query')))}</h3>"
            f"<p>{html.escape(facts)}</p><img src=\"{_figure_uri(fig)}\" alt=\"timeline of query "
            f"{html.escape(str(record.get('qid')))}\">"
            + (f"<p class=pass>reasoning</p><pre>{html.escape(reasoning)}</pre>" if reasoning else "")
            + _passes_html(record) + "</section>")


_STYLE = ("body{font-family:sans-serif;max-width:70em;margin:1em auto;padding:0 1em;color:#222}"
          "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #bbb;padding:.2em .6em;text-align:right}"
          "img{max-width:100%;display:block}pre{white-space:pre-wrap;background:#f4f4f4;padding:.4em;margin:.2em 0}"
          "section{border-top:1px solid #ddd;margin-top:1em}.pass{margin:.4em 0 0;font-weight:bold;font-size:90%}")


def _frames(records: Sequence[Mapping], settings) -> dict:
    """``{video path: SampledVideo or None}``: each clip of ``records`` sampled once with ``settings`` (the run's
    :class:`~grounding_rl.data.video.VideoSettings`); None for one that does not load."""
    from grounding_rl.data.video import VideoLoadError, sample_frames

    out = {}
    for record in records:
        path = str(record.get("video"))
        if path not in out:
            try:
                out[path] = sample_frames(path, settings)
            except (VideoLoadError, OSError):
                out[path] = None
    return out


def write_report_html(path: str | Path, metrics: Mapping, info: Mapping, records: Sequence[Mapping],
                      hist_path: str | Path | None, settings, n: int = GALLERY) -> Path:
    """Write ``report.html``: the metrics table (and every scoring's), the IoU histogram (``hist_path``, inlined) and
    the :func:`pick` sections of queries, each a timeline of the frames the model saw (``settings``: the run's
    :class:`~grounding_rl.data.video.VideoSettings`, each shown clip decoded again), ground truth, prediction,
    reasoning and the passes' or turns' windows and text. Self-contained: images are ``data:`` URIs, no script.

    Args:
        path: output file.
        metrics: ``metrics.json``'s metrics (as :func:`grounding_rl.eval.report.write_report_md` takes them).
        info: run details (``model``...).
        records: the ``predictions.jsonl`` records, in annotation order.

    Returns:
        the path written.
    """
    sections = pick(records, n)
    videos = _frames([r for _, chosen in sections for r in chosen], settings)
    name = html.escape(Path(str(info.get("model", "?"))).name or str(info.get("model")))
    body = [f"<h1>Evaluation: {name}</h1>", "<h2>Metrics</h2>", html_table(format_metrics_table(metrics))]
    if "by_scoring" in metrics:
        body += [f"<p>Headline: the <code>{html.escape(str(metrics.get('scoring')))}</code> scoring. Every scoring:"
                 "</p>", html_table(scoring_table(metrics))]
    if hist_path is not None and Path(hist_path).is_file():
        body += ["<h2>IoU distribution</h2>",
                 f"<img src=\"{_data_uri(Path(hist_path).read_bytes(), 'image/png')}\" alt=\"IoU histogram\">"]
    for title, chosen in sections:
        body += [f"<h2>{html.escape(title)}</h2>"] + [_query_html(r, videos[str(r.get('video'))]) for r in chosen]
    head = (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Evaluation: {name}</title>"
            f"<style>{_STYLE}</style></head><body>")
    write_jsonl_atomic(path, [head] + body + ["</body></html>"])
    return Path(path)
