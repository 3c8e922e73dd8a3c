#!/bin/bash
#SBATCH --job-name=train
#SBATCH --partition=gpu
#SBATCH --gpus-per-node=nvidia_a100-sxm4-80gb:4
#SBATCH --constraint=a100_80g
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-gpu=16
#SBATCH --mem-per-gpu=120G
#SBATCH --account=training
#SBATCH --qos=normal
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
export CLUSTERJOB_EXPECT_MODEL=A100-80GB
export CLUSTERJOB_EXPECT_COUNT=4
export CLUSTERJOB_SITE=<repo>/site_configs/hpccentre.yaml
# Python: /usr/bin/python3 (given to render)
python=/usr/bin/python3

# GPU usage: a sampler reads this job's GPUs' utilisation, memory and power through NVML every
# $CLUSTERJOB_USAGE_INTERVAL seconds (30; 0: off) for `clusterjob status` and `show`. It runs
# in the background until the job ends and never fails it.
/opt/clusterjob/bin/clusterjob sample-usage $$ </dev/null >/dev/null 2>&1 &

# Preflight: check this job's GPUs against the site's node map before training starts. A
# failed check ends the job with exit 78 ("preflight failed"), never the program's own.
/opt/clusterjob/bin/clusterjob preflight || { echo "clusterjob: preflight failed (exit $?): the program was not started" >&2; exit 78; }

exec "$python" train.py
