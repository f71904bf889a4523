#!/usr/bin/env bash
# Evaluate a checkpoint on a benchmark definition or a canonical JSONL.
#
#   scripts/eval.sh BENCHMARK_YAML|DATA.jsonl MODEL [--out OUTDIR] [--video-root DIR] [--data-root DIR] [eval flags]
#
# For a YAML (evaluation/*.yaml) it first runs `grounding-rl prepare` with the YAML's format, annotation and durations
# files and the video root (from the YAML or --video-root) into OUTDIR/data.jsonl, then evaluates it with the YAML as
# --benchmark (paper protocol for checkpoints without grounding_config.json, expected query count, anchors in
# report.md). A YAML names its annotation files relative to --data-root DIR or $GROUNDING_RL_DATA (data/README.md).
# OUTDIR defaults to outputs/eval/<YAML or JSONL file name>/<model folder name>; rerunning resumes.
# NUM_GPUS=N (N > 1) shards the evaluation over N processes with `accelerate launch`.
# Relative paths (the spec, MODEL, OUTDIR, the video root) start in the working directory; the package and .venv are
# found beside the script.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"  # VENV=.venv-vllm for --engine vllm on CPU
if [ -x "$VENV/bin/python" ]; then PY="$(cd "$VENV" && pwd)/bin/python"; else PY="${PYTHON:-python}"; fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"

if [ $# -lt 2 ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
SPEC="$1"; MODEL="$2"; shift 2
OUT=""; VIDEO_ROOT=""; DATA_ROOT=""; REST=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --out=*) OUT="${1#--out=}"; shift ;;
    --video-root) VIDEO_ROOT="$2"; shift 2 ;;
    --video-root=*) VIDEO_ROOT="${1#--video-root=}"; shift ;;
    --data-root) DATA_ROOT="$2"; shift 2 ;;
    --data-root=*) DATA_ROOT="${1#--data-root=}"; shift ;;
    *) REST+=("$1"); shift ;;
  esac
done

case "$SPEC" in
  *.yaml|*.yml)
    NAME="$(basename "${SPEC%.*}")"
    OUT="${OUT:-outputs/eval/$NAME/$(basename "$MODEL")}"
    mkdir -p "$OUT"
    echo "eval.sh: preparing $NAME into $OUT/data.jsonl" >&2
    "$PY" -m grounding_rl.cli prepare --benchmark "$SPEC" --out "$OUT/data.jsonl" \
      ${VIDEO_ROOT:+--video-root "$VIDEO_ROOT"} ${DATA_ROOT:+--data-root "$DATA_ROOT"}
    EVAL_ARGS=(--data "$OUT/data.jsonl" --benchmark "$SPEC")
    if [ -n "$DATA_ROOT" ]; then EVAL_ARGS+=(--data-root "$DATA_ROOT"); fi
    ;;
  *)
    NAME="$(basename "${SPEC%.*}")"
    OUT="${OUT:-outputs/eval/$NAME/$(basename "$MODEL")}"
    EVAL_ARGS=(--data "$SPEC")
    if [ -n "$VIDEO_ROOT" ]; then EVAL_ARGS+=(--video-root "$VIDEO_ROOT"); fi
    ;;
esac

NUM_GPUS="${NUM_GPUS:-1}"
if [ "$NUM_GPUS" -gt 1 ]; then
  LAUNCH=("$PY" -m accelerate.commands.launch --multi_gpu --num_processes "$NUM_GPUS" -m grounding_rl.cli)
else
  LAUNCH=("$PY" -m grounding_rl.cli)
fi
exec "${LAUNCH[@]}" eval --model "$MODEL" --out "$OUT" "${EVAL_ARGS[@]}" ${REST[@]+"${REST[@]}"}
