#!/usr/bin/env bash
# The prepared GPU check (scripts/gpu_check.py says what each stage measures): one command on a GPU machine that
# cannot download anything, writing one results JSON after each stage (default $OUT/gpu_check.json, else
# outputs/gpu_check.json), so a run cut off at its limit still reports.
#
#   bash scripts/fetch_gpu_wheels.sh                     # here, with PyPI: wheels + ../shared files into .gpu/
#   bash scripts/gpu_check.sh                            # there: installs .gpu/wheels, reads .gpu/shared, ≤ 5 min
#   bash scripts/gpu_check.sh --dry-run                  # any machine, CPU, tiny shapes, seconds (tests run this)
#
# Variables: PYTHON (GPU: python3; dry run: the checkout's .venv/bin/python when present), GPU_DIR (the checkout's
# .gpu), GPU_CHECK_TIMEOUT (300 s: the whole run; the Python side starts no stage after --budget-s 285). Other
# arguments go to gpu_check.py.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"  # a relative --out starts in the working directory
DRY=0
for arg in "$@"; do [ "$arg" = --dry-run ] && DRY=1; done
GPU_DIR=${GPU_DIR:-$ROOT/.gpu}
if [ "$DRY" = 1 ]; then
  if [ -z "${PYTHON:-}" ]; then PYTHON=python3; [ -x "$ROOT/.venv/bin/python" ] && PYTHON="$ROOT/.venv/bin/python"; fi
else
  PYTHON=${PYTHON:-python3}
  if ls "$GPU_DIR"/wheels/*.whl >/dev/null 2>&1; then
    SITE=${GPU_SITE:-/tmp/gpu_check_site}
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$GPU_DIR"/wheels/*.whl || { echo "gpu_check: installing $GPU_DIR/wheels failed" >&2; exit 1; }
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  fi
  if [ -z "${GROUNDING_RL_SHARED:-}" ] && [ -d "$GPU_DIR/shared" ]; then
    GROUNDING_RL_SHARED="$(cd "$GPU_DIR/shared" && pwd)"; export GROUNDING_RL_SHARED
  fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
timeout "${GPU_CHECK_TIMEOUT:-300}" "$PYTHON" "$ROOT/scripts/gpu_check.py" "$@"
