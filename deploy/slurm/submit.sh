#!/usr/bin/env bash
# Submits a sharded hallulog run to Slurm: an array of SHARDS tasks (shard.sbatch, one node's
# GPUs each) and a merge job (merge.sbatch) that runs after all of them succeeded (afterok).
#   SHARDS=8 GPUS_PER_NODE=8 OUT=/shared/runs/tqa70b \
#     RUN_ARGS="--task triviaqa --task-path /shared/data/tqa.json --backend vllm --model /m/70b" \
#     bash deploy/slurm/submit.sh
# Prints the two job ids. Resubmitting resumes the unfinished shards.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# ---- settings (environment variables override them) -----------------------------------------
export SHARDS=${SHARDS:-4}                         # array tasks = shards
export GPUS_PER_NODE=${GPUS_PER_NODE:-8}           # GPUs per shard (0: CPU, embedded server)
export HALLULOG_DIR=${HALLULOG_DIR:-$(cd "$here/../.." && pwd)}
export PYTHON=${PYTHON:-$HALLULOG_DIR/.venv/bin/python}
export OUT=${OUT:-$HALLULOG_DIR/artifacts/sharded} # must be on a filesystem every node mounts
export RUN_ARGS=${RUN_ARGS:---task triviaqa --backend vllm}
export BASE_PORT=${BASE_PORT:-8000}
PARTITION=${PARTITION:-}                           # empty: the cluster's default partition
TIME_LIMIT=${TIME_LIMIT:-2-00:00:00}
CPUS_PER_TASK=${CPUS_PER_TASK:-16}
MERGE_CPUS=${MERGE_CPUS:-2}
LOG_DIR=${LOG_DIR:-$OUT/slurm-logs}
SBATCH_EXTRA=${SBATCH_EXTRA:-}                     # e.g. "--account=abc --qos=high"
# ---------------------------------------------------------------------------------------------

mkdir -p "$OUT" "$LOG_DIR"
common=(--export=ALL --time="$TIME_LIMIT" --chdir="$HALLULOG_DIR")
[ -n "$PARTITION" ] && common+=(--partition="$PARTITION")
# shellcheck disable=SC2206
[ -n "$SBATCH_EXTRA" ] && common+=($SBATCH_EXTRA)
shard_args=(--array="0-$((SHARDS - 1))" --cpus-per-task="$CPUS_PER_TASK"
            --output="$LOG_DIR/shard-%A_%a.out")
[ "$GPUS_PER_NODE" -gt 0 ] && shard_args+=(--gres="gpu:$GPUS_PER_NODE")

array_job=$(sbatch --parsable "${common[@]}" "${shard_args[@]}" "$here/shard.sbatch")
array_job=${array_job%%;*}
merge_job=$(sbatch --parsable "${common[@]}" --cpus-per-task="$MERGE_CPUS" \
    --dependency="afterok:$array_job" --output="$LOG_DIR/merge-%j.out" "$here/merge.sbatch")
merge_job=${merge_job%%;*}
echo "shards: job $array_job (array 0-$((SHARDS - 1))); merge: job $merge_job -> $OUT/merged"
