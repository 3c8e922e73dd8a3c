#!/bin/bash
#$ -N train
#$ -S /bin/bash
#$ -cwd
#$ -V
#$ -j y
#$ -q gpu.q
#$ -l gpu=2,gpu_type=a100,h_rt=1:00:00
#$ -r n
#$ -ac clusterjob=0123456789abcdef

set -euo pipefail

# CUDA numbers GPUs fastest-first unless told otherwise; NVML uses PCI bus order.
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export CLUSTERJOB_TOKEN=0123456789abcdef
export CLUSTERJOB_EXPECT_MODEL=A100
export CLUSTERJOB_EXPECT_COUNT=2
export CLUSTERJOB_SITE=<repo>/site_configs/gelab.yaml
# Python: /usr/bin/python3 (given to render)
python=/usr/bin/python3

# GPUs: Grid Engine counts them but names none. The root prolog (clusterjob bind-gpus)
# claimed this job's on this host and checked them against the site's node map; where no
# prolog is installed, this step does both itself, and the claim lasts until this shell
# ends. Either way it prints CUDA_VISIBLE_DEVICES (PCI bus order) for this job alone.
gpus=$(/opt/clusterjob/bin/clusterjob bind-gpus --job-step --gpus 2 --model A100 --watch-pid $$) || { echo "clusterjob: no GPUs bound (above: why); the job did not start" >&2; exit 2; }
eval "$gpus"

exec "$python" train.py
