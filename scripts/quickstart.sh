#!/usr/bin/env bash
# Fresh Debian machine, as root: install clusterjob, bring up the local Slurm cluster with
# stand-in GPUs, submit examples/train.py on two A100s, and show the preflight report and output.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
cj=.venv/bin/clusterjob
$cj sandbox up
eval "$($cj sandbox env)"
site=$($cj sandbox env --site-path)
job=$($cj submit examples/train.py --gpus 2 --model A100 --site "$site" -- --epochs 2)
echo "submitted job $job"
$cj status "$job" --wait 120 >/dev/null || true
$cj status "$job"
echo "----- job output -----"
$cj logs "$job"
