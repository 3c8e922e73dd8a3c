#!/bin/bash
#$ -N sweep
#$ -S /bin/bash
#$ -cwd
#$ -V
#$ -j y
#$ -q gpu.q
#$ -l gpu=8,gpu_type=h100
#$ -t 1-2:1
#$ -hold_jid 41
#$ -o logs/$JOB_NAME-$JOB_ID_$TASK_ID.out
#$ -r y
#$ -ac clusterjob=0123456789abcdef

set -euo pipefail

# CUDA numbers GPUs fastest-first unless told otherwise; NVML uses PCI bus order.
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export CLUSTERJOB_TOKEN=0123456789abcdef
export CLUSTERJOB_EXPECT_MODEL=H100
export CLUSTERJOB_EXPECT_COUNT=8
export CLUSTERJOB_SITE=<repo>/site_configs/gelab.yaml
# Python: /usr/bin/python3 (given to render)
python=/usr/bin/python3
# Grid Engine numbers array tasks from 1: task N is index N-1 of --array (and of a sweep).
export CLUSTERJOB_ARRAY_INDEX=$(( SGE_TASK_ID - 1 ))
# --sweep/--params: this array task's own arguments, appended to the script's.
case "$CLUSTERJOB_ARRAY_INDEX" in
0) task_args=(--lr 0.1) ;;
1) task_args=(--lr 0.01) ;;
*) echo "clusterjob: no arguments for array task $SGE_TASK_ID" >&2; exit 2 ;;
esac

# GPUs: Grid Engine counts them but names none. The root prolog (clusterjob bind-gpus)
# claimed this job's on this host and checked them against the site's node map; where no
# prolog is installed, this step does both itself, and the claim lasts until this shell
# ends. Either way it prints CUDA_VISIBLE_DEVICES (PCI bus order) for this job alone.
gpus=$(/opt/clusterjob/bin/clusterjob bind-gpus --job-step --gpus 8 --model H100 --watch-pid $$) || { echo "clusterjob: no GPUs bound (above: why); the job did not start" >&2; exit 2; }
eval "$gpus"

# torchrun on this one host: one worker per GPU, rendezvous here (--standalone).
export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]: '
exec "$python" -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=8 --tee=3 train.py "${task_args[@]}"
