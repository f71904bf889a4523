#!/usr/bin/env bash
# Prepare what scripts/gpu_check.sh needs on a GPU machine that has Python 3.12, torch, torchvision, accelerate and
# peft but cannot download anything: wheels for the packages it lacks (or has at another version), and the files of
# ../shared the check reads (the clips, the Qwen processor files, the model configs). Everything lands in the
# git-ignored folder .gpu/ (override with GPU_DIR), which travels with the working tree; never commit it.
#
#   bash scripts/fetch_gpu_wheels.sh            # needs PyPI; prints the total size, fails above LIMIT_MIB (64)
#
# Versions are the ones this checkout's .venv runs (what the tests pass with). Wheels are fetched with --no-deps for
# CPython 3.12 on manylinux x86-64; DeepSpeed publishes only an sdist, so its wheel is built here (pure Python, no
# compiled ops: DS_BUILD_OPS=0, DeepSpeed's default, JIT-builds ops where used). PyAV is left out (decord reads the
# clips; PyAV is only a fallback).
set -euo pipefail
cd "$(dirname "$0")/.."  # fills the checkout's .gpu/: runs in the repository root (GPU_DIR relative to it)
PYTHON=${PYTHON:-.venv/bin/python}
GPU_DIR=${GPU_DIR:-.gpu}
LIMIT_MIB=${LIMIT_MIB:-64}
SHARED=${GROUNDING_RL_SHARED:-../shared}
WHEELS="$GPU_DIR/wheels"
mkdir -p "$WHEELS"

# the packages the GPU image lacks (or holds at an older version than ours), with their own missing needs
PACKAGES="transformers trl datasets dill multiprocess deepspeed hjson pydantic pydantic-core annotated-types
typing-inspection typing-extensions decord qwen-vl-utils"
pins=$("$PYTHON" - $PACKAGES <<'PY'
import sys
from importlib.metadata import version
print(" ".join(f"{name}=={version(name)}" for name in sys.argv[1:]))
PY
)
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64"
for pin in $pins; do
  name=${pin%%==*}
  if [ "$name" = deepspeed ]; then
    ls "$WHEELS"/deepspeed-*.whl >/dev/null 2>&1 || DS_BUILD_OPS=0 "$PYTHON" -m pip wheel -q --no-deps \
      --no-build-isolation -w "$WHEELS" "$pin"
    continue
  fi
  # shellcheck disable=SC2086
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $PLATFORMS -d "$WHEELS" "$pin"
done

# ../shared does not travel with the working tree: copy what the check reads
mkdir -p "$GPU_DIR/shared/data" "$GPU_DIR/shared/models"
cp -r "$SHARED/data/videos" "$GPU_DIR/shared/data/"
cp -r "$SHARED/models/Qwen2.5-VL-7B-Instruct" "$GPU_DIR/shared/models/"
for model in Qwen2.5-VL-3B-Instruct Qwen3-VL-8B-Instruct; do
  mkdir -p "$GPU_DIR/shared/models/$model"
  cp "$SHARED/models/$model/config.json" "$GPU_DIR/shared/models/$model/"
done

"$PYTHON" - "$GPU_DIR" "$LIMIT_MIB" <<'PY'
import sys
from pathlib import Path

root, limit = Path(sys.argv[1]), float(sys.argv[2])
wheels = sorted((root / "wheels").glob("*.whl"))
for wheel in wheels:
    print(f"{wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}")
names = [w.name.split("-")[0].lower() for w in wheels]
if len(names) != len(set(names)):
    sys.exit(f"fetch_gpu_wheels: two versions of one package in {root / 'wheels'}: remove the older")
import subprocess

folder = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) / 2**20
listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, check=True)
tree = sum(Path(n).stat().st_size for n in listed.stdout.decode().split("\0") if n and Path(n).is_file()
           and not Path(n).is_symlink()) / 2**20
print(f"wheels {sum(w.stat().st_size for w in wheels) / 2**20:.1f} MiB, {root} in all {folder:.1f} MiB, with the "
      f"working tree {folder + tree:.1f} MiB (limit {limit:.0f} MiB)")
if folder + tree > limit:
    sys.exit(f"fetch_gpu_wheels: {folder + tree:.1f} MiB would travel, over {limit:.0f} MiB")
PY
