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
# each) and kept in /var/cache/clusterjob-sandbox. The sandboxes are brought up one after the
# other (building a root may install mmdebstrap with apt, which takes one lock), then tested
# side by side (each its own state, ports and daemons; an end-to-end test mostly waits for
# Slurm), each run's output printed once all have ended; every sandbox is taken down at the
# end, whatever the result. The torchrun tests (marker `torch`) run on the host only: the package
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
logs=$(mktemp -d)
down_all() {
    for release in $releases; do
        $cj sandbox down --slurm "$release" >/dev/null 2>&1 || true
    done
    rm -rf "$logs"
}
trap down_all EXIT
declare -A up_s
for release in $releases; do
    start=$(date +%s)
    $cj sandbox up --slurm "$release" >/dev/null
    up_s[$release]=$(($(date +%s) - start))
done
test_release() {  # its tests inside its root; "E2E UNIT SECONDS" (exit statuses) on fd 3
    local release=$1 e2e unit=- start
    shift
    start=$(date +%s)
    run() {
        $cj sandbox exec --slurm "$release" -- python -m pytest -p no:cacheprovider \
            "${host_only[@]}" "$@"
    }
    set +e
    run -m "slurm and not torch" "$@"
    e2e=$?
    if [ "$release" = 24.11 ]; then  # trixie's Python 3.13
        # the Grid Engine tests run on the host, against its Grid Engine cluster
        run -m "not slurm and not torch and not gridengine" "$@"
        unit=$?
    fi
    echo "$e2e $unit $(($(date +%s) - start))" >&3
}
declare -A pids
for release in $releases; do
    test_release "$release" "$@" >"$logs/$release.log" 2>&1 3>"$logs/$release.rc" &
    pids[$release]=$!
done
rc=0
summary=()
for release in $releases; do
    wait "${pids[$release]}" || true
    read -r e2e unit secs <"$logs/$release.rc" || { e2e=1; unit=-; secs=?; }
    echo "=== Slurm $release ==="
    cat "$logs/$release.log"
    summary+=("Slurm $release: up ${up_s[$release]}s, e2e exit $e2e, unit tests (trixie only) exit $unit, tests ${secs}s")
    for code in $e2e $unit; do
        if [ "$code" != - ] && [ "$code" != 0 ]; then rc=$code; fi
    done
done
printf '%s\n' "${summary[@]}"
exit $rc
