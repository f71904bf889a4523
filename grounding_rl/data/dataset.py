"""The GRPO training data: canonical samples → per-item dicts, and a collator that loads the clips.

Items are light (paths and numbers); frames are decoded in the collator, so DataLoader workers can decode in
parallel. A clip that fails to load never kills or desynchronises a run: the item is replaced by another *sample*
(video, query and ground truth together) chosen deterministically from the failed index — the same choice on every
rank, so the G copies of a group, which may sit on different ranks, stay one clip — and never by a text-only item
(ranks taking different forward paths hang ZeRO-3). Substitutions are logged with the path and counted.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from torch.utils.data import Dataset

from grounding_rl.data.video import SampledVideo, VideoLoadError, VideoSettings, sample_frames
from grounding_rl.data.workers import die_with_parent

logger = logging.getLogger(__name__)


class GroundingDataset(Dataset):
    """Canonical samples as training items.

    Item ``i`` is ``{"index": i, "video": path, "query", "start", "end", "duration" (seconds), "qid", "spans",
    "raw_spans" (the annotated windows when validation merged or clamped them, else None),
    "prompt_template"}``; ``spans`` is the interval set ``[[s, e], …]`` of multi-span data (what the set rewards score
    against), else None; ``prompt_template`` the row's own template (a training set mixing sources), else None (the
    run's).

    Args:
        samples: :class:`grounding_rl.data.samples.Sample` objects (already validated), or dicts with those keys.

    ``duration_filter``: what the video-duration filter of the training entry points dropped
    (:func:`grounding_rl.cli.common.load_dataset`), None when it was off.
    """

    duration_filter: dict | None = None

    def __init__(self, samples: Sequence):
        self.samples = [s if isinstance(s, dict) else s.to_dict() for s in samples]
        if not self.samples:
            raise ValueError("the training set is empty")

    @classmethod
    def from_jsonl(cls, path: str | Path, video_root: str | Path | None = None) -> "GroundingDataset":
        """Read a canonical JSONL with :func:`grounding_rl.data.samples.load_samples` (its validation policy, for
        training: intervals outside the video are dropped and counted); a line's ``difficulty`` score
        (``grounding-rl difficulty``) is kept on its sample (:func:`grounding_rl.data.selection.read_scores`);
        so are its ``prompt_template`` and ``reward_spec`` (:func:`read_row_settings`). A file whose durations are off
        the clips' by a factor outside [0.5, 2] (milliseconds, frames; the first videos probed,
        :func:`grounding_rl.data.durations.check_first_videos`) is refused with a UserError, as ``eval`` refuses it."""
        from grounding_rl.data.durations import check_first_videos
        from grounding_rl.data.selection import FIELD, read_scores
        from grounding_rl.data.samples import load_samples

        scores, settings = read_scores(path), read_row_settings(path)
        loaded = load_samples(path, video_root=video_root, training=True)
        check_first_videos(loaded, str(path))
        samples = [s.to_dict() for s in loaded]
        samples = [{**s, FIELD: scores[s["qid"]]} if s["qid"] in scores else s for s in samples]
        return cls([{**s, **settings[s["qid"]]} if s["qid"] in settings else s for s in samples])

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict:
        s = self.samples[index]
        return {
            "index": int(index),
            "video": str(s["video"]),
            "query": s["query"],
            "start": float(s["start"]),
            "end": float(s["end"]),
            "duration": float(s["duration"]),
            "qid": str(s.get("qid", index)),
            "spans": None if s.get("spans") is None else [[float(a), float(b)] for a, b in s["spans"]],
            "raw_spans": None if s.get("raw_spans") is None else [[float(a), float(b)] for a, b in s["raw_spans"]],
            "prompt_template": s.get("prompt_template"),
        }


def within_duration(duration: float, min_video_duration: float | None, max_video_duration: float | None) -> bool:
    """Whether a video of ``duration`` seconds passes TimeLens2's video-length filter: kept when ``min_video_duration
    ≤ duration ≤ max_video_duration``, both bounds inclusive, None = no bound (MCG-NJU/TimeLens2 @a5ce450
    ``grpo/timelens/data/dataset.py`` ``_passes_filters``: dropped when ``duration < min_video_len`` or ``duration >
    max_video_len``, on the annotation's ``duration``; its recipes set 3 and 3,600). E.g. bounds (3, 3600): 2.9 →
    False, 3.0 → True, 3600.0 → True, 3600.5 → False."""
    if min_video_duration is not None and duration < min_video_duration:
        return False
    return max_video_duration is None or duration <= max_video_duration


def filter_by_duration(samples: Sequence[dict], min_video_duration: float | None,
                       max_video_duration: float | None) -> tuple[list[dict], int]:
    """``(kept, dropped)``: the samples whose ``duration`` (seconds, the canonical sample's: the annotation's, else the
    container's as :func:`grounding_rl.data.samples.load_samples` probed it) passes :func:`within_duration`, in
    order, and how many did not."""
    kept = [s for s in samples if within_duration(float(s["duration"]), min_video_duration, max_video_duration)]
    return kept, len(samples) - len(kept)


ROW_SETTINGS = ("prompt_template", "reward_spec")  # per-row settings a canonical line may carry


def read_row_settings(path: str | Path) -> dict[str, dict]:
    """``{qid: {"prompt_template"?, "reward_spec"?}}`` of the lines of a canonical JSONL that carry them: a training
    set mixing sources gives each row its source's prompt template (a name of
    :data:`grounding_rl.prompts.templates.TEMPLATES`) and, where given, its reward spec (TimeLens2's
    ``"name[:weight],…"``, e.g. ``"twass1,tiou,parse_penalty"``), as TimeLens2's per-source data config does
    (MCG-NJU/TimeLens2 @a5ce450 ``grpo/timelens/data/sources.py``). The qid is the line's ``qid``, else its 0-based
    line number. Values are checked where they are used (:mod:`grounding_rl.update.sources`).

    Raises:
        UserError: a value that is not a non-empty string (file and line).
    """
    from grounding_rl.errors import UserError
    from grounding_rl.jsonl_files import JsonLines

    out: dict[str, dict] = {}
    for number, row in JsonLines(path):
        found = {key: row[key] for key in ROW_SETTINGS if row.get(key) is not None}
        for key, value in found.items():
            if not isinstance(value, str) or not value.strip():
                raise UserError(f"{path}:{number}: {key} must be a non-empty string, got {value!r}")
        if found:
            out[str(row["qid"]) if row.get("qid") is not None else str(number - 1)] = found
    return out


def substitute_index(failed: int, attempt: int, size: int) -> int:
    """The ``attempt``-th (1-based) substitute for the failed item ``failed`` in a dataset of ``size`` items:
    ``(failed + attempt) mod size`` — a pure function of the index, hence the same on every rank."""
    return (failed + attempt) % size


class VideoCollator:
    """Collate items into a list of dicts with the decoded clip under ``"clip"`` (:class:`SampledVideo`).

    Each distinct index is decoded once per call (a group's G copies share one decode). When a clip fails, the
    item becomes the first loadable :func:`substitute_index` candidate, with ``"substituted_from"`` set to the failed
    item's index (None otherwise). Called in a DataLoader worker, the worker ends when the process that made the
    collator dies (:func:`grounding_rl.data.workers.die_with_parent`). The first call (in the main process or worker
    0) logs each clip as it is decoded (INFO, ``first batch: clip k of n decoded in s (path)``): long
    high-resolution clips take tens of seconds before the first step shows anything.

    Args:
        dataset: the :class:`GroundingDataset` (for substitutes).
        settings: frame sampling settings.
        cache: optional frame cache with ``get(path, settings)`` / ``put(path, settings, video)``.
        max_attempts: substitutes tried before giving up.

    Raises:
        VideoLoadError: no loadable clip among ``max_attempts`` substitutes (the message names the first path).
    """

    def __init__(self, dataset: GroundingDataset, settings: VideoSettings, cache=None, max_attempts: int = 32):
        self.dataset = dataset
        self.settings = settings
        self.cache = cache
        self.max_attempts = max_attempts
        self._last_key, self._last = None, []
        self._bad_paths: set[str] = set()
        self._parent_pid = os.getpid()  # the process that makes the trainer's DataLoader
        self._first = True  # the first batch's decoding is logged clip by clip

    def _load(self, path: str) -> SampledVideo:
        if path in self._bad_paths:
            raise VideoLoadError(f"{path}: failed earlier")
        try:
            return sample_frames(path, self.settings, cache=self.cache)
        except VideoLoadError:
            self._bad_paths.add(path)
            raise

    def load_item(self, index: int) -> dict:
        """The item at ``index`` with its clip, or its substitute (see the class docstring)."""
        item = self.dataset[index]
        try:
            return {**item, "clip": self._load(item["video"]), "substituted_from": None}
        except VideoLoadError as err:
            first_error = err
        size = len(self.dataset)
        for attempt in range(1, min(self.max_attempts, size - 1) + 1):
            candidate = self.dataset[substitute_index(index, attempt, size)]
            try:
                clip = self._load(candidate["video"])
            except VideoLoadError:
                continue
            logger.warning("skipped sample %d (qid %s): %s; substituted sample %d (%s)", index, item["qid"],
                           first_error, candidate["index"], candidate["video"])
            return {**candidate, "clip": clip, "substituted_from": index}
        raise VideoLoadError(f"{item['video']}: cannot load it nor any of {self.max_attempts} substitutes "
                             f"({first_error})")

    def __call__(self, items: list[dict]) -> list[dict]:
        die_with_parent(self._parent_pid)  # in a DataLoader worker: end with the trainer, however it dies
        # TRL's RepeatSampler yields each generation batch steps_per_generation × num_iterations times in a row and
        # the trainer generates from the first only: decode a repeated batch once
        key = tuple(item["index"] for item in items)
        if key == self._last_key:
            return [dict(item) for item in self._last]
        loaded: dict[int, dict] = {}
        out = []
        show = self._first and _first_worker()
        if show:
            count = len({item["index"] for item in items})
            logger.info("first batch: decoding %d clip(s) (long high-resolution clips take a while)", count)
        for item in items:
            index = item["index"]
            if index not in loaded:
                started = time.perf_counter()
                loaded[index] = self.load_item(index)
                if show:
                    logger.info("first batch: clip %d of %d decoded in %.1f s (%s)", len(loaded), count,
                                time.perf_counter() - started, loaded[index]["video"])
            out.append(dict(loaded[index]))
        self._first = False
        self._last_key, self._last = key, out
        return [dict(item) for item in out]


def _first_worker() -> bool:
    """True in the main process and in DataLoader worker 0 (which decodes the first batch), so the first batch's
    progress is logged once."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return info is None or info.id == 0


def resumable_repeat_sampler(data_source, mini_repeat_count: int, batch_size: int, repeat_count: int,
                             shuffle: bool, seed: int):
    """TRL's ``RepeatSampler`` whose order in epoch e is the same in a fresh run and in a run resumed at epoch e.

    ``RepeatSampler`` draws each epoch's permutation from one generator seeded at construction, so a run resumed in a
    later epoch (``transformers.Trainer`` builds a new sampler and does not replay earlier epochs) would draw the first
    epoch's order again. Here ``set_epoch(e)`` (called by the Trainer at the start of every epoch) reseeds the
    generator and replays the e earlier permutations: an uninterrupted run keeps exactly TRL's order.

    Arguments as ``trl.trainer.utils.RepeatSampler``.
    """
    import torch
    from trl.trainer.utils import RepeatSampler

    class ResumableRepeatSampler(RepeatSampler):
        def set_epoch(self, epoch: int) -> None:
            if not self.shuffle:
                return
            self.generator = torch.Generator().manual_seed(self.seed)
            for _ in range(epoch):
                torch.randperm(self.num_samples, generator=self.generator)

    return ResumableRepeatSampler(data_source=data_source, mini_repeat_count=mini_repeat_count, batch_size=batch_size,
                                  repeat_count=repeat_count, shuffle=shuffle, seed=seed)


def filtered_repeat_sampler(data_source, selection, mini_repeat_count: int, batch_size: int, repeat_count: int,
                            seed: int, on_advance=None):
    """TRL's ``RepeatSampler`` over the samples an :class:`grounding_rl.data.selection.OnlineRangeFilter` keeps.

    An epoch keeps the full set's length (``len(data_source) // batch_size`` generation batches, as ``RepeatSampler``),
    because ``transformers.Trainer`` counts steps per epoch once and resumes by that count: epoch e cycles through the
    kept samples, each pass a fresh permutation, until that length is filled, so every kept sample is seen at least
    once per epoch. (Time-R1 instead starts a shorter run on each filtered set.) ``set_epoch(e)`` first applies the
    filter for the epochs completed (:meth:`OnlineRangeFilter.advance_to`; ``on_advance(counts)`` is called with
    each transition's counts), then fixes epoch e's order from ``(seed, e)`` and the kept set alone: the same on every
    rank, in a fresh run and in one resumed from a checkpoint holding the filter's state.

    Arguments as ``trl.trainer.utils.RepeatSampler`` (always shuffled), plus ``selection`` and ``on_advance``.
    """
    import numpy as np
    import torch
    from trl.trainer.utils import RepeatSampler

    class FilteredRepeatSampler(RepeatSampler):
        epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def epoch_order(self) -> list[int]:
            counts = selection.advance_to(self.epoch)
            if counts is not None and on_advance is not None:
                on_advance(counts)
            kept = list(selection.active)
            state = np.random.SeedSequence([int(self.seed), int(self.epoch)]).generate_state(1)[0]
            generator = torch.Generator().manual_seed(int(state))
            total = (self.num_samples // self.batch_size) * self.batch_size
            order: list[int] = []
            while len(order) < total:
                order += [kept[i] for i in torch.randperm(len(kept), generator=generator).tolist()]
            return order[:total]

        def __iter__(self):
            order = self.epoch_order()
            for start in range(0, len(order), self.batch_size):
                chunk = order[start:start + self.batch_size]
                for _ in range(self.repeat_count):
                    for index in chunk:
                        for _ in range(self.mini_repeat_count):
                            yield index

    return FilteredRepeatSampler(data_source=data_source, mini_repeat_count=mini_repeat_count, batch_size=batch_size,
                                 repeat_count=repeat_count, shuffle=True, seed=seed)


def weighted_repeat_sampler(data_source, weights, mini_repeat_count: int, batch_size: int, repeat_count: int,
                            seed: int):
    """TRL's ``RepeatSampler`` whose epoch order is a weighted permutation: ``torch.multinomial(weights, N,
    replacement=False)`` from a generator seeded with ``seed`` (TimeLens2's ``RepeatSampler`` with
    ``sample_weights``, MCG-NJU/TimeLens2 @a5ce450 ``grpo/timelens/trainer.py``): heavy samples come early, each
    sample once per epoch, so a run that stops at ``max_steps`` within the first epoch trains on the heavy ones.
    ``set_epoch(e)`` reseeds and replays the e earlier draws, so epoch e's order is the same fresh and resumed, and
    the same on every rank (a function of the weights and ``seed``).

    Args:
        weights: (N,) non-negative weights (normalised here, in float64), at least N of them > 0.
        the rest: as ``trl.trainer.utils.RepeatSampler`` (always shuffled).

    Raises:
        ValueError: the weights' length is not the dataset's, or a weight is negative or not finite.
    """
    import torch
    from trl.trainer.utils import RepeatSampler

    w = torch.as_tensor(weights, dtype=torch.float64)
    if w.numel() != len(data_source) or bool((w < 0).any()) or not bool(torch.isfinite(w).all()):
        raise ValueError(f"sample weights: {w.numel()} finite non-negative values for {len(data_source)} samples "
                         "needed")
    w = w / w.sum()

    class WeightedRepeatSampler(RepeatSampler):
        def set_epoch(self, epoch: int) -> None:
            self.generator = torch.Generator().manual_seed(self.seed)
            for _ in range(epoch):
                torch.multinomial(w, self.num_samples, replacement=False, generator=self.generator)

        def __iter__(self):
            order = torch.multinomial(w, self.num_samples, replacement=False, generator=self.generator).tolist()
            total = (self.num_samples // self.batch_size) * self.batch_size
            for start in range(0, total, self.batch_size):
                chunk = order[start:start + self.batch_size]
                for _ in range(self.repeat_count):
                    for index in chunk:
                        for _ in range(self.mini_repeat_count):
                            yield index

    return WeightedRepeatSampler(data_source=data_source, mini_repeat_count=mini_repeat_count, batch_size=batch_size,
                                 repeat_count=repeat_count, shuffle=True, seed=seed)
