#!/usr/bin/env bash
# The tests on the Slurm releases the host does not ship, each in its Debian root
# (`clusterjob sandbox up --slurm R`): the end-to-end tests (marker `slurm`) against that
# release's daemons, with that release's clients and that suite's Python; and, in trixie
# (Python 3.13), the unit tests too. Run after scripts/test.sh has made .venv, as root.
#
#   bash scripts/test-releases.sh                 # 24.11 and 26.05
#   CLUSTERJOB_TEST_RELEASES="24.11" bash scripts/test-releases.sh -x
#
# Extra arguments go to each pytest run. The roots are built once (mmdebstrap, about a minute
# each) and kept in /var/cache/clusterjob-sandbox; each sandbox is taken down after its run,
# whatever the result. The torchrun tests (marker `torch`) run on the host only: the package
# registry has no CPU build of torch for these Pythons, and its default build is 4.8 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
cj=.venv/bin/clusterjob
releases=${CLUSTERJOB_TEST_RELEASES:-24.11 26.05}
# Host-only tests, left out inside the roots (named here, counted by pytest as deselected):
# the quickstart test runs the checkout's own .venv, whose interpreter is the host's.
host_only=(--deselect
    tests/e2e/test_docs_blocks.py::test_quickstart_ends_with_the_line_that_makes_the_next_command_work)
echo "inside the roots, host-only: ${host_only[*]:1}; marker torch" >&2
rc=0
summary=()
for release in $releases; do
    start=$(date +%s)
    trap '$cj sandbox down --slurm "$release" >/dev/null 2>&1 || true' EXIT
    $cj sandbox up --slurm "$release" >/dev/null
    up_s=$(($(date +%s) - start))
    run() {  # pytest inside the release's root; its exit status
        $cj sandbox exec --slurm "$release" -- python -m pytest -p no:cacheprovider \
            "${host_only[@]}" "$@"
    }
    set +e
    run -m "slurm and not torch" "$@"
    e2e=$?
    unit=-
    if [ "$release" = 24.11 ]; then  # trixie's Python 3.13
        run -m "not slurm and not torch" "$@"
        unit=$?
    fi
    set -e
    $cj sandbox down --slurm "$release" >/dev/null
    trap - EXIT
    summary+=("Slurm $release: up ${up_s}s, e2e exit $e2e, unit tests (trixie only) exit $unit, $(($(date +%s) - start))s in all")
    for code in $e2e $unit; do
        if [ "$code" != - ] && [ "$code" != 0 ]; then rc=$code; fi
    done
done
printf '%s\n' "${summary[@]}"
exit $rc
