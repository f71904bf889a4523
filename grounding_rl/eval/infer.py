"""What ``grounding-rl infer`` shows (:mod:`grounding_rl.cli.infer`; the answers come from
:func:`clip_answers`): each answer turned into seconds clamped to the video
(:func:`answer_result`), the exact prompt (:func:`format_prompt`) and a readable summary (:func:`format_text`).
"""
from __future__ import annotations

from grounding_rl.data.video import SampledVideo
from grounding_rl.family import DEFAULT_VIDEO_LAYOUT
from grounding_rl.prompts.preprocessing import build_inputs, prompt_text
from grounding_rl.prompts.parsing import extract_think, parse_answer, parse_spans
from grounding_rl.reward.iou import clamp_interval


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


def clip_answers(model, processor, video, queries: Sequence[str], config, max_new_tokens: int, batch_size: int,
                 mode, engine=None, print_prompt=None) -> list[dict]:
    """Answer every query on one decoded clip in ``mode`` (what ``grounding-rl infer`` runs), ``batch_size`` rows at
    a time sharing the clip (:func:`grounding_rl.rollout.answering.answer_rows`, ``mode`` a
    :class:`grounding_rl.rollout.answering.Mode`). ``print_prompt(text)``, when given, receives the exact prompts:
    each query's before it runs, with the zoom pass 2's after the window is known, with the crop tool the whole
    conversation once it ends.

    Returns:
        one result object per query (:func:`result_of`).

    Raises:
        RuntimeError: a pass ran out of memory.
    """
    from grounding_rl.rollout.answering import answer_rows

    queries, template, layout = list(queries), config.prompt_template, config.video_layout
    show = print_prompt or (lambda text: None)

    def first_prompt(p):
        show(f"infer: prompt for {queries[p]!r}" + (" (pass 1)" if mode.zoom is not None else "") + ":\n"
             + format_prompt(processor, video, queries[p], template, layout))

    def on_zoom(p, clip):  # pass 1's prompt, the window, pass 2's prompt
        first_prompt(p)
        show(f"--- pass 2 (zoom window {clip.window[0]:.2f}–{clip.window[1]:.2f} s) ---")
        show(format_prompt(processor, clip, queries[p], template, layout))

    def on_conversation(p, t):
        show(f"infer: conversation for {queries[p]!r} ({len(t.turns)} model turns):\n"
             + prompt_text(processor, t.prompt_ids + t.completion_ids))

    results, step, printing = [], max(1, batch_size), print_prompt is not None
    for i in range(0, len(queries), step):
        batch = [(p, video, None) for p in range(i, min(len(queries), i + step))]
        for p, _, _ in batch if printing and mode.zoom is None and not mode.max_turns else ():
            first_prompt(p)
        answers = answer_rows(model, processor, batch, queries, config, max_new_tokens, mode, engine,
                              on_zoom=on_zoom if printing else None,
                              on_conversation=on_conversation if printing else None)
        results += [result_of(a, queries[a.position], video.duration, template) for a in answers]
    return results


def result_of(answer, query: str, duration: float, template: str) -> dict:
    """``infer``'s object for one answer (:func:`answer_result`: seconds clamped to the
    clip, plus ``sampling``); with the zoom pass 2's answer and ``pass1``, ``zoom_window``, ``zoom_fallback`` (and
    ``zoom_error`` when the window could not be sampled: the result is then pass 1's); with the crop tool the final
    turn's answer and ``conversation``.

    Raises:
        RuntimeError: the answer has an error (out of memory).
    """
    from grounding_rl.prompts.templates import is_set_template

    if answer.error is not None:
        raise RuntimeError(f"{query!r}: {answer.error}")
    result = {**answer_result(query, answer.text, duration, is_set_template(template)), "sampling": answer.sampling}
    if answer.conversation is not None:
        result["conversation"] = answer.conversation
    zoom = answer.zoom
    if zoom is None:
        return result
    extra = {"pass1": result, "zoom_window": zoom["window"], "zoom_fallback": zoom["fallback"]}
    if zoom["error"] is not None:
        return {**result, **extra, "zoom_error": zoom["error"]}
    start, end = clamp_interval(answer.spans[0], duration) if answer.spans else (None, None)
    return {"query": query, "start": start, "end": end, "answer": zoom["answer"],
            "reasoning": extract_think(zoom["answer"]), "sampling": zoom["sampling"], **extra}
