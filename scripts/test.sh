#!/usr/bin/env bash
# The project's test command: set up .venv if needed, then run pytest (extra arguments go to pytest).
#   bash scripts/test.sh [pytest args]          the fast tier: model-free tests plus one smoke test per seam on the
#                                               tiny Qwen2.5-VL (tests/conftest.py says which)
#   bash scripts/test.sh --full [pytest args]   every test: both families, multi-process and end-to-end (CI: .ci/run)
# Tests run in parallel processes (pytest-xdist), one per core up to 4 (GROUNDING_RL_TEST_WORKERS sets the number;
# 0 = in this process), a test module per process at a time: a module's multi-process tests never overlap, and its
# module fixtures are built once. Times of both tiers: docs/BENCHMARKS.md, "Test suite and CI time".
set -euo pipefail
cd "$(dirname "$0")/.."  # the checkout's tests: pytest paths are relative to the repository root
tier=fast
if [[ "${1:-}" == "--full" ]]; then
  tier=full
  shift
fi
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cores=$(nproc)
exec .venv/bin/python -m pytest --tier "$tier" -n "${GROUNDING_RL_TEST_WORKERS:-$((cores < 4 ? cores : 4))}" \
  --dist loadfile "$@"
