#!/usr/bin/env bash
# The whole test suite, unit and end-to-end, on a fresh Debian machine as root:
# installs clusterjob and test tools, brings up the local Slurm cluster, runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test
# torchrun for the multi-node test; a CPU build of torch is enough.
.venv/bin/python -m pip install -q "torch==2.13.0"
# Static checks first: mypy --strict on the package (config in pyproject.toml) and ruff.
.venv/bin/mypy
.venv/bin/ruff check clusterjob tests benchmarks examples
.venv/bin/ruff format --check clusterjob tests benchmarks examples
.venv/bin/clusterjob sandbox up
eval "$(.venv/bin/clusterjob sandbox env)"
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
exit $rc
