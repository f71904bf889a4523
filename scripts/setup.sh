#!/usr/bin/env bash
# Create .venv idempotently: torch/torchvision first (pinned CPU-local wheels), then the project with its dev extra.
set -euo pipefail
cd "$(dirname "$0")/.."  # it installs into the checkout: runs in the repository root (no path arguments)
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.grounding_rl_installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
  exit 0
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.14.1" "torchvision==0.29.1"
.venv/bin/python -m pip install -q -e ".[dev]"
touch "$stamp"
echo "setup: .venv ready"
