#!/usr/bin/env bash
# Fresh Debian machine, as root: install clusterjob, bring up the local Slurm cluster with
# stand-in GPUs, submit examples/train.py on two A100s, and show the preflight report and output.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh sandbox
cj=.venv/bin/clusterjob
$cj sandbox up
eval "$($cj sandbox env)"
$cj submit examples/train.py --gpus 2 --model A100
echo "----- job output (preflight report on stderr and stdout of the job) -----"
$cj logs last --follow
echo "----- status -----"
$cj status last
# The one line a person needs next: this shell's environment ends with the script.
next="eval \"\$($PWD/.venv/bin/clusterjob sandbox env)\"; export PATH=\"$PWD/.venv/bin:\$PATH\""
echo "----- next: type this in your shell, then use clusterjob as in the README and docs/ -----"
echo "$next"
