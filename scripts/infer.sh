#!/usr/bin/env bash
# Ask when something happens in a video.
#
#   scripts/infer.sh MODEL VIDEO "QUERY" ["QUERY" ...] [grounding-rl infer flags: --gt S E, --plot OUT.png, --json]
#
# Prints, per query, the interval in seconds (clamped to the video), the answer text and the reasoning. Exit code 2
# when the video is missing or unreadable. Relative paths start in the working directory.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"  # VENV=.venv-vllm for --engine vllm on CPU
if [ -x "$VENV/bin/python" ]; then PY="$(cd "$VENV" && pwd)/bin/python"; else PY="${PYTHON:-python}"; fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"

if [ $# -lt 3 ]; then
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
MODEL="$1"; VIDEO="$2"; shift 2
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --*) break ;;
    *) ARGS+=(--query "$1"); shift ;;
  esac
done
exec "$PY" -m grounding_rl.cli infer --model "$MODEL" --video "$VIDEO" "${ARGS[@]}" "$@"
