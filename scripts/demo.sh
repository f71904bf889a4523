#!/usr/bin/env bash
# The main job, offline on a CPU: demo data → tiny model → SFT warm start → GRPO → evaluation of
# the SFT and GRPO checkpoints and a trivial baseline on the demo test split, one table, then a last line of JSON
#   {"baseline_mIoU": a, "sft_mIoU": b, "grpo_mIoU": c, "grpo_format_rate": d,
#    "baseline_R1@0.7": e, "sft_R1@0.7": f, "grpo_R1@0.7": g, "grpo_length_ratio": h}
# (R1@0.7 beside mIoU: a policy that hedges with wide intervals gains mIoU and R1@0.3 while R1@0.7 falls)
#
#   bash scripts/demo.sh [--key value ...]      (extra arguments go to the GRPO stage, e.g. --max_steps 40)
#
# Variables: DEMO_DIR (data, default data/demo), OUT (default outputs/demo), SEED (default 0), DEMO_FAMILY
# (qwen2_5_vl, default, or qwen3_vl: a tiny Qwen3-VL with configs/demo_{sft,grpo}_qwen3_vl.yaml), DEMO_TEMPLATE
# (a prompt template passed as --prompt_template to both SFT and GRPO, which must share it; e.g. default_no_think for
# thinking-free training; unset = the configs' own, default). Evaluation reads it from the checkpoints.
# DEMO_RESULTS: where the table, its settings and the lock's SHA-256 are recorded (grounding-rl demo-results;
# default docs/demo_results.json, the file the README's demo tables must equal, for the demo as documented: no extra
# arguments and no DEMO_TEMPLATE; otherwise $OUT/demo_results.json).
# Runs scripts/setup.sh first when .venv is missing. Everything is rebuilt from scratch in OUT on each run.
# DEMO_DIR and OUT are relative to the working directory (the README runs it from the repository root); the configs,
# the package and .venv are found beside the script.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
[ -x "$ROOT/.venv/bin/python" ] || bash "$ROOT/scripts/setup.sh"
PY="$ROOT/.venv/bin/python"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# One BLAS/OpenMP thread per process: the tiny model's matrices gain little from a second thread, a second thread on
# a busy core slows torch down many times, and a fixed thread count keeps the run reproducible.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
# The same floating-point code path on every x86-64 CPU with AVX2: torch's vectorised kernels, MKL's BLAS (strict
# conditional numerical reproducibility) and oneDNN capped at AVX2. Left to choose, an AVX-512 CPU sums in another
# order, the tiny model's weights part after a few steps, and a 1,200-step SFT can end localising or not.
export ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2,STRICT ONEDNN_MAX_CPU_ISA=AVX2
DEMO_DIR="${DEMO_DIR:-data/demo}"
OUT="${OUT:-outputs/demo}"
SEED="${SEED:-0}"
if [ $# -eq 0 ] && [ -z "${DEMO_TEMPLATE:-}" ]; then
  DEMO_RESULTS="${DEMO_RESULTS:-$ROOT/docs/demo_results.json}"
else
  DEMO_RESULTS="${DEMO_RESULTS:-$OUT/demo_results.json}"
fi
case "${DEMO_FAMILY:-qwen2_5_vl}" in
  qwen2_5_vl) SFT_CONFIG=$ROOT/configs/demo_sft.yaml GRPO_CONFIG=$ROOT/configs/demo_grpo.yaml ;;
  qwen3_vl) SFT_CONFIG=$ROOT/configs/demo_sft_qwen3_vl.yaml GRPO_CONFIG=$ROOT/configs/demo_grpo_qwen3_vl.yaml ;;
  *) echo "DEMO_FAMILY must be qwen2_5_vl or qwen3_vl (got ${DEMO_FAMILY})" >&2; exit 2 ;;
esac
GRL=("$PY" -m grounding_rl.cli)
start=$(date +%s)
stage() { echo; echo "== demo [$(( $(date +%s) - start )) s] $*"; }

stage "1/6 demo data ($DEMO_DIR, seed $SEED)"
"${GRL[@]}" demo-data --out "$DEMO_DIR" --seed "$SEED"

stage "2/6 tiny model ($OUT/tiny-model)"
rm -rf "$OUT"
common=(--train_file "$DEMO_DIR/train.jsonl" --seed "$SEED")
[ -z "${DEMO_TEMPLATE:-}" ] || common+=(--prompt_template "$DEMO_TEMPLATE")
"${GRL[@]}" tiny-model --from-config "$SFT_CONFIG" --model_name_or_path "$OUT/tiny-model"

stage "3/6 SFT warm start ($OUT/sft)"
"${GRL[@]}" sft --config "$SFT_CONFIG" "${common[@]}" --model_name_or_path "$OUT/tiny-model" \
  --output_dir "$OUT/sft"

stage "4/6 GRPO ($OUT/grpo)"
"${GRL[@]}" train --config "$GRPO_CONFIG" "${common[@]}" --model_name_or_path "$OUT/sft" \
  --output_dir "$OUT/grpo" "$@"

stage "5/6 evaluation on $DEMO_DIR/test.jsonl"
"${GRL[@]}" baseline --train "$DEMO_DIR/train.jsonl" --data "$DEMO_DIR/test.jsonl" \
  --out "$OUT/eval/baseline/predictions.jsonl" --metrics "$OUT/eval/baseline/metrics.json" > /dev/null
for run in sft grpo; do
  "${GRL[@]}" eval --model "$OUT/$run" --data "$DEMO_DIR/test.jsonl" --out "$OUT/eval/$run" --batch-size 16 \
    --max-new-tokens 48 --seed "$SEED" > "$OUT/eval/$run.log" 2>&1 || { cat "$OUT/eval/$run.log"; exit 1; }
done

stage "6/6 results (R1@m, mIoU and format rate in percent; $(( $(date +%s) - start )) s in all)"
"${GRL[@]}" compare baseline="$OUT/eval/baseline" sft="$OUT/eval/sft" grpo="$OUT/eval/grpo" \
  --json-key baseline:mIoU --json-key sft:mIoU --json-key grpo:mIoU --json-key grpo:format_rate \
  --json-key baseline:R1@0.7 --json-key sft:R1@0.7 --json-key grpo:R1@0.7 --json-key grpo:length_ratio \
  > "$OUT/eval/table.txt"
"${GRL[@]}" demo-results --out "$DEMO_RESULTS" --family "${DEMO_FAMILY:-qwen2_5_vl}" --seed "$SEED" \
  --lock "$ROOT/scripts/locks/venv.txt" --setting "sft_config=${SFT_CONFIG#$ROOT/}" \
  --setting "grpo_config=${GRPO_CONFIG#$ROOT/}" --setting "prompt_template=${DEMO_TEMPLATE:-}" \
  --setting "grpo_extra_args=$*" --digest "data=$DEMO_DIR" --digest "sft=$OUT/sft/model.safetensors" \
  --digest "grpo=$OUT/grpo/model.safetensors" baseline="$OUT/eval/baseline" sft="$OUT/eval/sft" grpo="$OUT/eval/grpo"
echo "training curves: $OUT/sft/training_curves.png $OUT/grpo/training_curves.png (grounding-rl plot RUN ... overlays)"
cat "$OUT/eval/table.txt"
