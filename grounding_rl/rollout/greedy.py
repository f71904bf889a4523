"""Greedy answers over a set of queries, as ``eval``, ``difficulty`` and validation during GRPO training run them:
queries grouped by video, videos sharded across processes, clips decoded in background workers while the model
generates.

Benchmarks ask several questions about each video (Charades-STA test: 3,720 queries on 1,334 videos; ActivityNet
Captions val_2: 17,031 on 4,885). Here each video is decoded once for all its pending queries, its rows in a batch share
one vision encoding (:func:`grounding_rl.rollout.generation.generate_answers` shares rows that pass the same clip
object), and a ``torch.utils.data.DataLoader`` over videos decodes the next clips while the current batch generates.
At most ``batch_size + num_workers · prefetch_factor`` decoded clips are held at once. A clip that fails to load is a
recorded failure for each of its queries, never dropped and never a crash. :func:`clip_batches` then
:func:`answer_batch` is the one pass of :mod:`grounding_rl.rollout.answering`.
"""
from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterator, Sequence

import torch

from grounding_rl.data.video import VideoLoadError, VideoSettings, sample_frames
from grounding_rl.data.workers import die_with_parent
from grounding_rl.family import DEFAULT_VIDEO_LAYOUT
from grounding_rl.rollout.generation import SamplingParams, generate_answers

PREFETCH_FACTOR = 2


def query_seed(seed: int, key: str) -> int:
    """The seed of one query's sampled answer: the first 63 bits of SHA-256 of ``"{seed}/{key}"`` (``key`` the
    query's qid), so that the answer depends on the run's seed and the query alone — not on which queries ran before
    it, the batch it sits in, the shard or the number of processes — and a resumed sampled pass writes what an
    uninterrupted one does. E.g. ``query_seed(0, "3")`` ≠ ``query_seed(1, "3")``; a pure function, in [0, 2⁶³)."""
    digest = hashlib.sha256(f"{int(seed)}/{key}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def group_by_video(videos: Sequence[str]) -> list[tuple[str, list[int]]]:
    """``[(video, [positions of its queries])]`` in order of first appearance; positions index ``videos``."""
    groups: dict[str, list[int]] = {}
    for position, video in enumerate(videos):
        groups.setdefault(video, []).append(position)
    return list(groups.items())


def shard_by_video(groups: list, rank: int, world_size: int) -> list:
    """The contiguous run of whole videos that process ``rank`` of ``world_size`` evaluates.

    Videos stay whole (their queries share one decode and encoding); the split balances query counts: video i goes to
    rank ⌊world_size · (queries before it + half of its own) / total⌋. Every video belongs to exactly one rank.
    """
    total = sum(len(positions) for _, positions in groups)
    if world_size == 1 or total == 0:
        return list(groups)
    out, before = [], 0
    for group in groups:
        size = len(group[1])
        if min(world_size - 1, int(world_size * (before + size / 2) / total)) == rank:
            out.append(group)
        before += size
    return out


class VideoClips(torch.utils.data.Dataset):
    """Item i = ``(i, SampledVideo | None, error | None)`` for the i-th video; decoded in DataLoader workers.

    Args:
        videos: video paths.
        settings: frame sampling settings.
        frame_cache, frame_cache_bytes: optional on-disk :class:`grounding_rl.data.cache.FrameCache` (folder, bound).
    """

    def __init__(self, videos: Sequence[str], settings: VideoSettings, frame_cache: str | None = None,
                 frame_cache_bytes: int = 0):
        self.videos, self.settings = list(videos), settings
        self.frame_cache, self.frame_cache_bytes = frame_cache, frame_cache_bytes
        self._cache = None

    def __len__(self) -> int:
        return len(self.videos)

    def __getitem__(self, index: int):
        if self.frame_cache and self._cache is None:
            from grounding_rl.data.cache import FrameCache

            self._cache = FrameCache(self.frame_cache, self.frame_cache_bytes)
        try:
            return index, sample_frames(self.videos[index], self.settings, cache=self._cache), None
        except VideoLoadError as err:
            return index, None, str(err)


def _identity(item):
    return item


def clip_batches(groups: list[tuple[str, list[int]]], settings: VideoSettings, batch_size: int,
                 num_workers: int = 2, frame_cache: str | None = None, frame_cache_bytes: int = 0
                 ) -> Iterator[list[tuple[int, object, str | None]]]:
    """Batches of ``(position, SampledVideo | None, error | None)`` rows, at most ``batch_size`` each, in order.

    The rows of one video share the decoded clip object (so they share its vision encoding); a video with more
    queries than ``batch_size`` continues into the next batch with the same clip. Clips are decoded by
    ``num_workers`` background processes (0 = in this process), ``PREFETCH_FACTOR`` videos ahead each; they end
    when this process dies, however it dies (:func:`grounding_rl.data.workers.die_with_parent`).
    """
    dataset = VideoClips([video for video, _ in groups], settings, frame_cache, frame_cache_bytes)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, shuffle=False, num_workers=max(0, num_workers), collate_fn=_identity,
        prefetch_factor=PREFETCH_FACTOR if num_workers > 0 else None,
        worker_init_fn=functools.partial(die_with_parent, os.getpid()))
    batch: list = []
    for index, video, error in loader:
        for position in groups[index][1]:
            batch.append((position, video, error))
            if len(batch) == batch_size:
                yield batch
                batch = []
    if batch:
        yield batch


def answer_batch(model, processor, batch: list[tuple[int, object, str | None]], queries: Sequence[str],
                 template: str, decoding: SamplingParams, engine=None, video_layout: str = DEFAULT_VIDEO_LAYOUT,
                 seeds: Sequence[int] | None = None) -> list[tuple[int, str | None, str | None, dict | None]]:
    """Answers of ``model`` (eval mode, unwrapped) decoded with ``decoding`` for one :func:`clip_batches` batch,
    ``queries[position]`` each, in batch order: ``(position, answer | None, error | None, sampling | None)``,
    ``sampling`` the rate and size the clip was sampled at (:meth:`grounding_rl.data.video.SampledVideo.sampling`;
    None when it did not load).

    A row whose clip did not load keeps its load error. On out-of-memory with more than one clip the clips are retried
    one at a time; a single clip that still does not fit gets the error ``"out of memory: …"``, like a clip that does
    not load. ``engine``: a vLLM engine for ``generate_answers`` (None = transformers' ``generate``); ``seeds``: with
    sampled ``decoding`` (``difficulty --num-rollouts``), each position's seed (:func:`query_seed`): every row is then
    generated alone after ``torch.manual_seed(seeds[position])``, so its answer depends on its seed only
    (``generate`` draws a batch's tokens from one global generator), and a clip's rows no longer share one vision
    encoding.
    """
    seeded = seeds is not None and decoding.do_sample
    results = {position: (position, None, error) for position, video, error in batch if video is None}
    ok = [(position, video) for position, video, _ in batch if video is not None]
    sampling = {position: video.sampling() for position, video in ok}
    groups = [[item] for item in ok] if seeded else [ok] if ok else []
    while groups:
        group = groups.pop(0)
        if seeded:
            torch.manual_seed(seeds[group[0][0]])  # every device's generator: the row's draws from its own seed
        try:
            answers = generate_answers(model, processor, [queries[p] for p, _ in group], [v for _, v in group],
                                       template, decoding,
                                       **({"engine": engine} if engine is not None else {}), video_layout=video_layout)
        except torch.OutOfMemoryError as err:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            if len(group) > 1:
                groups = [[item] for item in group] + groups
                continue
            position = group[0][0]
            results[position] = (position, None, f"out of memory: {err}"[:300])
            continue
        for (position, _), answer in zip(group, answers):
            results[position] = (position, answer, None)
    return [(*results[position], sampling.get(position)) for position, _, _ in batch]
