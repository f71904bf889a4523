"""The CPU demo's results file, ``docs/demo_results.json``: one entry per (family, seed) that ``scripts/demo.sh`` ran,
its rows (``baseline``, ``sft``, ``grpo``), the settings it ran with and the SHA-256 of the lock of its environment.
The README's demo tables are these entries as ``grounding-rl compare`` prints them (tests/test_demo_results.py).

    grounding-rl demo-results --out docs/demo_results.json --family qwen2_5_vl --seed 0 \\
        --lock scripts/locks/venv.txt [--setting KEY=VALUE ...] [--digest NAME=PATH ...] baseline=DIR sft=DIR grpo=DIR

File layout::

    {"entries": [{"family": "qwen2_5_vl", "seed": 0, "lock_sha256": "…", "settings": {…},
                  "sha256": {"data": "…", "sft": "…", "grpo": "…"},
                  "rows": {"baseline": {"R1@0.3": 55.0, …, "n": 200}, "sft": {…}, "grpo": {…}}}, …]}

sorted by (family, seed); writing an entry replaces the one of the same family and seed. ``sha256`` holds digests
of the stages' outputs (:func:`tree_sha256`: the demo clips and splits, the SFT and GRPO weights), so a run that
parts from a recorded one can be traced to the first stage that differs.
"""
from __future__ import annotations

import hashlib
import json
import platform
from importlib.metadata import version
from pathlib import Path

ROW_KEYS = ("R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "format_rate", "length_ratio", "n")
VERSIONS = ("torch", "transformers", "accelerate", "trl", "av", "numpy")


def row_of(metrics: dict) -> dict:
    """The README columns of one run's ``metrics.json`` (top level: the ``standard`` scoring); a column the run lacks
    (the baseline's format rate) is left out."""
    return {key: metrics[key] for key in ROW_KEYS if metrics.get(key) is not None}


TOOL_RECORDS = ("demo_data.json", "tiny_model.json")  # grounding_rl.dev.demo.RECORD, grounding_rl.dev.tiny.RECORD


def tree_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes, or of a folder: each file's path relative to it (sorted, ``/``-separated) and its
    bytes' SHA-256, one ``path\tdigest\n`` line each, hashed in turn. The records the development tools leave
    (``demo_data.json``, ``tiny_model.json``: what they wrote) are not part of a folder's digest, so the demo data's
    digest is that of its clips and splits.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(path)
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or folder")
    lines = "".join(f"{f.relative_to(path).as_posix()}\t{hashlib.sha256(f.read_bytes()).hexdigest()}\n"
                    for f in sorted(p for p in path.rglob("*") if p.is_file() and p.name not in TOOL_RECORDS))
    return hashlib.sha256(lines.encode()).hexdigest()


def run_versions() -> dict:
    """What the figures may depend on beyond the lock: Python, the CPU (its model name and the vectorised kernels torch
    runs, which ``ATEN_CPU_CAPABILITY`` caps) and the versions of :data:`VERSIONS`."""
    import torch

    return {"python": platform.python_version(), "machine": platform.machine(), "cpu": cpu_name(),
            **{name: version(name) for name in VERSIONS},
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def cpu_name() -> str:
    """The CPU's model name as ``/proc/cpuinfo`` gives it (``platform.processor()`` where there is none, else
    ``"unknown"``); also the header of ``scripts/bench_video.py``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def read_results(path: str | Path) -> list[dict]:
    """The entries of a results file; ``[]`` when it does not exist.

    Raises:
        ValueError: the file is not a results file (names the path).
    """
    path = Path(path)
    if not path.is_file():
        return []
    try:
        return json.loads(path.read_text(encoding="utf-8"))["entries"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a demo results file ({err})") from None


def record(path: str | Path, entry: dict) -> list[dict]:
    """Write ``entry`` into the results file at ``path`` (created if missing), replacing the entry of the same
    ``family`` and ``seed``; returns the entries written. Entries sorted, keys in the order given (rows as the demo
    ran them), two-space indent, one trailing newline: a re-run with the same figures leaves the file byte-identical."""
    entries = [e for e in read_results(path) if (e["family"], e["seed"]) != (entry["family"], entry["seed"])]
    entries = sorted([*entries, entry], key=lambda e: (e["family"], e["seed"]))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"entries": entries}, indent=2) + "\n", encoding="utf-8")
    return entries
