#!/bin/bash
#SBATCH --job-name=train
#SBATCH --partition=gpu
#SBATCH --gres=gpu:a100:1
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-gpu=8
#SBATCH --mem-per-gpu=60G
#SBATCH --account=mllab
#SBATCH --qos=normal
#SBATCH --array=0-1%2
#SBATCH --signal=B:USR1@90
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --comment=clusterjob:0123456789abcdef

# Slurm requeues a job (preemption, node failure, --requeue) with no limit of its own: an
# attempt past 3 requeue(s) (--max-requeues) stops here, before anything runs.
export CLUSTERJOB_MAX_REQUEUES=3
if (( ${SLURM_RESTART_COUNT:-0} > CLUSTERJOB_MAX_REQUEUES )); then
    message="clusterjob: requeued $SLURM_RESTART_COUNT times, limit $CLUSTERJOB_MAX_REQUEUES reached (--max-requeues): stopping without running the program"
    echo "$message"
    exit 79
fi

set -euo pipefail

# CUDA numbers GPUs fastest-first unless told otherwise; NVML and Slurm use PCI bus order.
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export CLUSTERJOB_TOKEN=0123456789abcdef
export CLUSTERJOB_EXPECT_MODEL=A100
export CLUSTERJOB_EXPECT_COUNT=1
export CLUSTERJOB_SITE=<repo>/site_configs/mllab.yaml
# Python: /usr/bin/python3 (given to render)
python=/usr/bin/python3
# --requeue: every attempt appends to the same log (--open-mode=append); this line parts them.
echo "=== clusterjob: attempt $(( ${SLURM_RESTART_COUNT:-0} + 1 )) of job $SLURM_JOB_ID on $(hostname) at $(date '+%F %T') ==="
# --sweep/--params: this array task's own arguments, appended to the script's.
case "$SLURM_ARRAY_TASK_ID" in
0) task_args=(--lr=1e-4 --bs=32) ;;
1) task_args=(--lr=3e-4 '--name=$(touch pwned) it'"'"'s') ;;
*) echo "clusterjob: no arguments for array task $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;
esac

# GPU usage: a sampler reads this job's GPUs' utilisation, memory and power through NVML every
# $CLUSTERJOB_USAGE_INTERVAL seconds (30; 0: off) for `clusterjob status` and `show`. It runs
# in the background until the job ends and never fails it.
/opt/clusterjob/bin/clusterjob sample-usage $$ </dev/null >/dev/null 2>&1 &

# Preflight: check this job's GPUs against the site's node map before training starts. A
# failed check ends the job with exit 78 ("preflight failed"), never the program's own.
/opt/clusterjob/bin/clusterjob preflight || { echo "clusterjob: preflight failed (exit $?): the program was not started" >&2; exit 78; }

exec "$python" train.py --epochs 3 "${task_args[@]}"
