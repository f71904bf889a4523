#!/usr/bin/env bash
# The project's test command: set up .venv if needed, then run pytest (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."  # the checkout's tests: pytest paths are relative to the repository root
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest "$@"
