"""Multi-turn rollouts with the crop tool: a trajectory of model turns and tool turns, as token ids.

A :class:`Trajectory` is the first prompt (the whole clip, :func:`start`) followed by its *completion*: the model's
sampled turns and the tool turns appended between them (:mod:`grounding_rl.rollout.tools`). Model tokens are kept
exactly as sampled (never re-tokenised); each tool turn's tokens are the chat template's continuation after the
model's ``<|im_end|>`` (:func:`grounding_rl.rollout.tools.turn_suffix`), expanded by the processor with the window's
video tokens (Qwen3-VL: its ``<t seconds>`` true timestamps). ``tool_mask`` is 1 on model tokens and 0 on tool tokens
(TRL 1.16's ``tool_mask``): log-probs, KL and the loss count only model tokens. The videos of a trajectory — the clip
then each window — are in the order their tokens appear, which is the order the model's 3D position ids consume
``video_grid_thw``; :func:`conversation_inputs` builds the one forward over prompt + completion that generation of
the next turn and the trainer's forwards share.

:func:`run_conversations` is the loop: every unfinished trajectory gets one model turn per round (``generate``, any
function of the trajectories: an engine's ``continue_turn`` — :meth:`HFTurns.continue_turn` with ``model.generate``,
:meth:`grounding_rl.rollout.vllm.VLLMEngine.continue_turn` — or scripted completions in tests); a turn
that answers, stops without its end-of-turn token (the per-turn budget ``max_new_tokens`` ran out) or is the last
allowed ends the trajectory; a crop request appends the window, a refused one an error turn. At most
``max_tool_calling_iterations`` = K requests, so at most K + 1 model turns. Context budget: every turn's input
(prompt + completion so far) must fit ``max_prompt_length``; a tool turn that would not fit is replaced by a short
text turn asking for the answer (``context_forced``), the next turn then being the last.

The zoom of :mod:`grounding_rl.rollout.answering` is a fixed two-turn conversation on the same ``continue_turn``: after
turn 1 (pass 1, the one pass) the environment restarts the context with the window (:func:`restart`), so turn 2 is
pass 1's prompt over the window's frames (it never sees turn 1's text). The one pass keeps its batched call
(:func:`grounding_rl.rollout.generation.generate_answers`: rows on one clip share its prefix prefill).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grounding_rl.data.video import SampledVideo
from grounding_rl.family import DEFAULT_VIDEO_LAYOUT
from grounding_rl.prompts.preprocessing import GRID, PIXELS, check_prompt_length
from grounding_rl.prompts.templates import get_template, instruction, render_prompt
from grounding_rl.rollout import tools

CONTEXT_NOTE = "The context is full."


@dataclass
class Trajectory:
    """One conversation about one clip.

    Attributes:
        query: the sentence; clip: the whole clip as sampled; protocol: ``native`` or ``text``.
        prompt_ids: the first prompt's ids (system, instruction with the tool offer, the clip's video tokens, the
            assistant turn's opening); prompt_mm: its ``mm_token_type_ids`` (2 at video tokens).
        completion_ids: every later token, model and tool turns; tool_mask: 1 at model tokens, 0 at tool tokens;
            completion_mm: ``mm_token_type_ids`` of the completion (2 at a window's video tokens).
        videos: per video in token order (the clip, then each window): ``{"pixel_values_videos", "video_grid_thw"
            (3,), "second_per_grid_ts" (Qwen2.5-VL), "key"}`` as the processor returned them, ``key`` naming the
            frames (equal keys, equal frames).
        messages: the chat so far (model turns as text), for the next tool turn's rendering.
        turns: per model turn ``{"text", "kind" (answer / call / error / truncated / final), "window", "error"}``.
        windows: the windows sampled for valid crops, (start, end) seconds; window_clips: their frames.
        calls, failures: crop requests, and those refused (malformed, outside the video, not sampleable).
        context_forced: a tool turn was replaced because the context was full.
        done: no more turns; truncated: the last model turn ran out of ``max_new_tokens`` (or sampled a vision
            placeholder) before its end-of-turn token.
        turn_logps: per model turn, the engine's log-probs of the tokens it sampled (vLLM; empty with transformers).
    """

    query: str
    clip: SampledVideo
    protocol: str
    prompt_ids: list[int]
    prompt_mm: list[int]
    videos: list[dict]
    messages: list[dict]
    completion_ids: list[int] = field(default_factory=list)
    tool_mask: list[int] = field(default_factory=list)
    completion_mm: list[int] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)
    window_clips: list[SampledVideo] = field(default_factory=list)
    calls: int = 0
    failures: int = 0
    context_forced: bool = False
    done: bool = False
    truncated: bool = False
    turn_logps: list[list[float]] = field(default_factory=list)

    @property
    def length(self) -> int:
        """Tokens so far (prompt + completion): the input of the next model turn."""
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def final_text(self) -> str:
        """The last model turn's text: the answer that is scored."""
        return self.turns[-1]["text"] if self.turns else ""

    def record(self) -> dict:
        """What a prediction or logged completion keeps: ``{"turns", "windows", "calls", "failures",
        "context_forced", "truncated"}`` (windows as [start, end] seconds)."""
        return {"turns": [dict(t, window=None if t["window"] is None else list(t["window"])) for t in self.turns],
                "windows": [list(w) for w in self.windows], "calls": self.calls, "failures": self.failures,
                "context_forced": self.context_forced, "truncated": self.truncated}


def _process(processor, family, text: str, video: SampledVideo | None, layout: str) -> dict:
    """Processor features of ``text`` (one turn or the first prompt) with at most one video."""
    if video is None:
        ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
        return {"input_ids": torch.tensor([ids]), "mm_token_type_ids": torch.zeros(1, len(ids), dtype=torch.long)}
    return processor(text=[family.video_prompt(processor, text, layout)], videos=[video.frames],
                     video_metadata=[family.video_metadata(video)], **family.processor_kwargs(), return_tensors="pt")


def _video_entry(features, video: SampledVideo) -> dict:
    """One video of a trajectory: its processor tensors and ``key``, the same for the same frames (path, frame
    times, size), so that a forward encodes each distinct clip or window once."""
    entry = {key: features[key][0] if key != PIXELS else features[key]
             for key in (PIXELS, GRID, "second_per_grid_ts") if key in features}
    entry["key"] = (video.path, tuple(round(float(t), 6) for t in video.timestamps), video.frames.shape[1:3])
    return entry


def start(processor, family, query: str, clip: SampledVideo, template: str, max_turns: int,
          layout: str = DEFAULT_VIDEO_LAYOUT, max_prompt_length: int | None = None, name: str = "") -> Trajectory:
    """The first prompt of a conversation: the template's instruction plus the tool offer, and the whole clip.

    Raises:
        ValueError: the first prompt is longer than ``max_prompt_length`` (named by ``name``, never truncated).
    """
    protocol = family.tool_protocol
    messages = tools.first_messages(instruction(query, template, clip.duration), get_template(template).video_first,
                                    protocol, max_turns)
    features = _process(processor, family, tools.render(processor, messages, protocol, True), clip, layout)
    ids = features["input_ids"][0].tolist()
    check_prompt_length(len(ids), max_prompt_length, name or f"{clip.path} ({query!r})")
    return Trajectory(query=query, clip=clip, protocol=protocol, prompt_ids=ids,
                      prompt_mm=features["mm_token_type_ids"][0].tolist(), videos=[_video_entry(features, clip)],
                      messages=messages)


def restart(processor, family, query: str, clip: SampledVideo, template: str,
            layout: str = DEFAULT_VIDEO_LAYOUT) -> Trajectory:
    """The zoom's second turn (module docstring): a conversation whose context is the one-pass prompt of ``query``
    over ``clip`` (the window; :func:`grounding_rl.prompts.preprocessing.build_inputs`' row, no tool offer)."""
    features = _process(processor, family, render_prompt(processor, query, template, clip.duration), clip, layout)
    return Trajectory(query=query, clip=clip, protocol=family.tool_protocol,
                      prompt_ids=features["input_ids"][0].tolist(), prompt_mm=features["mm_token_type_ids"][0].tolist(),
                      videos=[_video_entry(features, clip)], messages=[])


def _append(trajectory: Trajectory, ids: list[int], mm: list[int], model: bool) -> None:
    trajectory.completion_ids += ids
    trajectory.completion_mm += mm
    trajectory.tool_mask += [int(model)] * len(ids)


def step(trajectory: Trajectory, new_ids: list[int], processor, family, environment, *, max_turns: int,
         end_ids, stop_ids=(), max_prompt_length: int | None = None, layout: str = DEFAULT_VIDEO_LAYOUT) -> None:
    """Add one sampled model turn and, unless the trajectory ends, the tool turn it asks for.

    Args:
        new_ids: the turn's sampled ids (cut after its first id in ``end_ids``; trailing padding ignored).
        environment: ``(clip, window) -> (SampledVideo | None, error | None)``
            (:class:`grounding_rl.rollout.tools.CropEnvironment`).
        max_turns: K; the turn after the K-th request (or after a full context) had to answer: it ends the
            trajectory whatever it says.
        end_ids: end-of-turn ids (``<|im_end|>``, the model's EOS); stop_ids: ids cut with the rest of the turn (a
            sampled vision placeholder).
        max_prompt_length: the context rule (module docstring; None = no limit).
    """
    last = trajectory.calls >= max_turns or trajectory.context_forced
    end_ids, stop_ids = set(end_ids), set(stop_ids)
    ids, ended = [], False
    for token in new_ids:
        if token in stop_ids:
            break
        ids.append(int(token))
        if token in end_ids:
            ended = True
            break
    _append(trajectory, ids, [0] * len(ids), model=True)
    text = processor.tokenizer.decode(ids, skip_special_tokens=True)
    turn = {"text": text, "kind": "answer", "window": None, "error": None}
    trajectory.turns.append(turn)
    trajectory.messages = trajectory.messages + [{"role": "assistant", "content": text}]
    if not ended:
        turn["kind"], trajectory.done, trajectory.truncated = "truncated", True, True
        return
    request = tools.parse_tool_call(text, trajectory.clip.duration)
    if request.kind == "answer" or last:
        turn["kind"] = "answer" if request.kind == "answer" else "final"
        trajectory.done = True
        return
    _tool_turn(trajectory, turn, request, processor, family, environment, max_turns, max_prompt_length, layout)


def _tool_turn(trajectory: Trajectory, turn: dict, request, processor, family, environment, max_turns: int,
               max_prompt_length: int | None, layout: str) -> None:
    """:func:`step`'s tool turn for a model turn that asked for a window (``request``): the window's frames, or the
    error text, or the context note when it would not fit."""
    duration = trajectory.clip.duration
    trajectory.calls += 1
    final = trajectory.calls >= max_turns
    window_clip = None
    if request.kind == "call":
        window_clip, error = environment(trajectory.clip, request.window)
        if window_clip is None:
            request = tools.ToolRequest("error", error=f"the window cannot be sampled ({error})"[:200])
    turn.update(kind=request.kind, window=request.window, error=request.error)
    if request.kind == "error":
        trajectory.failures += 1
        message = tools.tool_message(trajectory.protocol, tools.error_text(request, duration, final), False)
    else:
        message = tools.tool_message(trajectory.protocol, tools.window_text(window_clip, final), True)
    features = _process(processor, family, tools.turn_suffix(processor, trajectory.messages, message,
                                                             trajectory.protocol), window_clip, layout)
    size = features["input_ids"].shape[1]
    if max_prompt_length is not None and trajectory.length + size > max_prompt_length:
        message = tools.tool_message(trajectory.protocol, f"{CONTEXT_NOTE} {tools.FINAL_NOTE}", False)
        features = _process(processor, family, tools.turn_suffix(processor, trajectory.messages, message,
                                                                 trajectory.protocol), None, layout)
        window_clip, trajectory.context_forced = None, True
        if trajectory.length + features["input_ids"].shape[1] > max_prompt_length:
            trajectory.done = True  # not even the note fits: the trajectory ends without an answer
            return
    elif request.kind == "call":
        trajectory.windows.append(request.window)
    if window_clip is not None:
        trajectory.window_clips.append(window_clip)
        trajectory.videos.append(_video_entry(features, window_clip))
    trajectory.messages = trajectory.messages + [message]
    _append(trajectory, features["input_ids"][0].tolist(), features["mm_token_type_ids"][0].tolist(), model=False)


def run_conversations(generate, trajectories: list[Trajectory], processor, family, environment, max_turns: int,
                      end_ids, stop_ids=(), max_prompt_length: int | None = None, layout: str = DEFAULT_VIDEO_LAYOUT
                      ) -> list[Trajectory]:
    """Run every trajectory to its end: at most ``max_turns`` (K) tool requests, then a forced answer.

    Args:
        generate: ``(list[Trajectory]) -> list[list[int]]``, one new model turn per unfinished trajectory, given in
            order (an engine's ``continue_turn`` with its sampling parameters, or scripted turns in tests).
        trajectories: from :func:`start`.
        environment: ``(clip, window) -> (SampledVideo | None, error | None)``
            (:class:`grounding_rl.rollout.tools.CropEnvironment`).
        end_ids, stop_ids, max_prompt_length, layout: as :func:`step`.

    Returns:
        ``trajectories``, each done.
    """
    for _ in range(max_turns + 1):
        active = [t for t in trajectories if not t.done]
        if not active:
            break
        for trajectory, ids in zip(active, generate(active)):
            step(trajectory, list(ids), processor, family, environment, max_turns=max_turns, end_ids=end_ids,
                 stop_ids=stop_ids, max_prompt_length=max_prompt_length, layout=layout)
    for trajectory in trajectories:
        trajectory.done = True
    return trajectories


def conversation_inputs(trajectories: list[Trajectory], pad_token_id: int) -> dict:
    """Model inputs over each trajectory's prompt + completion, left-padded (the layout generation uses).

    Returns:
        ``input_ids``, ``attention_mask``, ``mm_token_type_ids`` (B, L); ``pixel_values_videos`` (Σ patches, D) of
        every video of every row, row by row, in token order; ``video_grid_thw`` (V, 3) in the same order (V = all
        videos of the batch; the model's position ids consume them in that order); Qwen2.5-VL's
        ``second_per_grid_ts`` (V,).
    """
    rows = [t.prompt_ids + t.completion_ids for t in trajectories]
    mms = [t.prompt_mm + t.completion_mm for t in trajectories]
    videos = [v for t in trajectories for v in t.videos]
    width = max(len(r) for r in rows)
    input_ids = torch.tensor([[pad_token_id] * (width - len(r)) + r for r in rows], dtype=torch.long)
    masks = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    mm = torch.tensor([[0] * (width - len(m)) + m for m in mms], dtype=torch.long)
    out = {"input_ids": input_ids, "attention_mask": masks, "mm_token_type_ids": mm,
           PIXELS: torch.cat([v[PIXELS] for v in videos]), GRID: torch.stack([v[GRID] for v in videos])}
    if "second_per_grid_ts" in videos[0]:
        out["second_per_grid_ts"] = torch.stack([torch.as_tensor(v["second_per_grid_ts"]) for v in videos])
    return out


class HFTurns:
    """The conversation interface on transformers (:meth:`continue_turn`, as
    :meth:`grounding_rl.rollout.vllm.VLLMEngine.continue_turn`) for ``model`` (unwrapped); ``pad_token_id`` pads;
    ``eos_token_ids``, ``placeholder_ids`` end and cut a turn (:func:`step`'s ``end_ids``, ``stop_ids``), as the vLLM
    engine's attributes of those names. With ``cache_vision`` each distinct clip or window goes through the vision
    tower once for the whole rollout (:class:`grounding_rl.models.vision.VideoFeatureCache` in ``vision``, passed as
    ``mm_encoder_outputs``); off, every turn encodes every video of every row. The same tokens either way
    (``tests/test_multiturn.py``); the text of every turn is prefilled in full (no KV cache between turns)."""

    def __init__(self, model, pad_token_id: int, cache_vision: bool = True, eos_token_ids=(), placeholder_ids=()):
        from grounding_rl.models.vision import VideoFeatureCache

        self.model, self.pad_token_id = model, pad_token_id
        self.eos_token_ids, self.placeholder_ids = list(eos_token_ids), list(placeholder_ids)
        self.vision = VideoFeatureCache(model) if cache_vision else None

    def continue_turn(self, trajectories: list[Trajectory], params) -> list[list[int]]:
        """One new model turn per trajectory, in order, padded at the end (:func:`step` cuts it): one
        ``model.generate`` over every row's prompt + completion (:func:`conversation_inputs`), ``params`` a
        :class:`grounding_rl.rollout.generation.SamplingParams` (``max_new_tokens``: the per-turn budget)."""
        from grounding_rl.rollout.generation import generate

        inputs = conversation_inputs(trajectories, self.pad_token_id)
        if self.vision is not None:
            inputs.pop(PIXELS)
            inputs["mm_encoder_outputs"] = self.vision.encoder_outputs([v for t in trajectories for v in t.videos])
        inputs = {k: v.to(self.model.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        return generate(self.model, inputs, params, pad_token_id=self.pad_token_id).tolist()


def turn_engine(model, processor, engine=None, cache_vision: bool = True):
    """What continues conversations when answering (:mod:`grounding_rl.rollout.answering`): the vLLM ``engine`` when
    given, else :class:`HFTurns` on ``model`` with the checkpoint's completion padding."""
    if engine is not None:
        return engine
    from grounding_rl.models.tokens import completion_token_ids
    from grounding_rl.models.vision import placeholder_token_ids

    ids = completion_token_ids(processor.tokenizer, getattr(model, "generation_config", None))
    return HFTurns(model, ids.pad, cache_vision, ids.eos, placeholder_token_ids(model))
