"""The zoom's pass-2 window, its clip and its time: pure pieces shared by evaluation's ``--zoom``
(:mod:`grounding_rl.eval.zoom`, which explains the choices) and training's fixed two-pass zoom
(:mod:`grounding_rl.update.recipes.two_pass_zoom`), so that a window is widened, sampled and mapped back to the
video's seconds the same way at training and at test.
"""
from __future__ import annotations

from grounding_rl.data.video import SampledVideo, VideoSettings

ZOOM_SPEND = ("fps", "resolution")
ZOOM_TIME = ("video", "window")
DEFAULT_MARGIN = 1.0
FALLBACK_WINDOW = "the centre half [d/4, 3d/4]"


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


def window_origin(video: SampledVideo) -> float:
    """Seconds at which pass 2's positional time starts: its first frame's presentation time."""
    return float(video.timestamps[0])


def to_absolute(answer: tuple[float, float] | None, origin: float, shift: bool) -> tuple[float, float] | None:
    """Pass 2's parsed answer in the video's absolute time: ``(s + origin, e + origin)`` when ``shift``
    (:meth:`grounding_rl.family.Family.window_answer_shift`), else unchanged; None stays None."""
    if answer is None:
        return None
    return (answer[0] + origin, answer[1] + origin) if shift else (float(answer[0]), float(answer[1]))


def pass2_clip(path: str, window: tuple[float, float], settings: VideoSettings, first: dict,
               spend: str = "fps") -> SampledVideo:
    """The window ``(start, end)`` seconds of the video at ``path``, sampled under pass 1's budget (``first``: pass
    1's :meth:`SampledVideo.sampling`; ``spend``: :func:`grounding_rl.data.video.window_settings`) by seeking
    (:func:`grounding_rl.data.video.sample_window`); timestamps stay absolute seconds.

    Raises:
        WindowError, VideoLoadError, ValueError: as :func:`grounding_rl.data.video.sample_window` /
        ``window_settings``.
    """
    from grounding_rl.data.video import sample_window, window_settings

    return sample_window(path, window[0], window[1], window_settings(settings, first, window, spend))


def window_problems(setting: str, video_sampler: str, prompt_template: str, why_one: str) -> list[str]:
    """What stops ``setting`` (a training option that samples windows of a clip: the crop tool, two-pass zoom, crop
    trajectories) from running with these settings, one message each: windows come from the ``exact`` sampler only
    (:func:`grounding_rl.data.video.sample_window`), and a window looks again at one answer, not a set of intervals
    (``why_one`` ends that message)."""
    from grounding_rl.prompts.templates import PROMPT_TEMPLATES, is_set_template

    out = []
    if video_sampler != "exact":
        out.append(f"{setting} samples windows with the exact sampler (video_sampler is {video_sampler!r})")
    if prompt_template in PROMPT_TEMPLATES and is_set_template(prompt_template):
        out.append(f"{setting}: prompt_template {prompt_template!r} asks for a set of intervals; {why_one}")
    return out
