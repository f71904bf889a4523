#!/usr/bin/env bash
# Reward specs and the recipe options of configs/README.md against the demo's own GRPO stage on the CPU demo: the same
# demo data, SFT warm start, number of GRPO steps and seed; one table of R1@m, mIoU and format rate on the demo test
# split, plus seconds per GRPO step, mean completion length from each run's log and length_ratio (predicted / true
# seconds). Run scripts/demo.sh first (it leaves $OUT/sft).
#
#   bash scripts/demo_ablation.sh [variant ...]       (default: all; names below)
#
# Variants: plain (rewards iou + format, the Qwen3-VL demo's), iou_length (iou + length_ratio_penalty at weight 0.5 +
# format, the Qwen2.5-VL demo's), set_rewards (TimeLens2's twass1 + set_iou + parse_penalty in place of iou, format
# kept), set_rewards_length (that plus length_ratio_penalty); and the recipe options, each on top of the family's GRPO
# config as it is (so against iou_length on Qwen2.5-VL, plain on Qwen3-VL): no_think (its own SFT too),
# dynamic_sampling, gt_injection, gt_injection_shaped, difficulty_timelens (TimeLens's draw of 500 of the 1,000 clips
# on the SFT checkpoint's scores), range_offline (Time-R1's (0, 0.7] on those scores), range_online (the same range on
# each epoch's rewards).
# Variables: DEMO_DIR (default data/demo), OUT (default outputs/demo, which holds sft/), ABL (default
# outputs/ablation), SEED (GRPO seed, default 0), JOBS (variants run at once, default 1: one CPU thread each),
# DEMO_FAMILY (qwen2_5_vl, default, or qwen3_vl: configs/demo_{sft,grpo}_qwen3_vl.yaml, as scripts/demo.sh).
# A variant whose eval/metrics.json exists is not re-run (delete its folder to redo it).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"  # DEMO_DIR, OUT and ABL are relative to the working directory
PY="$ROOT/.venv/bin/python"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS=1
# one floating-point code path on x86-64 CPUs, as in scripts/demo.sh
export ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2,STRICT ONEDNN_MAX_CPU_ISA=AVX2
DEMO_DIR="${DEMO_DIR:-data/demo}"
OUT="${OUT:-outputs/demo}"
ABL="${ABL:-outputs/ablation}"
SEED="${SEED:-0}"
JOBS="${JOBS:-1}"
GRL=("$PY" -m grounding_rl.cli)
case "${DEMO_FAMILY:-qwen2_5_vl}" in
  qwen2_5_vl) SFT_CONFIG=$ROOT/configs/demo_sft.yaml GRPO_CONFIG=$ROOT/configs/demo_grpo.yaml ;;
  qwen3_vl) SFT_CONFIG=$ROOT/configs/demo_sft_qwen3_vl.yaml GRPO_CONFIG=$ROOT/configs/demo_grpo_qwen3_vl.yaml ;;
  *) echo "DEMO_FAMILY must be qwen2_5_vl or qwen3_vl (got ${DEMO_FAMILY})" >&2; exit 2 ;;
esac
[ -d "$OUT/sft" ] || { echo "demo_ablation: $OUT/sft is missing; run scripts/demo.sh first" >&2; exit 2; }

declare -A ARGS=(
  [plain]="--reward_funcs iou format --reward_weights 1.0 0.5"
  [no_think]="--prompt_template default_no_think"
  [dynamic_sampling]="--dynamic_sampling true"
  [gt_injection]="--use_gt_injection true"
  [gt_injection_shaped]="--use_gt_injection true --reward_shaping tempsamp"
  [difficulty_timelens]="--train_file $ABL/train_scored.jsonl --difficulty_sampling timelens --difficulty_subset_size 500"
  [range_offline]="--train_file $ABL/train_scored.jsonl --difficulty_range 0.0 0.7"
  [range_online]="--online_difficulty_range 0.0 0.7"
  [set_rewards]="--reward_funcs twass1 set_iou parse_penalty format --reward_weights 1.0 1.0 1.0 0.5"
  [set_rewards_length]="--reward_funcs twass1 set_iou parse_penalty length_ratio_penalty format --reward_weights 1.0 1.0 1.0 1.0 0.5"
  [iou_length]="--reward_funcs iou length_ratio_penalty format --reward_weights 1.0 0.5 0.5"
)
ORDER=(plain no_think dynamic_sampling gt_injection gt_injection_shaped difficulty_timelens range_offline range_online
       set_rewards set_rewards_length iou_length)
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=("${ORDER[@]}")
for v in "${variants[@]}"; do
  [ -n "${ARGS[$v]+set}" ] || { echo "demo_ablation: unknown variant $v (known: ${ORDER[*]})" >&2; exit 2; }
done

run() {  # one variant: (its own SFT when the template differs) → GRPO → eval
  local v=$1 dir="$ABL/seed$SEED/$1" sft="$OUT/sft"
  [ -f "$dir/eval/metrics.json" ] && return 0
  rm -rf "$dir" && mkdir -p "$dir"
  # shellcheck disable=SC2086
  if [[ " ${ARGS[$v]} " == *" --prompt_template "* ]]; then
    sft="$dir/sft"
    "${GRL[@]}" sft --config "$SFT_CONFIG" --train_file "$DEMO_DIR/train.jsonl" --seed 0 \
      --model_name_or_path "$OUT/tiny-model" --output_dir "$sft" ${ARGS[$v]} > "$dir/sft.log" 2>&1
  fi
  # shellcheck disable=SC2086
  "${GRL[@]}" train --config "$GRPO_CONFIG" --train_file "$DEMO_DIR/train.jsonl" --seed "$SEED" \
    --model_name_or_path "$sft" --output_dir "$dir/grpo" ${ARGS[$v]} > "$dir/grpo.log" 2>&1
  "${GRL[@]}" eval --model "$dir/grpo" --data "$DEMO_DIR/test.jsonl" --out "$dir/eval" --batch-size 16 \
    --max-new-tokens 48 --seed 0 > "$dir/eval.log" 2>&1
}

# difficulty scores of the training clips by the SFT checkpoint (what difficulty_timelens and range_offline select on)
if [[ " ${variants[*]} " == *" difficulty_timelens "* || " ${variants[*]} " == *" range_offline "* ]] \
    && [ ! -f "$ABL/train_scored.jsonl" ]; then
  mkdir -p "$ABL"
  "${GRL[@]}" difficulty --model "$OUT/sft" --data "$DEMO_DIR/train.jsonl" --out "$ABL/train_scored.jsonl" \
    --batch-size 16 --max-new-tokens 48 --seed 0 > "$ABL/difficulty.log" 2>&1
fi

pids=()
for v in "${variants[@]}"; do
  run "$v" & pids+=($!)
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 5; done
done
for p in "${pids[@]}"; do wait "$p" || { echo "demo_ablation: a variant failed; see $ABL/seed$SEED/*/*.log" >&2; exit 1; }; done

"$PY" - "$ABL/seed$SEED" "${variants[@]}" <<'PY'
import json, sys
from pathlib import Path
root, names = Path(sys.argv[1]), sys.argv[2:]
print(f"{'variant':<22} {'R1@0.3':>7} {'R1@0.5':>7} {'R1@0.7':>7} {'mIoU':>7} {'format':>7} {'length':>7} "
      f"{'s/step':>7} {'tokens':>7}")
for name in names:
    m = json.loads((root / name / "eval" / "metrics.json").read_text())
    state = json.loads((root / name / "grpo" / "trainer_state.json").read_text())
    logs = [h for h in state["log_history"] if "completions/mean_length" in h]
    tokens = sum(h["completions/mean_length"] for h in logs) / max(len(logs), 1)
    final = next(h for h in state["log_history"] if "train_runtime" in h)
    sps = final["train_runtime"] / state["global_step"]
    pct = m.__getitem__  # percentages (the standard scoring)
    print(f"{name:<22} {pct('R1@0.3'):7.1f} {pct('R1@0.5'):7.1f} {pct('R1@0.7'):7.1f} {pct('mIoU'):7.2f} "
          f"{pct('format_rate'):7.1f} {m.get('length_ratio') or float('nan'):7.3f} {sps:7.3f} {tokens:7.1f}")
PY
