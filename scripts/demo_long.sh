#!/usr/bin/env bash
# The long demo, offline on a CPU: clips of 2-3 minutes with events of 2-5 s (demo-data --long) → tiny Qwen2.5-VL →
# SFT at 48 frames a clip (one frame every 2.5-3.75 s; configs/demo_long_sft.yaml) → evaluation of that one checkpoint
# on the test split in one pass and with --zoom (the window's time positions at their true time, and from 0 with the
# answer shifted; the budget spent on frame rate, and on resolution), then one table (docs/BENCHMARKS.md, "Zoom").
#
#   bash scripts/demo_long.sh [--key value ...]      (extra arguments go to the SFT stage, e.g. --max_steps 40)
#
# Variables: DEMO_DIR (data, default data/demo_long), OUT (default outputs/demo_long), SEED (default 0). Relative to
# the working directory; the config, the package and .venv are found beside the script. Everything in OUT is rebuilt.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
[ -x "$ROOT/.venv/bin/python" ] || bash "$ROOT/scripts/setup.sh"
PY="$ROOT/.venv/bin/python"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
# one floating-point code path on x86-64 CPUs, as in scripts/demo.sh
export ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2,STRICT ONEDNN_MAX_CPU_ISA=AVX2
DEMO_DIR="${DEMO_DIR:-data/demo_long}"
OUT="${OUT:-outputs/demo_long}"
SEED="${SEED:-0}"
CONFIG="$ROOT/configs/demo_long_sft.yaml"
GRL=("$PY" -m grounding_rl.cli)
start=$(date +%s)
stage() { echo; echo "== demo_long [$(( $(date +%s) - start )) s] $*"; }

stage "1/5 long demo data ($DEMO_DIR, seed $SEED)"
"${GRL[@]}" demo-data --long --out "$DEMO_DIR" --seed "$SEED"

stage "2/5 tiny model ($OUT/tiny-model)"
rm -rf "$OUT"
"${GRL[@]}" tiny-model --from-config "$CONFIG" --model_name_or_path "$OUT/tiny-model"

stage "3/5 SFT ($OUT/sft)"
"${GRL[@]}" sft --config "$CONFIG" --train_file "$DEMO_DIR/train.jsonl" --seed "$SEED" \
  --model_name_or_path "$OUT/tiny-model" --output_dir "$OUT/sft" "$@"

stage "4/5 evaluation on $DEMO_DIR/test.jsonl: one pass, then --zoom"
evaluate() {  # NAME [extra eval flags]
  local name=$1; shift
  "${GRL[@]}" eval --model "$OUT/sft" --data "$DEMO_DIR/test.jsonl" --out "$OUT/eval/$name" --batch-size 8 \
    --max-new-tokens 48 --num-workers 0 --seed "$SEED" "$@" > "$OUT/eval/$name.log" 2>&1 \
    || { cat "$OUT/eval/$name.log"; exit 1; }
}
mkdir -p "$OUT/eval"
"${GRL[@]}" baseline --train "$DEMO_DIR/train.jsonl" --data "$DEMO_DIR/test.jsonl" \
  --out "$OUT/eval/baseline/predictions.jsonl" --metrics "$OUT/eval/baseline/metrics.json" > /dev/null
evaluate single
evaluate zoom_video --zoom --zoom-time video
evaluate zoom_window --zoom --zoom-time window
evaluate zoom_resolution --zoom --zoom-spend resolution

stage "5/5 results (R1@m, mIoU and format rate in percent; $(( $(date +%s) - start )) s in all)"
"${GRL[@]}" compare baseline="$OUT/eval/baseline" single="$OUT/eval/single" zoom_video="$OUT/eval/zoom_video" \
  zoom_window="$OUT/eval/zoom_window" zoom_resolution="$OUT/eval/zoom_resolution" \
  --json-key single:mIoU --json-key zoom_video:mIoU --json-key zoom_window:mIoU --json-key zoom_resolution:mIoU
for name in single zoom_video zoom_window zoom_resolution; do
  "$PY" - "$OUT/eval/$name/metrics.json" "$name" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))["run"]
print(f"{sys.argv[2]}: {run['wall_time_s'] / run['queries_run']:.3f} s per query ({run['queries_run']} queries)")
PY
done
