"""On-disk cache of sampled frames: ``.npy`` frames plus a small JSON of metadata, no pickle.

Key: (resolved path, file size, mtime in ns, sampling settings, :data:`CACHE_VERSION`), hashed with SHA-256. An entry
is two files, ``<key>.npy`` and ``<key>.json``; the JSON is written last, so its presence marks a complete entry.
Every file is written to a temporary name in the cache folder and moved into place with ``os.replace`` (atomic on
POSIX), so several processes may read and write the same cache. The total size is bounded: after each ``put`` the
least recently used entries (JSON mtime, refreshed on every hit) are deleted until the cache fits ``max_bytes``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

import numpy as np

from grounding_rl.data.video import SampledVideo, VideoSettings
from grounding_rl.errors import disk_error
from grounding_rl.paths import follow_umask

logger = logging.getLogger(__name__)

CACHE_VERSION = 2  # bump when decoding, resizing or frame times change


class FrameCache:
    """Sampled frames on disk, bounded to ``max_bytes``.

    Args:
        root: cache folder (created if missing).
        max_bytes: bound on the total size of the cache's files; an entry larger than this is not stored.
    """

    def __init__(self, root: str | Path, max_bytes: int = 20 * 2**30):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = int(max_bytes)
        self.full = False  # a write failed for lack of space (or a file-size limit): no more writes

    @staticmethod
    def key_fields(path: str | Path, settings: VideoSettings) -> dict:
        """What identifies an entry: resolved path, size (bytes), mtime (ns), settings, cache version.

        Raises:
            FileNotFoundError: the video does not exist.
        """
        resolved = Path(path).resolve()
        stat = resolved.stat()
        return {
            "path": str(resolved),
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "settings": settings.to_dict(),
            "version": CACHE_VERSION,
        }

    def _key(self, fields: dict) -> str:
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()

    def get(self, path: str | Path, settings: VideoSettings) -> SampledVideo | None:
        """The cached clip for (path, settings), or None on a miss (also for a missing, changed or damaged entry)."""
        try:
            fields = self.key_fields(path, settings)
        except OSError:
            return None
        key = self._key(fields)
        meta_path, frames_path = self.root / f"{key}.json", self.root / f"{key}.npy"
        try:
            meta = json.loads(meta_path.read_text())
            frames = np.load(frames_path, allow_pickle=False)
        except (OSError, ValueError):  # missing, being evicted, or damaged: a miss
            return None
        if meta.get("key") != fields or list(frames.shape) != meta.get("shape") or frames.dtype != np.uint8:
            return None
        try:
            os.utime(meta_path)  # last access, for eviction
        except OSError:
            pass
        video = meta["video"]
        return SampledVideo(frames=frames, **video)

    def put(self, path: str | Path, settings: VideoSettings, video: SampledVideo) -> bool:
        """Store a sampled clip; returns False when it is larger than ``max_bytes``, or the cache is off (not stored).

        Writes are atomic (temporary file + ``os.replace``); then evicts least recently used entries to fit. A write
        that fails for a full disk, a file-size limit or a quota (:func:`grounding_rl.errors.disk_error`) turns the
        cache off for writes, with a warning: the run goes on decoding.
        """
        frames = np.ascontiguousarray(video.frames)
        if frames.dtype != np.uint8:
            raise ValueError(f"{video.path}: frames must be uint8, got {frames.dtype}")
        if frames.nbytes > self.max_bytes:
            return False
        fields = self.key_fields(path, settings)
        key = self._key(fields)
        meta = {
            "key": fields,
            "shape": list(frames.shape),
            "video": {
                "path": video.path,
                "source_fps": float(video.source_fps),
                "duration": float(video.duration),
                "frame_indices": [int(i) for i in video.frame_indices],
                "timestamps": [float(t) for t in video.timestamps],
                "sampled_fps": float(video.sampled_fps),
                "backend": video.backend,
            },
        }
        if self.full:
            return False
        try:
            self._write(f"{key}.npy", lambda f: np.save(f, frames, allow_pickle=False))
            self._write(f"{key}.json", lambda f: f.write(json.dumps(meta).encode()))
        except OSError as err:
            why = disk_error(err)
            if why is None:
                raise
            (self.root / f"{key}.npy").unlink(missing_ok=True)
            self.full = True
            logger.warning("frame cache %s: writing failed (%s); the cache is off for the rest of this run (clips are "
                           "decoded as without it)", self.root, why)
            return False
        self.evict()
        return True

    def _write(self, name: str, write) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-", suffix=f"-{name}.part")
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
            follow_umask(tmp)  # mkstemp creates 0600
            os.replace(tmp, self.root / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def entries(self) -> list[tuple[float, int, str]]:
        """(last access time, bytes, key) of each complete entry, oldest first."""
        out = []
        for meta in self.root.glob("*.json"):
            key = meta.stem
            try:
                used = meta.stat().st_mtime
                size = meta.stat().st_size + (self.root / f"{key}.npy").stat().st_size
            except OSError:
                continue
            out.append((used, size, key))
        return sorted(out)

    def size_bytes(self) -> int:
        """Total bytes of the complete entries."""
        return sum(size for _, size, _ in self.entries())

    def evict(self) -> int:
        """Delete least recently used entries until the total fits ``max_bytes``; returns how many were deleted."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        removed = 0
        for _, size, key in entries:
            if total <= self.max_bytes:
                break
            for suffix in (".json", ".npy"):  # JSON first: readers see a miss, never half an entry
                (self.root / f"{key}{suffix}").unlink(missing_ok=True)
            total -= size
            removed += 1
        return removed
