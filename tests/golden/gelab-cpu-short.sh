#!/bin/bash
#$ -N train
#$ -S /bin/bash
#$ -cwd
#$ -V
#$ -j y
#$ -q short.q
#$ -m ea
#$ -r n
#$ -ac clusterjob=0123456789abcdef

set -euo pipefail

# CUDA numbers GPUs fastest-first unless told otherwise; NVML uses PCI bus order.
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export CLUSTERJOB_TOKEN=0123456789abcdef
export CLUSTERJOB_SITE=<repo>/site_configs/gelab.yaml
# Python: /usr/bin/python3 (given to render)
python=/usr/bin/python3

# A CPU-only job (--gpus 0): no GPUs to bind.

exec "$python" train.py
