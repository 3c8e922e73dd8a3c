#!/bin/bash
#SBATCH --job-name=train
#SBATCH --partition=train
#SBATCH --gres=gpu:8
#SBATCH --constraint=h100
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-gpu=24
#SBATCH --mem-per-gpu=240G
#SBATCH --account=research
#SBATCH --qos=train
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
export CLUSTERJOB_EXPECT_MODEL=H100
export CLUSTERJOB_EXPECT_COUNT=8
export CLUSTERJOB_SITE=<repo>/site_configs/h100farm.yaml
# Python: /usr/bin/python3 (given to render)
python=/usr/bin/python3

# GPU usage: a sampler reads this job's GPUs' utilisation, memory and power through NVML every
# $CLUSTERJOB_USAGE_INTERVAL seconds (30; 0: off) for `clusterjob status` and `show`. It runs
# in the background until the job ends and never fails it.
srun --nodes=4 --ntasks=4 --ntasks-per-node=1 --gres=gpu:8 --overlap /opt/clusterjob/bin/clusterjob sample-usage </dev/null >/dev/null 2>&1 &

# Preflight: check this job's GPUs against the site's node map before training starts. A
# failed check ends the job with exit 78 ("preflight failed"), never the program's own.
srun --nodes=4 --ntasks=4 --ntasks-per-node=1 --gres=gpu:8 /opt/clusterjob/bin/clusterjob preflight || { echo "clusterjob: preflight failed (exit $?): the program was not started" >&2; exit 78; }

# torchrun with a static rendezvous on the first node of the job. Its address comes from
# Slurm (NodeAddr), so it also works where several nodes share one host.
mapfile -t job_nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
MASTER_ADDR=$(scontrol show node -o "${job_nodes[0]}" | sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p')
export MASTER_ADDR=${MASTER_ADDR:-${job_nodes[0]}}
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
# Each worker's lines start with [rankN]: (torchrun --tee), each node's with its index (srun
# --label): `clusterjob logs JOB --rank N` or `--node NAME` picks them out.
export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]: '
# One torchrun per node; it starts one worker per GPU. "$0" is the interpreter below.
exec srun --nodes=4 --ntasks=4 --ntasks-per-node=1 --gres=gpu:8 --label --kill-on-bad-exit=1 \
    bash -c 'exec "$0" -m torch.distributed.run --nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node=8 --node-rank="$SLURM_NODEID" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" --tee=3 "$@"' \
    "$python" train.py
