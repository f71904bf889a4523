"""The zoom's pass 2, shared by ``--zoom`` (:mod:`grounding_rl.eval.zoom` explains the choices) and the two-pass zoom
recipe: :class:`ZoomEnvironment` turns pass 1's answer into the window turn 2 sees, so that training and test widen,
sample and map a window alike; :func:`zoom_rows` runs turn 2 for :mod:`grounding_rl.rollout.answering` (Qwen2.5-VL's
positions moved by :func:`video_time_offsets`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from grounding_rl.data.video import SampledVideo, VideoSettings
from grounding_rl.errors import UserError
from grounding_rl.prompts.preprocessing import CheckedSettings

FALLBACK_WINDOW = "the centre half [d/4, 3d/4]"


@dataclass(frozen=True)
class ZoomSettings(CheckedSettings):
    """How the zoom's pass 2 looks (:mod:`grounding_rl.eval.zoom` explains the choices), each setting declared here
    once (a bad value raises UserError naming the flag): ``--zoom-<name>`` on ``eval`` and ``infer``; ``zoom_margin``,
    ``zoom_spend`` in a training YAML (time: the family's, :meth:`grounding_rl.family.Family.zoom_time`, as None's)."""

    flag = "--zoom-"

    margin: float = field(default=1.0, metadata={
        "minimum": 0, "help": "the zoom's window is the first answer widened on each side by this fraction of its "
        "length (≥ 0), and at least by two frames of the first pass"})
    spend: str = field(default="fps", metadata={
        "choices": ("fps", "resolution"), "help": "what the zoom's pass 2 spends pass 1's frame budget on: fps "
        "(default: as many frames as pass 1, over the window) or resolution (pass 1's rate, larger frames)"})
    time: str | None = field(default=None, metadata={
        "choices": ("video", "window"), "help": "Qwen2.5-VL: the window's time positions start at 0 and the answer "
        "is shifted by the window's start (window, its default) or at the window's true time in the video (video); "
        "Qwen3-VL always shows the true timestamps (video)"})

    def check_family(self, family, engine: str = "hf") -> None:
        """Raises UserError for a ``time`` the :class:`grounding_rl.family.Family` does not take (``window`` on
        Qwen3-VL: its pass-2 timestamps are always the window's true ones) and for a position shift (``video`` with
        Qwen2.5-VL) on the vLLM engine (the shift is applied to transformers' ``get_rope_index``)."""
        if self.time == "window" and not family.positional_time:
            raise UserError(f"--zoom-time {self.time} is for Qwen2.5-VL; {family.display_name}'s pass-2 prompt shows "
                            "the window's true timestamps (use --zoom-time video)")
        if family.window_position_shift(self.time) and engine != "hf":
            raise UserError("--zoom-time video shifts transformers' position ids; with --engine vllm use "
                            "--zoom-time window")


def zoom_window(answer: tuple[float, float] | None, duration: float, margin: float, pass1_fps: float
                ) -> tuple[tuple[float, float], bool]:
    """The pass-2 window for pass 1's parsed answer.

    [s − m, e + m] with m = max(margin · (e − s), 2 / pass1_fps), clipped to [0, duration] (s, e first clamped into
    the clip and ordered). No answer (None), or one that lies wholly outside the clip, gives the fallback
    [duration / 4, 3 · duration / 4].

    Args:
        answer: (start, end) seconds as parsed, or None.
        duration: the video's length, seconds (> 0).
        margin: ≥ 0, fraction of the answer's length added on each side.
        pass1_fps: the rate pass 1 sampled at (frames per second, > 0): 2 / pass1_fps is one temporal patch.

    Returns:
        ((start, end) seconds, fallback). E.g. answer (40, 50), duration 150, margin 1, rate 0.25 →
        ((30.0, 60.0), False) (m = max(10, 8)); answer (2, 3), same → ((0.0, 11.0), False) (m = 8); None →
        ((37.5, 112.5), True).
    """
    if answer is not None:
        s, e = sorted((min(max(float(answer[0]), 0.0), duration), min(max(float(answer[1]), 0.0), duration)))
        if not (s == e and (s <= 0.0 or s >= duration)):
            pad = max(margin * (e - s), 2.0 / pass1_fps)
            return (max(0.0, s - pad), min(duration, e + pad)), False
    return (duration / 4.0, 3.0 * duration / 4.0), True


class ZoomEnvironment:
    """The one place that composes pass 1 → window → pass 2: its reply to turn 1 is the window of pass 1's answer
    (:func:`zoom_window`, ``margin``) sampled as the crop tool's (:class:`grounding_rl.rollout.tools.CropEnvironment`:
    ``settings``, ``spend``), which turn 2 sees in place of the clip, and the origin of turn 2's answers: the window's
    first frame time where they are in window time (:meth:`grounding_rl.family.Family.window_answer_shift`), else 0."""

    def __init__(self, settings: VideoSettings, spend: str, margin: float, shift: bool):
        from grounding_rl.rollout.tools import CropEnvironment

        self.sample, self.margin, self.shift, self.clips = CropEnvironment(settings, spend), margin, shift, {}

    def __call__(self, text: str | None, clip: SampledVideo, key=None) -> tuple:
        """The reply to pass 1's ``text`` (None: none) on ``clip``: ``([a, b] seconds to 6 places, fallback, window
        clip or None, why not or None, origin seconds)``; equal ``key`` and window sample once."""
        from grounding_rl.prompts.parsing import parse_answer

        window, fallback = zoom_window(parse_answer(text), clip.duration, self.margin, float(clip.sampling()["fps"]))
        if (key, window) not in self.clips:
            self.clips[key, window] = self.sample(clip, window)
        window_clip, error = self.clips[key, window]
        origin = float(window_clip.timestamps[0]) if window_clip is not None and self.shift else 0.0
        return [round(window[0], 6), round(window[1], 6)], fallback, window_clip, error, origin


def to_absolute(answer: tuple[float, float] | None, origin: float) -> tuple[float, float] | None:
    """Pass 2's parsed answer in the video's seconds: ``origin`` (:class:`ZoomEnvironment`'s, 0 for an answer already in
    them) added to both ends as floats; None stays None."""
    return None if answer is None else (answer[0] + origin, answer[1] + origin)


def window_problems(setting: str, video_sampler: str, prompt_template: str, why_one: str) -> list[str]:
    """What stops ``setting`` (an option that samples windows of a clip: the crop tool, the zoom, crop trajectories;
    in training, eval and infer) from running with these settings, one message each: windows come from the ``exact`` sampler only
    (:func:`grounding_rl.data.video.sample_window`), and a window looks again at one answer, not a set of intervals
    (``why_one`` ends that message)."""
    from grounding_rl.prompts.templates import PROMPT_TEMPLATES, is_set_template

    out = []
    if video_sampler != "exact":
        out.append(f"{setting} samples windows with the exact sampler (video_sampler is {video_sampler!r})")
    if prompt_template in PROMPT_TEMPLATES and is_set_template(prompt_template):
        out.append(f"{setting}: prompt_template {prompt_template!r} asks for a set of intervals; {why_one}")
    return out


def position_offset(origin: float, tokens_per_second: float) -> int:
    """Temporal position ids by which ``time="video"`` shifts a Qwen2.5-VL window starting at ``origin`` seconds:
    ``round(origin · tokens_per_second)`` (the whole-video prompt puts time t at ``t · tokens_per_second``; e.g.
    30.25 s at 2 tokens per second → 60)."""
    return int(round(origin * tokens_per_second))


def shift_video_positions(positions, mm_token_type_ids, attention_mask, offsets):
    """Add ``offsets[b]`` to the temporal position id (row 0) of every video token (``mm_token_type_ids`` 2) of row
    b, and recompute the rope deltas as transformers does (max position + 1 − the row's unpadded length).

    Args:
        positions: (3, B, L) long, from ``get_rope_index``.
        mm_token_type_ids: (B, L); attention_mask: (B, L) or None.
        offsets: B ints.

    Returns:
        ``(positions (3, B, L), deltas (B, 1))``; the input is not modified.
    """
    import torch

    shift = torch.as_tensor(offsets, dtype=positions.dtype, device=positions.device).view(-1, 1)
    positions = positions.clone()
    positions[0] = positions[0] + (mm_token_type_ids.to(positions.device) == 2).to(positions.dtype) * shift
    lengths = (attention_mask.sum(dim=-1) if attention_mask is not None
               else torch.full((positions.shape[1],), positions.shape[2])).to(positions.device)
    deltas = positions.amax(dim=(0, 2)) + 1 - lengths
    return positions, deltas.view(-1, 1)


@contextlib.contextmanager
def video_time_offsets(model, offsets: list[int] | None):
    """Within the block, the model's ``get_rope_index`` shifts the video tokens' temporal positions of row b by
    ``offsets[b]`` (:func:`shift_video_positions`): a Qwen2.5-VL window placed at its time in the whole video. None
    changes nothing."""
    if offsets is None or not any(offsets):
        yield
        return
    from grounding_rl.models.vision import core_model

    core = core_model(model)
    original = core.get_rope_index

    def shifted(input_ids, *args, **kwargs):
        positions, _ = original(input_ids, *args, **kwargs)
        types = kwargs.get("mm_token_type_ids", args[0] if args else None)
        return shift_video_positions(positions, types, kwargs.get("attention_mask"), offsets)

    core.get_rope_index = shifted
    try:
        yield
    finally:
        del core.get_rope_index


def zoom_rows(model, processor, rows: list, queries, config, max_new_tokens: int, zoom, engine=None,
              on_prompt=None) -> list[dict]:
    """Pass 2 for pass-1 ``rows`` ``(Answer, clip)`` whose clip loaded (:mod:`grounding_rl.rollout.answering`),
    ``zoom`` a :class:`ZoomSettings`, ``config`` the preprocessing: the windows of a
    :class:`ZoomEnvironment` answered greedily by one ``continue_turn`` of the engine (turn 2,
    :func:`grounding_rl.rollout.conversation.restart`). Returns one dict per row, in order (the ``zoom`` of
    :func:`grounding_rl.eval.zoom.zoom_record`): ``{"window", "fallback", "answer", "interval" (the video's seconds),
    "sampling", "error"}``; a window that cannot be sampled, or a pass that runs out of memory, gives ``error`` (the
    record keeps pass 1's answer). ``on_prompt(position, clip)`` is called with each pass-2 clip before generation
    (``--print-prompt``)."""
    import torch

    from grounding_rl.family import family_of
    from grounding_rl.prompts.parsing import parse_answer
    from grounding_rl.rollout import conversation as conv
    from grounding_rl.rollout.generation import SamplingParams

    family, out, turn2 = family_of(processor), [], []
    environment = ZoomEnvironment(config.video, zoom.spend, zoom.margin, family.window_answer_shift(zoom.time))
    for answer, clip in rows:
        window, fallback, window_clip, error, origin = environment(answer.text, clip, answer.position)
        out.append({"window": window, "fallback": fallback, "answer": None, "interval": None,
                    "sampling": None if window_clip is None else window_clip.sampling(),
                    "error": None if error is None else f"zoom window: {error}"[:300]})
        if window_clip is not None:
            turn2.append((out[-1], origin, conv.restart(processor, family, queries[answer.position], window_clip,
                                                        config.prompt_template, config.video_layout)))
            if on_prompt is not None:
                on_prompt(answer.position, window_clip)
    offsets = None
    if turn2 and family.window_position_shift(zoom.time):
        from grounding_rl.models.vision import unwrap

        per_second = unwrap(model).config.vision_config.tokens_per_second
        offsets = [position_offset(float(t.clip.timestamps[0]), per_second) for _, _, t in turn2]
    try:  # the windows are distinct: nothing for a vision cache to share
        with video_time_offsets(model, offsets):
            ids = conv.turn_engine(model, processor, engine, cache_vision=False).continue_turn(
                [t for _, _, t in turn2], SamplingParams.greedy(max_new_tokens)) if turn2 else []
    except torch.OutOfMemoryError as err:  # pass 1's answers stand, with the reason (as a clip that does not load)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        for item, _, _ in turn2:
            item["error"] = f"zoom pass: out of memory: {err}"[:300]
        return out
    texts = processor.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) if ids else []
    for (item, origin, _), text in zip(turn2, texts):
        item.update(answer=text, interval=to_absolute(parse_answer(text), origin))
    return out
