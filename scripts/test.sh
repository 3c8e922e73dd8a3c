#!/usr/bin/env bash
# The whole test suite, unit and end-to-end, on a fresh Debian machine as root:
# installs clusterjob and test tools, brings up the local Slurm cluster, runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test,docs
# torchrun for the multi-node test; a CPU build of torch is enough.
.venv/bin/python -m pip install -q "torch==2.13.0"
# Environment modules (Debian's, seconds to install) for the --module test; without them the
# test falls back to a stand-in `module` function.
if [ ! -r /usr/share/modules/init/bash ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q environment-modules >/dev/null ||
        echo "environment-modules not installed: the --module test uses a stand-in" >&2
fi
# OpenSSH's server and rsync for the --host tests: a real sshd on a loopback port fronts the
# local cluster (started by the tests themselves, with their own config and keys).
ssh_packages() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server openssh-client rsync \
        >/dev/null
}
if { [ ! -x /usr/sbin/sshd ] || ! command -v rsync >/dev/null; } && command -v apt-get >/dev/null; then
    ssh_packages || { apt-get update -q >/dev/null && ssh_packages; } ||
        echo "openssh-server/rsync not installed: the --host tests are skipped" >&2
fi
# Slurm's SPANK header, to build the pyxis stand-in plugin of the --container-image test.
if [ ! -r /usr/include/slurm/spank.h ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q libslurm-dev >/dev/null ||
        echo "libslurm-dev not installed: the --container-image test is skipped" >&2
fi
# Static checks first: mypy --strict on the package (config in pyproject.toml) and ruff.
.venv/bin/mypy
.venv/bin/ruff check clusterjob tests benchmarks examples
.venv/bin/ruff format --check clusterjob tests benchmarks examples
# The documentation: reference pages as the code says, and the site built strictly (seconds).
.venv/bin/python scripts/gen_reference.py --check
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
.venv/bin/clusterjob sandbox up
eval "$(.venv/bin/clusterjob sandbox env)"
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
exit $rc
