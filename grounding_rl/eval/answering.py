"""One place where evaluation and inference answer queries: a :class:`Mode` (one pass, the two-pass zoom, or the
crop tool for up to K turns) is chosen once, and every mode gives the same typed :class:`Answer`
(:func:`answer_rows`): ``grounding-rl eval`` and ``difficulty`` over videos grouped by clip (:func:`answer_batches`),
``grounding-rl infer`` on its one decoded clip (:func:`clip_answers`).

The modes: one greedy (or sampled) pass, :func:`grounding_rl.rollout.greedy.answer_batch`; the zoom, pass 2 on the
window of each first answer (:func:`grounding_rl.eval.zoom.zoom_rows`); the crop tool, up to K turns of the
multi-turn training loop (:func:`grounding_rl.rollout.conversation.run_conversations`).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from grounding_rl.eval.zoom import ZoomSettings


@dataclass(frozen=True)
class Mode:
    """How each query is answered.

    Attributes:
        zoom: a second pass on the window of the first answer (:class:`ZoomSettings`); None = no zoom.
        max_turns: crop requests allowed before the answer (the crop tool); 0 = one turn.
        temperature: None = greedy; > 0 samples one pass (``seeds`` of :func:`answer_batches` give each query's).
    """

    zoom: ZoomSettings | None = None
    max_turns: int = 0
    temperature: float | None = None


@dataclass(frozen=True)
class Answer:
    """One query's answer, the same fields in every mode.

    Attributes:
        position: the query's index in the ``videos``/``queries`` given to :func:`answer_batches`.
        text: the final answer text (pass 1's or the first turn's in one pass); None when ``error``.
        error: why there is no answer (the clip did not load, out of memory), else None.
        sampling: the rate and size the whole clip was sampled at
            (:meth:`grounding_rl.data.video.SampledVideo.sampling`), None when it did not load.
        zoom: with the zoom, pass 2 (:func:`grounding_rl.eval.zoom.zoom_rows`: window, fallback, answer text,
            interval in the video's seconds, window sampling, error); None otherwise or when pass 1 failed.
        conversation: with the crop tool, every turn and requested window
            (:meth:`grounding_rl.rollout.conversation.Trajectory.record`); None otherwise or on an error.
    """

    position: int
    text: str | None
    error: str | None
    sampling: dict | None
    zoom: dict | None = None
    conversation: dict | None = None

    def record(self, sample, set_answers: bool = False) -> dict:
        """The ``predictions.jsonl`` record of this answer to ``sample``
        (:func:`grounding_rl.reward.records.prediction_record`; with the zoom pass 2's answer in the video's seconds
        and pass 1's under ``pass1``, :func:`grounding_rl.eval.zoom.zoom_record`; with the crop tool its
        ``conversation``)."""
        from grounding_rl.eval.zoom import zoom_record
        from grounding_rl.reward.records import prediction_record

        record = prediction_record(sample, self.text, self.error, self.sampling, set_answers=set_answers)
        if self.conversation is not None:
            record["conversation"] = self.conversation
        return zoom_record(record, self.zoom, sample)


def answer_batches(model, processor, videos: Sequence[str], queries: Sequence[str], config, max_new_tokens: int,
                   batch_size: int, mode: Mode, num_workers: int = 2, frame_cache: str | None = None,
                   frame_cache_bytes: int = 0, engine=None, seeds: Sequence[int] | None = None
                   ) -> Iterator[list[Answer]]:
    """Answer ``queries[i]`` on ``videos[i]`` in ``mode``, grouped by video (each decoded once for its queries, in
    background workers: :func:`grounding_rl.rollout.greedy.clip_batches`), one list of :class:`Answer` per batch of
    at most ``batch_size`` rows (:func:`answer_rows`); every position appears once.

    Args:
        model, processor, engine: the policy (HF) or a vLLM ``engine`` and the processor.
        config: the preprocessing (``video`` settings, ``prompt_template``, ``video_layout``,
            :class:`grounding_rl.prompts.preprocessing.PreprocessingConfig`).
        max_new_tokens: tokens per pass or turn.
        seeds: one per query with ``mode.temperature`` (each answer sampled from its own seed).
    """
    from grounding_rl.rollout.greedy import clip_batches, group_by_video

    for batch in clip_batches(group_by_video(list(videos)), config.video, max(1, batch_size), num_workers,
                              frame_cache, frame_cache_bytes):
        yield answer_rows(model, processor, batch, queries, config, max_new_tokens, mode, engine, seeds)


def answer_rows(model, processor, batch: list, queries: Sequence[str], config, max_new_tokens: int, mode: Mode,
                engine=None, seeds: Sequence[int] | None = None, on_zoom=None, on_conversation=None) -> list[Answer]:
    """One batch of ``(position, SampledVideo | None, error | None)`` rows answered in ``mode``, in order: one pass
    (:func:`grounding_rl.rollout.greedy.answer_batch`), then with the zoom pass 2 on each answered row's window
    (:func:`grounding_rl.eval.zoom.zoom_rows`), or the crop tool's conversation. A clip that did not load, or a pass that runs out of memory,
    gives the row's ``error``. ``on_zoom(position, window_clip)`` is called before pass 2 generates,
    ``on_conversation(position, trajectory)`` after a conversation ends (``infer --print-prompt``)."""
    if mode.max_turns:
        return _conversation_rows(model, processor, batch, queries, config, max_new_tokens, mode.max_turns, engine,
                                  on_conversation)
    from grounding_rl.rollout.generation import SamplingParams
    from grounding_rl.rollout.greedy import answer_batch

    sampled = None if mode.temperature is None else SamplingParams(max_new_tokens, temperature=mode.temperature)
    first = [Answer(*row) for row in answer_batch(model, processor, batch, queries, config.prompt_template,
                                                  max_new_tokens, None, engine, config.video_layout, sampled, seeds)]
    if mode.zoom is None:
        return first
    from grounding_rl.eval.zoom import zoom_rows

    rows = [(a.position, a.text, a.error, a.sampling, clip.path, clip.duration)
            for a, (_, clip, _) in zip(first, batch) if a.sampling is not None and a.error is None]
    show = None if on_zoom is None else (lambda index, clip: on_zoom(rows[index][0], clip))
    zoomed = zoom_rows(model, processor, rows, queries, config.video, config.prompt_template, max_new_tokens,
                       mode.zoom, engine, config.video_layout, on_prompt=show) if rows else []
    by_position = {row[0]: item for row, item in zip(rows, zoomed)}
    return [replace(a, zoom=by_position.get(a.position)) for a in first]


def _conversation_rows(model, processor, batch, queries, config, max_new_tokens: int, max_turns: int, engine,
                       on_conversation) -> list[Answer]:
    """:func:`answer_rows` with the crop tool: the rows whose clip loaded converse together, greedily, with
    ``model.generate`` or the vLLM ``engine`` (built with ``max_videos`` ≥ K + 1), the windows spending each clip's
    budget (:class:`grounding_rl.rollout.tools.CropEnvironment`)."""
    import torch

    ok = [(position, clip) for position, clip, error in batch if clip is not None and error is None]
    done = {}
    if ok:
        try:
            trajectories = _converse(model, processor, [clip for _, clip in ok], [queries[p] for p, _ in ok], config,
                                     max_new_tokens, max_turns, engine)
        except torch.OutOfMemoryError as err:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            done = {p: Answer(p, None, f"out of memory: {err}"[:300], None) for p, _ in ok}
        else:
            for (p, clip), t in zip(ok, trajectories):
                done[p] = Answer(p, t.final_text, None, clip.sampling(), conversation=t.record())
                if on_conversation is not None:
                    on_conversation(p, t)
    return [done.get(position) or Answer(position, None, error, None) for position, _, error in batch]


def _converse(model, processor, clips: list, queries: list[str], config, max_new_tokens: int, max_turns: int,
              engine) -> list:
    """Finished :class:`grounding_rl.rollout.conversation.Trajectory` objects, one per (clip, query) row: the
    multi-turn training loop (:func:`grounding_rl.rollout.conversation.run_conversations`), greedy."""
    import torch

    from grounding_rl.family import family_of
    from grounding_rl.models.tokens import completion_token_ids
    from grounding_rl.models.vision import placeholder_token_ids
    from grounding_rl.rollout import conversation as conv
    from grounding_rl.rollout.generation import SamplingParams
    from grounding_rl.rollout.tools import CropEnvironment

    family, layout = family_of(processor), config.video_layout
    ids = completion_token_ids(processor.tokenizer, getattr(model, "generation_config", None))
    trajectories = [conv.start(processor, family, q, clip, config.prompt_template, max_turns, layout)
                    for q, clip in zip(queries, clips)]
    params = SamplingParams.greedy(max_new_tokens)
    if engine is not None:
        from grounding_rl.rollout.vllm import vllm_turns

        generate, end_ids, stop_ids = vllm_turns(engine, params), engine.eos_token_ids, engine.placeholder_ids
    else:
        generate = conv.hf_turns(model, processor, params, ids.pad)
        end_ids, stop_ids = list(ids.eos), placeholder_token_ids(model)
    with torch.no_grad():
        conv.run_conversations(generate, trajectories, processor, family,
                               CropEnvironment(family.video_settings(config.video)), max_turns, end_ids=end_ids,
                               stop_ids=stop_ids, layout=layout)
    return trajectories


def clip_answers(model, processor, video, queries: Sequence[str], config, max_new_tokens: int, batch_size: int,
                 mode: Mode, engine=None, print_prompt=None) -> list[dict]:
    """Answer every query on one decoded clip in ``mode`` (what ``grounding-rl infer`` runs), ``batch_size`` rows at
    a time sharing the clip (:func:`answer_rows`). ``print_prompt(text)``, when given, receives the exact prompts:
    each query's before it runs, with the zoom pass 2's after the window is known, with the crop tool the whole
    conversation once it ends.

    Returns:
        one result object per query (:func:`result_of`).

    Raises:
        RuntimeError: a pass ran out of memory.
    """
    from grounding_rl.eval.infer import format_prompt

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
        from grounding_rl.prompts.preprocessing import prompt_text

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


def result_of(answer: Answer, query: str, duration: float, template: str) -> dict:
    """``infer``'s object for one answer (:func:`grounding_rl.eval.infer.answer_result`: seconds clamped to the
    clip, plus ``sampling``); with the zoom pass 2's answer and ``pass1``, ``zoom_window``, ``zoom_fallback`` (and
    ``zoom_error`` when the window could not be sampled: the result is then pass 1's); with the crop tool the final
    turn's answer and ``conversation``.

    Raises:
        RuntimeError: the answer has an error (out of memory).
    """
    from grounding_rl.eval.infer import answer_result
    from grounding_rl.prompts.templates import is_set_template
    from grounding_rl.reward.iou import clamp_interval
    from grounding_rl.prompts.parsing import extract_think

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
    start, end = clamp_interval(zoom["interval"], duration) if zoom["interval"] is not None else (None, None)
    return {"query": query, "start": start, "end": end, "answer": zoom["answer"],
            "reasoning": extract_think(zoom["answer"]), "sampling": zoom["sampling"], **extra}
