"""One place where evaluation and inference answer queries: a :class:`Mode` (one pass, the two-pass zoom, or the
crop tool for up to K turns) is chosen once, and every mode gives the same typed :class:`Answer`
(:func:`answer_rows`): ``grounding-rl eval``, ``difficulty`` and validation during training over videos grouped by
clip (:func:`answer_batches`), ``grounding-rl infer`` on its one decoded clip
(:func:`grounding_rl.eval.infer.clip_answers`).

The modes: one greedy (or sampled) pass, :func:`grounding_rl.rollout.greedy.answer_batch`; the zoom, that pass then
a second turn on the window of its answer (:func:`grounding_rl.rollout.zoom.zoom_rows`); the crop tool, up to K turns
of training's loop (:func:`grounding_rl.rollout.conversation.run_conversations`). Turns run on the engine's one
conversation method, ``continue_turn`` (:func:`grounding_rl.rollout.conversation.turn_engine`).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import torch

from grounding_rl.family import family_of
from grounding_rl.prompts.parsing import parse_answer, parse_spans
from grounding_rl.prompts.templates import is_set_template
from grounding_rl.rollout import conversation as conv
from grounding_rl.rollout.generation import SamplingParams
from grounding_rl.rollout.greedy import answer_batch, clip_batches, group_by_video
from grounding_rl.rollout.tools import CropEnvironment
from grounding_rl.rollout.zoom import zoom_rows


@dataclass(frozen=True)
class Mode:
    """How each query is answered.

    Attributes:
        zoom: a second pass on the window of the first answer (:class:`grounding_rl.rollout.zoom.ZoomSettings`);
            None = no zoom.
        max_turns: crop requests allowed before the answer (the crop tool); 0 = one turn.
        temperature: None = greedy; > 0 samples one pass (``seeds`` of :func:`answer_batches` give each query's).
        synced_gpus: one pass's ``generate(synced_gpus=…)``; None = transformers' default, False = each rank decodes
            alone (validation during training).
    """

    zoom: object | None = None
    max_turns: int = 0
    temperature: float | None = None
    synced_gpus: bool | None = None


@dataclass(frozen=True)
class Answer:
    """One query's answer, the same fields in every mode.

    Attributes:
        position: the query's index in the ``videos``/``queries`` given to :func:`answer_batches`.
        text: the final answer text (pass 1's or the first turn's in one pass); None when ``error``.
        error: why there is no answer (the clip did not load, out of memory), else None.
        sampling: the rate and size the whole clip was sampled at
            (:meth:`grounding_rl.data.video.SampledVideo.sampling`), None when it did not load.
        zoom: with the zoom, pass 2 (:func:`grounding_rl.rollout.zoom.zoom_rows`: window, fallback, answer text,
            interval in the video's seconds, window sampling, error); None otherwise or when pass 1 failed.
        conversation: with the crop tool, every turn and requested window
            (:meth:`grounding_rl.rollout.conversation.Trajectory.record`); None otherwise or on an error.
        spans: the final answer's ``[(start, end)]`` in the video's seconds as written (not clamped; pass 2's with
            the zoom), several with a set template; None when it does not parse or there is no answer.
    """

    position: int
    text: str | None
    error: str | None
    sampling: dict | None
    zoom: dict | None = None
    conversation: dict | None = None
    spans: list[tuple[float, float]] | None = None


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
    for batch in clip_batches(group_by_video(list(videos)), config.video, max(1, batch_size), num_workers,
                              frame_cache, frame_cache_bytes):
        yield answer_rows(model, processor, batch, queries, config, max_new_tokens, mode, engine, seeds)


def answer_rows(model, processor, batch: list, queries: Sequence[str], config, max_new_tokens: int, mode: Mode,
                engine=None, seeds: Sequence[int] | None = None, on_zoom=None, on_conversation=None) -> list[Answer]:
    """One batch of ``(position, SampledVideo | None, error | None)`` rows answered in ``mode``, in order: one pass
    (:func:`grounding_rl.rollout.greedy.answer_batch`), then with the zoom pass 2 on each answered row's window
    (:func:`grounding_rl.rollout.zoom.zoom_rows`), or the crop tool's conversation; each answer's ``spans`` read
    once (:func:`_with_spans`). A clip that did not load, or a pass that runs out of memory, gives the row's
    ``error``. ``on_zoom(position, window_clip)`` is called before pass 2 generates, ``on_conversation(position,
    trajectory)`` after a conversation ends (``infer --print-prompt``)."""
    if mode.max_turns:
        return _with_spans(_conversation_rows(model, processor, batch, queries, config, max_new_tokens,
                                              mode.max_turns, engine, on_conversation), config.prompt_template)
    decoding = (SamplingParams.greedy(max_new_tokens, mode.synced_gpus) if mode.temperature is None
                else SamplingParams(max_new_tokens, temperature=mode.temperature))
    first = [Answer(*row) for row in answer_batch(model, processor, batch, queries, config.prompt_template, decoding,
                                                  engine, config.video_layout, seeds)]
    if mode.zoom is None:
        return _with_spans(first, config.prompt_template)
    rows = [(a, clip) for a, (_, clip, _) in zip(first, batch) if a.sampling is not None and a.error is None]
    zoomed = zoom_rows(model, processor, rows, queries, config, max_new_tokens, mode.zoom, engine, on_zoom)
    by_position = {a.position: item for (a, _), item in zip(rows, zoomed)}
    return _with_spans([replace(a, zoom=by_position.get(a.position)) for a in first], config.prompt_template)


def _with_spans(answers: list[Answer], template: str) -> list[Answer]:
    """``answers`` with their final ``spans`` read: pass 2's interval (already in the video's seconds) when the zoom
    ran, else the text's (:func:`grounding_rl.prompts.parsing.parse_spans` for a set template, else the one
    :func:`grounding_rl.prompts.parsing.parse_answer` interval); None when there is none."""
    def spans(a: Answer):
        if a.zoom is not None and a.zoom["error"] is None:
            return None if a.zoom["interval"] is None else [tuple(a.zoom["interval"])]
        if a.text is None or is_set_template(template):
            return None if a.text is None else parse_spans(a.text)
        parsed = parse_answer(a.text)
        return None if parsed is None else [parsed]

    return [replace(a, spans=spans(a)) for a in answers]


def _conversation_rows(model, processor, batch, queries, config, max_new_tokens: int, max_turns: int, engine,
                       on_conversation) -> list[Answer]:
    """:func:`answer_rows` with the crop tool: the rows whose clip loaded converse together, greedily, in the
    multi-turn training loop (:func:`grounding_rl.rollout.conversation.run_conversations`) on the engine's
    ``continue_turn`` (:func:`grounding_rl.rollout.conversation.turn_engine`: transformers, or the vLLM ``engine``
    built with ``max_videos`` ≥ K + 1), the windows spending each clip's budget
    (:class:`grounding_rl.rollout.tools.CropEnvironment`)."""
    ok = [(position, clip) for position, clip, error in batch if clip is not None and error is None]
    family, layout, done = family_of(processor), config.video_layout, {}
    turns, params = conv.turn_engine(model, processor, engine), SamplingParams.greedy(max_new_tokens)
    try:
        trajectories = [conv.start(processor, family, queries[p], clip, config.prompt_template, max_turns, layout)
                        for p, clip in ok]
        with torch.no_grad():
            if ok:
                conv.run_conversations(lambda active: turns.continue_turn(active, params), trajectories, processor,
                                       family, CropEnvironment(family.video_settings(config.video)), max_turns,
                                       end_ids=turns.eos_token_ids, stop_ids=turns.placeholder_ids, layout=layout)
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
