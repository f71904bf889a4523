"""Asking when something happens in one video (what ``grounding-rl infer`` runs, :mod:`grounding_rl.cli.infer`): greedy
answers for several queries on one decoded clip (:func:`infer`), each turned into seconds clamped to the video
(:func:`answer_result`), the exact prompt (:func:`format_prompt`) and a readable summary (:func:`format_text`).
:func:`infer_zoom` answers twice, on the whole clip and on the window of the first answer
(:mod:`grounding_rl.eval.zoom`); :func:`infer_turns` runs the policy with the crop tool, as multi-turn training does.
"""
from __future__ import annotations

from grounding_rl.data.video import SampledVideo
from grounding_rl.family import DEFAULT_VIDEO_LAYOUT
from grounding_rl.prompts.preprocessing import build_inputs, prompt_text
from grounding_rl.reward.iou import clamp_interval
from grounding_rl.prompts.templates import is_set_template
from grounding_rl.reward.parsing import extract_think, parse_answer, parse_spans
from grounding_rl.rollout.generation import SamplingParams, generate_answers


def answer_result(query: str, answer: str, duration: float, set_answers: bool = False) -> dict:
    """The output object for one query: ``{"query", "start", "end", "answer", "reasoning"}``.

    ``start``/``end`` are the parsed answer clamped to [0, duration] seconds (order kept), None when unparseable;
    ``reasoning`` is the ``<think>`` text or None. With ``set_answers`` (a template that asks for every span) the
    answer is read as a set (:func:`grounding_rl.reward.parsing.parse_spans`): ``spans`` lists each span clamped,
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


def infer(model, processor, video: SampledVideo, queries: list[str], template: str, max_new_tokens: int,
          batch_size: int = 4, engine=None, video_layout: str = DEFAULT_VIDEO_LAYOUT) -> list[dict]:
    """Answer every query on one sampled clip (greedy, batched). The clip was decoded once and is encoded once per
    batch of queries (the rows share its vision features). ``engine``: another rollout engine (``--engine vllm``;
    ``model`` unused); ``video_layout``: see :data:`grounding_rl.family.VIDEO_LAYOUTS`. Returns one
    :func:`answer_result` per query, with the rate and size the clip was sampled at (``sampling``:
    :meth:`grounding_rl.data.video.SampledVideo.sampling`)."""
    results = []
    step = max(1, batch_size)
    for i in range(0, len(queries), step):
        chunk = queries[i:i + step]
        answers = generate_answers(model, processor, chunk, [video] * len(chunk), template,
                                   SamplingParams.greedy(max_new_tokens), **({"engine": engine} if engine else {}),
                                   video_layout=video_layout)
        results += [{**answer_result(q, a, video.duration, is_set_template(template)), "sampling": video.sampling()}
                    for q, a in zip(chunk, answers)]
    return results


def zoom_heading(window) -> str:
    """The line ``infer --zoom --print-prompt`` writes between pass 1's and pass 2's prompt:
    ``--- pass 2 (zoom window 30.00–60.00 s) ---``."""
    return f"--- pass 2 (zoom window {window[0]:.2f}–{window[1]:.2f} s) ---"


def infer_zoom(model, processor, video: SampledVideo, queries: list[str], template: str, max_new_tokens: int,
               settings, zoom, family_name: str, batch_size: int = 4, engine=None,
               video_layout: str = DEFAULT_VIDEO_LAYOUT, print_prompt=None) -> list[dict]:
    """:func:`infer` (pass 1 on ``video``, the whole clip decoded once) then pass 2 per query on the window of its
    answer (:mod:`grounding_rl.eval.zoom`; ``settings`` the clip's sampling settings, ``zoom`` a
    :class:`grounding_rl.eval.zoom.ZoomSettings`, ``family_name`` the model's family).

    ``print_prompt(text)``, when given, receives per query pass 1's prompt, :func:`zoom_heading` and pass 2's prompt,
    in that order (pass 2's window needs pass 1's answer, so they are printed after pass 1 has run).

    Returns:
        one :func:`answer_result` per query with pass 2's answer in the video's absolute seconds (clamped to the
        clip), plus ``pass1`` (pass 1's result), ``zoom_window`` [a, b], ``zoom_fallback`` and, when the window could
        not be sampled, ``zoom_error`` (the result is then pass 1's).
    """
    from grounding_rl.eval.zoom import zoom_rows

    first = infer(model, processor, video, queries, template, max_new_tokens, batch_size, engine, video_layout)
    results = []
    step = max(1, batch_size)
    for i in range(0, len(queries), step):
        chunk = list(range(i, min(len(queries), i + step)))
        rows = [(p, first[p]["answer"], None, first[p]["sampling"], video.path, video.duration) for p in chunk]

        def show(index, clip):
            if print_prompt is not None:
                query = queries[chunk[index]]
                print_prompt(f"infer: prompt for {query!r} (pass 1):\n"
                             + format_prompt(processor, video, query, template, video_layout))
                print_prompt(zoom_heading(clip.window))
                print_prompt(format_prompt(processor, clip, query, template, video_layout))

        zoomed = zoom_rows(model, processor, rows, queries, settings, template, max_new_tokens, zoom, family_name,
                            engine, video_layout, on_prompt=show)
        for p, item in zip(chunk, zoomed):
            result = dict(first[p])
            extra = {"pass1": first[p], "zoom_window": item["window"], "zoom_fallback": item["fallback"]}
            if item["error"] is not None:
                extra["zoom_error"] = item["error"]
            else:
                interval = item["interval"]
                start, end = clamp_interval(interval, video.duration) if interval is not None else (None, None)
                result = {"query": queries[p], "start": start, "end": end, "answer": item["answer"],
                          "reasoning": extract_think(item["answer"]), "sampling": item["sampling"]}
            results.append({**result, **extra})
    return results


def infer_turns(model, processor, video: SampledVideo, queries: list[str], template: str, max_new_tokens: int,
                settings, max_turns: int, batch_size: int = 4, video_layout: str = DEFAULT_VIDEO_LAYOUT,
                print_prompt=None, engine=None) -> list[dict]:
    """Run the policy with the crop tool (``infer --max-turns K``): the multi-turn loop of training
    (:func:`grounding_rl.rollout.conversation.run_conversations`), greedy, at most ``max_turns`` crop requests per
    query, each model turn up to ``max_new_tokens`` tokens; ``settings`` the clip's sampling settings (the windows
    spend its budget, :class:`grounding_rl.rollout.tools.CropEnvironment`).

    ``print_prompt(text)``, when given, receives per query the whole conversation as the model saw it, every turn
    (:func:`grounding_rl.prompts.preprocessing.prompt_text`; printed once the query is done, since tool turns follow
    the model's requests). ``engine``: a vLLM engine built with ``max_videos`` ≥ K + 1 (``model`` then None).

    Returns:
        one :func:`answer_result` per query for its final turn (absolute seconds, clamped), plus ``sampling`` (the
        whole clip's) and ``conversation`` (:meth:`grounding_rl.rollout.conversation.Trajectory.record`: every turn,
        the requested windows, requests and refusals).
    """
    from grounding_rl.eval.turns import converse_greedy

    results = []
    for i in range(0, len(queries), max(1, batch_size)):
        chunk = queries[i:i + max(1, batch_size)]
        trajectories = converse_greedy(model, processor, [video] * len(chunk), chunk, template, max_new_tokens,
                                       settings, max_turns, video_layout, engine)
        for query, t in zip(chunk, trajectories):
            if print_prompt is not None:
                print_prompt(f"infer: conversation for {query!r} ({len(t.turns)} model turns):\n"
                             + prompt_text(processor, t.prompt_ids + t.completion_ids))
            results.append({**answer_result(query, t.final_text, video.duration), "sampling": video.sampling(),
                            "conversation": t.record()})
    return results


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
