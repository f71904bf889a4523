#!/usr/bin/env bash
# Train with GRPO.
#
#   scripts/train.sh [CONFIG] [--key value ...]
#
# CONFIG defaults to the checkout's configs/demo_grpo.yaml (the CPU demo's GRPO stage; its demo data and SFT warm
# start are made first when missing). Overrides go to `grounding-rl train` (TrlParser).
# Variables:
#   NUM_GPUS=N             processes to launch (default: all visible GPUs, or 1 without a GPU)
#   ACCELERATE_CONFIG=F    accelerate config, e.g. configs/accelerate/zero3.yaml (default: the checkout's
#                          configs/accelerate/ddp.yaml when N > 1; none for one process)
#   NUM_MACHINES, MACHINE_RANK, MAIN_PROCESS_IP, MAIN_PROCESS_PORT   several nodes (same command on each)
#   VENV=DIR               the virtual environment to run in (default: the checkout's .venv; .venv-vllm for vLLM on
#                          CPU)
# A config that names `tiny_model:` (tokenizer folder and sizes) gets its model built by `grounding-rl tiny-model`
# when model_name_or_path is missing.
# Preemption: SIGTERM, SIGUSR1 or Ctrl-C stops the run at its next exact-resume point (the end of the current
# generation window) with a checkpoint, one line, exit 128 + signal (Ctrl-C twice: at once, 130); the same command with
# --resume_from_checkpoint auto continues bit-identically. A SLURM job that requeues itself:
#   #SBATCH --signal=B:USR1@300 --requeue --open-mode=append
#   trap 'kill -USR1 $PID; wait $PID; scontrol requeue $SLURM_JOB_ID' USR1
#   scripts/train.sh configs/X.yaml --output_dir outputs/X --resume_from_checkpoint auto & PID=$!; wait $PID
# The script stays in the caller's folder: CONFIG and the paths inside it (train_file, model_name_or_path, output_dir)
# are relative to the working directory, as for `grounding-rl train`. The recipes in configs/ name theirs relative to
# the repository root, so run them from there (or override the paths); the package and .venv are found beside the
# script.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
if [ -x "$VENV/bin/python" ]; then PY="$(cd "$VENV" && pwd)/bin/python"; else PY="${PYTHON:-python}"; fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's package, wherever the script is run from
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"

DEMO_CONFIG="$(cd "$ROOT/configs" && pwd -P)/demo_grpo.yaml"
CONFIG="$DEMO_CONFIG"
if [ $# -gt 0 ] && [[ "$1" != --* ]]; then CONFIG="$1"; shift; fi
for arg in "$@"; do  # `grounding-rl train`'s form: here it would train the demo's config after building its warm start
  case "$arg" in --config|--config=*)
    echo "train.sh: the config is the first argument, not $arg: scripts/train.sh CONFIG [--key value ...]" >&2; exit 2;;
  esac
done
[ -f "$CONFIG" ] || { echo "train.sh: no such config: $CONFIG (relative paths start in $PWD)" >&2; exit 2; }

"$PY" -m grounding_rl.cli tiny-model --from-config "$CONFIG" "$@"
if [ "$(cd "$(dirname "$CONFIG")" && pwd -P)/$(basename "$CONFIG")" = "$DEMO_CONFIG" ]; then
  # the demo's GRPO starts from its SFT warm start: make what is missing (its paths, like the config's, start here)
  [ -f data/demo/train.jsonl ] || "$PY" -m grounding_rl.cli demo-data --out data/demo
  if [ ! -f outputs/demo-sft/config.json ]; then
    "$PY" -m grounding_rl.cli tiny-model --from-config "$ROOT/configs/demo_sft.yaml"
    "$PY" -m grounding_rl.cli sft --config "$ROOT/configs/demo_sft.yaml" --output_dir outputs/demo-sft
  fi
fi

if [ -z "${NUM_GPUS:-}" ]; then
  NUM_GPUS=$("$PY" -c "import torch; print(max(torch.cuda.device_count(), 1))")
fi
NUM_MACHINES="${NUM_MACHINES:-1}"
if [ "$NUM_GPUS" -le 1 ] && [ "$NUM_MACHINES" -le 1 ] && [ -z "${ACCELERATE_CONFIG:-}" ]; then
  exec "$PY" -m grounding_rl.cli train --config "$CONFIG" "$@"
fi
LAUNCH=("$PY" -m accelerate.commands.launch --config_file "${ACCELERATE_CONFIG:-$ROOT/configs/accelerate/ddp.yaml}"
        --num_processes "$NUM_GPUS" --num_machines "$NUM_MACHINES")
if [ "$NUM_MACHINES" -gt 1 ]; then
  LAUNCH+=(--machine_rank "${MACHINE_RANK:?set MACHINE_RANK}" --main_process_ip "${MAIN_PROCESS_IP:?set MAIN_PROCESS_IP}"
           --main_process_port "${MAIN_PROCESS_PORT:-29500}")
fi
# Several processes: the launcher runs in its own session and this script forwards SIGTERM, SIGUSR1 and SIGINT to the
# training processes (the launcher's children) themselves: each stops at its next exact-resume point with a checkpoint
# (a launcher that got the signal would kill them instead); then this script exits with 128 + signal.
setsid "${LAUNCH[@]}" -m grounding_rl.cli train --config "$CONFIG" "$@" &
LAUNCHER=$!
STOPPED=0
forward() { STOPPED=$2; pkill "-$1" -P "$LAUNCHER" 2>/dev/null || true; }
trap 'forward USR1 138' USR1
trap 'forward TERM 143' TERM
trap 'forward INT 130' INT
while :; do
  status=0
  wait "$LAUNCHER" || status=$?
  kill -0 "$LAUNCHER" 2>/dev/null || break
done
if [ "$STOPPED" -ne 0 ] && [ "$status" -eq 0 ]; then exit "$STOPPED"; fi
exit "$status"
