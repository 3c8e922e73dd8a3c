#!/usr/bin/env bash
# The whole test suite, unit and end-to-end, on a fresh Debian machine as root:
# installs clusterjob and test tools, brings up the local Slurm cluster, runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test,docs
# torch for the torchrun tests (marker `torch`): a CPU build (about 200 MB), never the package
# index's default build (CUDA, with triton and 15 nvidia wheels: a 4.8 GB venv). It comes from
# PyTorch's CPU index or from a wheel cache pip is configured with. Where neither has one for
# this Python, the torch tests are left out (said here and by pytest's count) unless
# CLUSTERJOB_TEST_TORCH=any, which takes the default build (.ci/run sets it).
TORCH=2.13.0
pytest_torch=()
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    if ! .venv/bin/python -m pip install -q --retries 1 --timeout 30 \
        --extra-index-url https://download.pytorch.org/whl/cpu "torch==$TORCH+cpu"; then
        if [ "${CLUSTERJOB_TEST_TORCH:-}" = any ]; then
            .venv/bin/python -m pip install -q "torch==$TORCH"
        else
            echo "no CPU build of torch $TORCH for this Python: the torchrun tests are" \
                "deselected (-m 'not torch'); CLUSTERJOB_TEST_TORCH=any installs the" \
                "default build (4.8 GB) and runs them" >&2
            pytest_torch=(-m "not torch")
        fi
    fi
fi
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
# Chromium (Debian's package) for the documentation's browser test, tests/test_docs_browser.py:
# every page of the built site at 1280 and 390 px, screenshots under build/screenshots/.
# Without it that test is skipped, and says so.
chromium_package() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null
}
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null; then
    chromium_package || { apt-get update -q >/dev/null && chromium_package; } ||
        echo "chromium not installed: the documentation's browser test is skipped" >&2
fi
# mmdebstrap builds the Debian roots of the Grid Engine cluster and of the other Slurm releases.
if ! command -v mmdebstrap >/dev/null && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap >/dev/null ||
        echo "mmdebstrap not installed: the Grid Engine sandbox cannot build its root" >&2
fi
# Static checks first: mypy --strict on the package (config in pyproject.toml) and ruff.
.venv/bin/mypy
.venv/bin/ruff check clusterjob hydra_plugins tests benchmarks examples
.venv/bin/ruff format --check clusterjob hydra_plugins tests benchmarks examples
# The documentation: reference pages and diagrams as the code says, and the site built strictly
# (seconds).
.venv/bin/python scripts/gen_reference.py --check
# The shipped templates compiled to Python and submit's option table, as their sources say.
.venv/bin/python scripts/gen_compiled.py --check
.venv/bin/python scripts/gen_diagrams.py --check
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
# The local Grid Engine cluster comes up beside the Slurm one: its own Debian root (built once,
# about a minute; then about 15 s), state dir and namespaces, so its fixed ports and daemons
# clash with nothing of Slurm's. pytest waits for it (tests/e2e/test_gridengine_sandbox.py
# reuses its root); it is left up, as the Slurm one is.
ge_log=$(mktemp --suffix=.clusterjob-gridengine.log)
.venv/bin/clusterjob sandbox up --scheduler gridengine >"$ge_log" 2>&1 &
ge_pid=$!
.venv/bin/clusterjob sandbox up
eval "$(.venv/bin/clusterjob sandbox env)"
if ! wait "$ge_pid"; then
    cat "$ge_log" >&2
    echo "the Grid Engine sandbox did not come up (clusterjob sandbox up --scheduler gridengine)" >&2
    exit 1
fi
rm -f "$ge_log"
# The end-to-end tests on the other Slurm releases, each in its Debian root (and the unit
# tests on trixie's Python 3.13): scripts/test-releases.sh, when CLUSTERJOB_TEST_RELEASES
# names them ("24.11 26.05"; .ci/run does). They run beside the host's pytest, not after it:
# most of an end-to-end test is waiting for Slurm, so the two share the cores well (each
# release's sandbox has its own state directory, ports and daemons). Their output is printed
# once they end. Started once the host's sandbox is up: both may install packages with apt.
releases_pid=
if [ -n "${CLUSTERJOB_TEST_RELEASES:-}" ]; then
    releases_log=$(mktemp --suffix=.clusterjob-releases.log)
    bash scripts/test-releases.sh >"$releases_log" 2>&1 &
    releases_pid=$!
    echo "the other Slurm releases ($CLUSTERJOB_TEST_RELEASES) are tested beside this run;" \
        "their output follows pytest's" >&2
fi
set +e
.venv/bin/python -m pytest "${pytest_torch[@]}" "$@"
rc=$?
if [ -n "$releases_pid" ]; then
    wait "$releases_pid"
    releases_rc=$?
    echo "=== scripts/test-releases.sh ($CLUSTERJOB_TEST_RELEASES), exit $releases_rc ==="
    cat "$releases_log"
    rm -f "$releases_log"
    rc=$((rc ? rc : releases_rc))
fi
set -e
exit $rc
