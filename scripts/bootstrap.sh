#!/usr/bin/env bash
# Create .venv with clusterjob and what the tests need. Idempotent; used by quickstart.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# The distribution used to be called `clusterjob` (a name taken on the package index):
# drop it first, or its RECORD would take the shared `clusterjob` script away later.
if .venv/bin/python -m pip show -q clusterjob >/dev/null 2>&1; then
    .venv/bin/python -m pip uninstall -q -y clusterjob
fi
extra=${1:-}
if [ -n "$extra" ]; then
    .venv/bin/python -m pip install -q -e ".[$extra]"
else
    .venv/bin/python -m pip install -q -e .
fi
