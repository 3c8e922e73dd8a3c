#!/usr/bin/env bash
# Mutation testing of the core packages with mutmut: how many deliberately broken versions of
# the code (mutants) the unit tests notice. Not part of CI; run by hand, e.g. before a release:
#
#   scripts/mutation.sh                      # every target below, in turn
#   scripts/mutation.sh slurm-syntax shell   # only these targets
#   JOBS=4 scripts/mutation.sh slurm-parse   # more parallel test runs (default 2)
#   COMMIT=HEAD scripts/mutation.sh request  # the files of a commit, not the working tree
#
# The jobs modules (submit, status, logs) are three targets with the same tests: one run of
# all three took too long to repeat after each round of tests (12 minutes at JOBS=2).
#
# The site-loader target keeps only the in-process count test of test_bad_input.py: with the
# whole file (its cases run `python -m clusterjob` in other directories) mutmut's first,
# unmutated test run failed there.
#
# Each target is one module (or a few) and the unit tests that are about it; mutmut runs
# only the tests that reach a mutated function, so a target takes minutes, not hours.
# The work happens in a scratch copy of the working tree (mutmut writes a mutants/ tree next
# to the sources); the repository only gains a row per target at the end of
# benchmarks/results/mutation.md (the table stays last: the triage goes above it) and the
# list of survivors in benchmarks/results/mutation-survivors/<target>.txt.
# Never the local Slurm cluster: tests marked `slurm` are deselected; so is the test that the
# hooks import nothing outside the standard library (every mutated module imports mutmut).
# Tests that start `python -m clusterjob` with an environment of their own run the original
# code, not the mutant (mutmut names the mutant in an environment variable): they kill none.
set -euo pipefail

ROOT=${ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
PY=${PYTHON:-$ROOT/.venv/bin/python}
JOBS=${JOBS:-2}
RESULTS=$ROOT/benchmarks/results/mutation.md
SURVIVORS=$ROOT/benchmarks/results/mutation-survivors

# target | modules to mutate (space-separated) | test files that are about them
TARGETS=(
  "shell|clusterjob/jobscript/shell.py|tests/test_render.py tests/test_security_render.py tests/test_bad_input.py"
  "slurm-syntax|clusterjob/slurm/syntax.py|tests/test_slurm_syntax.py tests/test_request.py"
  "node-trust|clusterjob/node/trust.py|tests/test_node_trust.py tests/test_hooks.py tests/test_security_prolog.py"
  "slurm-parse|clusterjob/slurm/parse.py|tests/test_slurm_parse.py tests/test_slurm_real.py tests/test_site_drift.py tests/test_slurm_commands.py tests/test_jobs.py tests/test_avail.py tests/test_core_regressions.py"
  "registry|clusterjob/jobs/registry.py|tests/test_registry.py tests/test_security_registry.py tests/test_core_regressions.py"
  "workstation-queue|clusterjob/workstation/queue.py clusterjob/workstation/claims.py|tests/test_workstation_claims.py tests/test_workstation_lockdir.py tests/test_workstation_selection.py tests/test_security_workstation.py tests/test_core_regressions.py"
  "request|clusterjob/jobscript/request.py|tests/test_request.py tests/test_request_exact.py tests/test_site_policies.py tests/test_render.py"
  "site-loader|clusterjob/site/loader.py clusterjob/site/yamlcheck.py|tests/test_site_config.py tests/test_site_loader_exact.py tests/test_site_policies.py tests/test_site_mig.py tests/test_site_gpu_syntax.py tests/test_bad_input.py::test_count_of_bad_inputs_tried"
  "site-policy|clusterjob/site/jobpolicy.py|tests/test_site_policies.py tests/test_site_loader_exact.py tests/test_site_config.py"
  "node-checks|clusterjob/node/checks/identity.py clusterjob/node/checks/allocation.py clusterjob/node/checks/ordering.py clusterjob/node/checks/health.py|tests/test_checks.py tests/test_checks_exact.py tests/test_checks_allocation.py tests/test_checks_mig.py tests/test_core_regressions.py"
  "jobs-avail|clusterjob/jobs/avail.py|tests/test_avail.py tests/test_slurm_real.py tests/test_core_regressions.py"
  "render|clusterjob/jobscript/render.py|tests/test_render_exact.py tests/test_render.py tests/test_render_golden.py tests/test_security_render.py tests/test_site_policies.py tests/test_core_regressions.py"
  "jobs-submit|clusterjob/jobs/submit.py|tests/test_jobs.py tests/test_jobs_lifecycle.py tests/test_jobs_mutants.py tests/test_security_registry.py tests/test_core_regressions.py"
  "jobs-status|clusterjob/jobs/status.py|tests/test_jobs.py tests/test_jobs_lifecycle.py tests/test_jobs_mutants.py tests/test_security_registry.py tests/test_core_regressions.py"
  "jobs-logs|clusterjob/jobs/logs.py|tests/test_jobs.py tests/test_jobs_lifecycle.py tests/test_jobs_mutants.py tests/test_security_registry.py tests/test_core_regressions.py"
  "prolog|clusterjob/node/prolog.py clusterjob/node/preflight.py|tests/test_prolog_exact.py tests/test_site_policies.py tests/test_core_regressions.py tests/test_checks.py tests/test_hooks.py tests/test_hooks_drain_reason.py tests/test_version_skew.py tests/test_job_environment.py"
)

have_mutmut() { "$PY" -c 'import mutmut' 2>/dev/null; }
if ! have_mutmut; then
  echo "mutmut is not installed: $PY -m pip install 'mutmut>=3.3'" >&2
  exit 2
fi

wanted=("$@")
selected=()
for entry in "${TARGETS[@]}"; do
  name=${entry%%|*}
  if [ ${#wanted[@]} -eq 0 ] || printf '%s\n' "${wanted[@]}" | grep -qx "$name"; then
    selected+=("$entry")
  fi
done
if [ ${#selected[@]} -eq 0 ]; then
  echo "no such target: $*; targets: $(printf '%s ' "${TARGETS[@]%%|*}")" >&2
  exit 2
fi

mkdir -p "$SURVIVORS"
if [ ! -f "$RESULTS" ]; then
  cat >"$RESULTS" <<'EOF'
# Mutation scores

Score = killed (timeouts included) / all mutants; "no tests" counts as a survivor. Survivors
of a target's latest run, with their diffs: `mutation-survivors/<target>.txt`.

## Runs

| date (UTC) | target | modules | mutants | killed | survived | no tests | timeout | score | minutes |
|---|---|---|---|---|---|---|---|---|---|
EOF
fi

for entry in "${selected[@]}"; do
  IFS='|' read -r name modules tests <<<"$entry"
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/clusterjob-mutation-$name.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  chmod 755 "$scratch"  # some tests run code as a second Unix user
  if [ -n "${COMMIT:-}" ]; then
    # COMMIT=HEAD (or any commit): that commit's files, not the working tree's
    (cd "$ROOT" && git archive "$COMMIT") | tar -x -C "$scratch"
  else
    # The working tree as it is (tracked and new files), without build output or mutants.
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
      xargs -0 cp --parents -t "$scratch" 2>/dev/null || true)
  fi
  # mutmut 3 leaves decorated functions alone, and every node check is a `@check(...)`
  # function: in the scratch copy only, each registration becomes a call after its function.
  (cd "$scratch" && "$PY" scripts/mutation_undecorate.py $modules)
  only=$(printf '"%s", ' $modules)
  sel=$(printf '"%s", ' $tests)
  cat >>"$scratch/pyproject.toml" <<EOF

[tool.mutmut]
source_paths = ["clusterjob/"]
only_mutate = [${only%, }]
pytest_add_cli_args = ["-p", "no:cacheprovider", "-m", "not slurm", "-q",
  "--deselect", "tests/test_hooks.py::test_hooks_import_no_heavy_modules"]
pytest_add_cli_args_test_selection = [${sel%, }]
use_git_change_detection = false
also_copy = ["templates/", "site_configs/", "examples/", "benchmarks/", "scripts/", "docs/",
             "README.md", "CHANGELOG.md"]
EOF
  echo "== $name: mutating $modules; tests: $tests" >&2
  start=$(date +%s)
  (cd "$scratch" && "$PY" -m mutmut run --max-children "$JOBS" >"$scratch/run.log" 2>&1) || {
    kept=${TMPDIR:-/tmp}/clusterjob-mutation-$name.log
    cp "$scratch/run.log" "$kept"
    echo "mutmut failed for $name (whole log: $kept); its failures:" >&2
    grep -E '^(FAILED|ERROR) ' "$kept" | head -20 >&2 || tail -20 "$kept" >&2
    rm -rf "$scratch"
    trap - EXIT
    continue
  }
  minutes=$(( ($(date +%s) - start + 59) / 60 ))
  (
    cd "$scratch"
    "$PY" -m mutmut export-cicd-stats >/dev/null
    # every mutant that was not killed, with its diff: the raw material of the triage
    "$PY" - <<'EOF'
from mutmut.__main__ import SourceFileMutationData, get_diff_for_mutant, status_by_exit_code
from mutmut.__main__ import walk_mutatable_files

for path in walk_mutatable_files():
    data = SourceFileMutationData(path=path)
    data.load()
    for mutant, code in sorted(data.exit_code_by_key.items()):
        status = status_by_exit_code[code]
        if status not in ("killed", "timeout", "skipped"):
            print(f"# {mutant}: {status}")
            print(get_diff_for_mutant(mutant, path=data.path))
EOF
  ) >"$SURVIVORS/$name.txt" || true
  "$PY" - "$scratch/mutants/mutmut-cicd-stats.json" "$name" "$modules" "$minutes" >>"$RESULTS" <<'EOF'
import json, sys, time
path, name, modules, minutes = sys.argv[1:]
s = json.load(open(path))
counted = s["total"] - s.get("skipped", 0)
killed = s["killed"] + s.get("timeout", 0)
score = 100.0 * killed / counted if counted else 0.0
print(
    f"| {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} | {name} | {modules} | {counted} "
    f"| {s['killed']} | {s['survived']} | {s.get('no_tests', 0)} | {s.get('timeout', 0)} "
    f"| {score:.1f}% | {minutes} |"
)
EOF
  tail -1 "$RESULTS" >&2
  # the latest run of each target of this script, on top
  "$PY" "$ROOT/scripts/mutation_table.py" "$RESULTS" "${TARGETS[@]%%|*}"
  rm -rf "$scratch"
  trap - EXIT
done
