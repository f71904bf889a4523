"""What ``grounding-rl infer`` shows (:mod:`grounding_rl.cli.infer`; the answers come from
:func:`grounding_rl.eval.answering.clip_answers`): each answer turned into seconds clamped to the video
(:func:`answer_result`), the exact prompt (:func:`format_prompt`) and a readable summary (:func:`format_text`).
"""
from __future__ import annotations

from grounding_rl.data.video import SampledVideo
from grounding_rl.family import DEFAULT_VIDEO_LAYOUT
from grounding_rl.prompts.preprocessing import build_inputs, prompt_text
from grounding_rl.reward.iou import clamp_interval
from grounding_rl.prompts.parsing import extract_think, parse_answer, parse_spans


def answer_result(query: str, answer: str, duration: float, set_answers: bool = False) -> dict:
    """The output object for one query: ``{"query", "start", "end", "answer", "reasoning"}``.

    ``start``/``end`` are the parsed answer clamped to [0, duration] seconds (order kept), None when unparseable;
    ``reasoning`` is the ``<think>`` text or None. With ``set_answers`` (a template that asks for every span) the
    answer is read as a set (:func:`grounding_rl.prompts.parsing.parse_spans`): ``spans`` lists each span clamped,
    ``start``/``end`` are its hull.
    """
    if set_answers:
        parsed_set = parse_spans(answer)
        spans = [list(clamp_interval(span, duration)) for span in parsed_set] if parsed_set else None
        return {"query": query, "start": min(s for s, _ in spans) if spans else None,
                "end": max(e for _, e in spans) if spans else None, "spans": spans, "answer": answer,
                "reasoning": extract_think(answer)}
    parsed = parse_answer(answer)
    start, end = clamp_interval(parsed, duration) if parsed is not None else (None, None)
    return {"query": query, "start": start, "end": end, "answer": answer, "reasoning": extract_think(answer)}


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
        elif r.get("spans"):
            lines.append("    spans: " + ", ".join(f"{s:.2f} s to {e:.2f} s" for s, e in r["spans"]))
        else:
            lines.append(f"    interval: {r['start']:.2f} s to {r['end']:.2f} s")
        if "zoom_window" in r:
            p1 = r["pass1"]
            first = "(no parseable answer)" if p1["start"] is None else f"{p1['start']:.2f} s to {p1['end']:.2f} s"
            lines.append(f"    pass 1: {first}; zoom window {r['zoom_window'][0]:.2f} s to {r['zoom_window'][1]:.2f} s"
                         + (" (fallback: the centre half)" if r["zoom_fallback"] else "")
                         + (f"; {r['zoom_error']}" if r.get("zoom_error") else ""))
        if "conversation" in r:
            record = r["conversation"]
            lines.append(f"    turns: {len(record['turns'])}; crops: "
                         + (", ".join(f"{a:.2f} s to {b:.2f} s" for a, b in record["windows"]) or "none")
                         + (f"; refused requests: {record['failures']}" if record["failures"] else ""))
        lines.append(f"    answer: {r['answer'].strip()!r}")
        lines.append(f"    reasoning: {r['reasoning'] if r['reasoning'] is not None else '(none)'}")
    return "\n".join(lines)
