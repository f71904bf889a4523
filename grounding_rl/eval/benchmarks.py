"""Benchmark definitions (``evaluation/*.yaml``): reader format, annotation file, expected query count, paper protocol
and published anchor results.

A definition is a small YAML file::

    name: charades_sta_test
    format: charades_sta                      # a reader of grounding_rl.data.readers.READERS
    annotations: ../shared/data/benchmarks/charades_sta/charades_sta_test.txt
    durations: ../shared/data/benchmarks/charades_sta/charades.json   # optional
    expected_queries: 3720                    # after the validation policy (grounding-rl prepare's "kept"); null
                                              # when not known (the file is not shipped and no count is published)
    video_root: null                          # folder of the videos; null = pass --video-root
    protocol:                                 # sampling of the paper protocol (used when a checkpoint has no config)
      prompt_template: timezero
      max_new_tokens: 1024
      video: {fps: 2.0, min_pixels: 12544, total_pixels: 2809856}
    anchors:                                  # published results, each with its source
      - {method: ..., setting: ..., "R1@0.3": 83.3, "R1@0.5": 72.5, "R1@0.7": 47.9, mIoU: null, source: ...}

Paths are relative to the repository root (``../shared/...`` honours ``$GROUNDING_RL_SHARED``). ``grounding-rl
prepare --benchmark BENCH.yaml`` writes the benchmark's canonical JSONL (``scripts/eval.sh`` does it first).
"""
from __future__ import annotations

import errno
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from grounding_rl.errors import UserError
from grounding_rl.paths import DATA_ENV, data_root, resolve_config_path

if TYPE_CHECKING:  # importing the preprocessing pulls in transformers: only when a protocol is built
    from grounding_rl.prompts.preprocessing import GroundingConfig

ANCHOR_METRICS = ("R1@0.3", "R1@0.5", "R1@0.7", "mIoU")
_REQUIRED = ("name", "format", "annotations")


class BenchmarkError(UserError, ValueError):
    """A benchmark YAML is missing a field or has a bad value (the message names the file)."""


@dataclass
class Benchmark:
    """One benchmark definition, with paths resolved.

    Attributes:
        name: short name (used for output folders).
        format: reader name for ``grounding-rl prepare --format``.
        annotations: annotation file (absolute).
        durations: optional durations file (absolute) or None.
        expected_queries: number of queries after the validation policy; None when not known (the key must still be
            there, as ``null``).
        video_root: folder of the videos, or None when the user must give it.
        protocol: template and video settings of the paper protocol (None when loaded with
            ``build_protocol=False``).
        max_new_tokens: generation budget of the paper protocol (None = the eval default).
        anchors: published results, each a dict with ``method``, ``setting``, the :data:`ANCHOR_METRICS` (None when
            not published) and ``source``.
        description: free text.
        path: the YAML file.
        scorings: the benchmark's own metric as named scorings (:mod:`grounding_rl.reward.scorings`, e.g.
            ``lmms_extremewhenbench``), added by ``eval --benchmark`` beside ``standard`` and ``clamped``.
    """

    name: str
    format: str
    annotations: str
    expected_queries: int | None
    durations: str | None = None
    video_root: str | None = None
    protocol: "GroundingConfig | None" = None
    max_new_tokens: int | None = None
    anchors: list[dict] = field(default_factory=list)
    description: str = ""
    path: str = ""
    scorings: tuple[str, ...] = ()


def _data_file(value, root: Path | None, path: Path) -> str | None:
    """An annotation/durations entry of a benchmark YAML: absolute as written, else under the data root."""
    if value is None:
        return None
    if Path(str(value)).is_absolute():
        return str(value)
    if root is None:
        raise BenchmarkError(f"{path}: {value} is relative to the benchmark data folder: set {DATA_ENV}=DIR or pass "
                             "--data-root DIR (data/README.md says where the files come from)")
    return str(root / str(value))


def load_benchmark(path: str | Path, *, build_protocol: bool = True, data_root_dir: str | None = None) -> Benchmark:
    """Read a benchmark YAML (``yaml.safe_load``, a repeated key refused: :func:`grounding_rl.yaml_files.load_yaml`).

    Args:
        path: the YAML file. Its ``annotations`` and ``durations`` are absolute, or relative to the benchmark data
            folder (:func:`grounding_rl.paths.data_root`: ``data_root_dir``, ``$GROUNDING_RL_DATA``, else the
            test data); ``video_root`` resolves against the working directory.
        data_root_dir: the ``--data-root`` flag, or None.
        build_protocol: build and check ``protocol`` (imports transformers; the shell helper skips it).

    Raises:
        FileNotFoundError: no such file.
        BenchmarkError: missing field, unknown reader format, unknown template/video setting, or a malformed anchor
            (the message names the file).
        UserError: a key written twice, a file that is not UTF-8 or not valid YAML.
    """
    from grounding_rl.data.readers import READERS  # light: no torch / transformers

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(errno.ENOENT, "benchmark definition not found", str(path))
    from grounding_rl.yaml_files import load_yaml

    data = load_yaml(path)
    if not isinstance(data, dict):
        raise BenchmarkError(f"{path}: expected a mapping at the top level")
    missing = [key for key in _REQUIRED if data.get(key) is None]
    missing += [] if "expected_queries" in data else ["expected_queries"]
    if missing:
        raise BenchmarkError(f"{path}: missing field(s) {', '.join(missing)}")
    if data["format"] not in READERS:
        raise BenchmarkError(f"{path}: unknown format {data['format']!r}; known: {', '.join(READERS)}")
    root = data_root(data_root_dir)
    protocol = data.get("protocol") or {}
    config = _protocol_config(protocol, path) if build_protocol else None
    anchors = _checked_anchors(data.get("anchors") or [], path)
    scorings = _checked_scorings(data.get("scorings") or [], path)
    return Benchmark(
        name=str(data["name"]),
        format=str(data["format"]),
        annotations=_data_file(data["annotations"], root, path),
        durations=_data_file(data.get("durations"), root, path),
        expected_queries=None if data["expected_queries"] is None else int(data["expected_queries"]),
        video_root=resolve_config_path(data.get("video_root")),
        protocol=config,
        max_new_tokens=protocol.get("max_new_tokens"),
        anchors=list(anchors),
        description=str(data.get("description") or "").strip(),
        path=str(path),
        scorings=tuple(scorings),
    )


def _protocol_config(protocol: dict, path: Path):
    """The benchmark's ``protocol`` as a :class:`~grounding_rl.prompts.preprocessing.GroundingConfig` (imports
    transformers). Raises BenchmarkError naming ``path`` for an unknown or invalid setting."""
    from grounding_rl.data.video import VideoSettings
    from grounding_rl.prompts.preprocessing import GroundingConfig

    video = dict(protocol.get("video") or {})
    known = set(VideoSettings.__dataclass_fields__)
    if set(video) - known:
        raise BenchmarkError(f"{path}: unknown protocol.video setting(s) {sorted(set(video) - known)}")
    try:
        return GroundingConfig(prompt_template=protocol.get("prompt_template", "default"), video=VideoSettings(**video))
    except (TypeError, ValueError) as err:
        raise BenchmarkError(f"{path}: protocol: {err}") from err


def _checked_anchors(anchors: list, path: Path) -> list:
    """``anchors`` as written, each a mapping with ``method`` and ``source`` and numbers (or null) for
    :data:`ANCHOR_METRICS`. Raises BenchmarkError naming ``path`` and the anchor otherwise."""
    for i, anchor in enumerate(anchors):
        if not isinstance(anchor, dict) or not anchor.get("method") or not anchor.get("source"):
            raise BenchmarkError(f"{path}: anchors[{i}] needs at least 'method' and 'source'")
        for key in ANCHOR_METRICS:
            value = anchor.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise BenchmarkError(f"{path}: anchors[{i}].{key} must be a number or null, got {value!r}")
    return anchors


def _checked_scorings(scorings, path: Path) -> list[str]:
    """``scorings`` as written: a list of names of :data:`grounding_rl.reward.scorings.REGISTRY`. Raises
    BenchmarkError naming ``path`` otherwise."""
    if not isinstance(scorings, list) or not all(isinstance(name, str) for name in scorings):
        raise BenchmarkError(f"{path}: scorings must be a list of scoring names, got {scorings!r}")
    from grounding_rl.reward.scorings import REGISTRY

    unknown = [name for name in scorings if name not in REGISTRY]
    if unknown:
        raise BenchmarkError(f"{path}: unknown scoring(s) {unknown}; known: {', '.join(REGISTRY)}")
    return scorings


def anchors_table(anchors: list[dict], ours: dict | None = None, ours_label: str = "this run") -> str:
    """A markdown table of published results (R1@0.3/0.5/0.7, mIoU), with ``ours`` as the last row when given.

    Missing numbers are shown as ``–``. Each anchor row names its setting and source.
    """
    def cell(value) -> str:
        return "–" if value is None else f"{float(value):.1f}"

    lines = ["| method | setting | " + " | ".join(ANCHOR_METRICS) + " | source |",
             "|---|---|" + "---:|" * len(ANCHOR_METRICS) + "---|"]
    for a in anchors:
        lines.append(f"| {a['method']} | {a.get('setting', '')} | "
                     + " | ".join(cell(a.get(k)) for k in ANCHOR_METRICS) + f" | {a['source']} |")
    if ours is not None:
        lines.append(f"| **{ours_label}** | | " + " | ".join(cell(ours.get(k)) for k in ANCHOR_METRICS) + " | |")
    return "\n".join(lines)


def dropped_annotations(bench: Benchmark) -> int:
    """How many of the benchmark file's queries the validation policy drops (start ≥ end, e.g. TVGBench's 11
    zero-length answers): ``grounding-rl prepare`` leaves them out of the canonical JSONL, and the ``standard``
    scoring counts them back, with IoU 0, as the published evaluators do. Raises what the reader raises."""
    from grounding_rl.data.readers import read_annotations
    from grounding_rl.data.samples import validate

    return validate(read_annotations(bench.format, bench.annotations, durations=bench.durations), log_limit=0)[1][
        "dropped"]
