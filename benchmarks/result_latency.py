"""Result latency: a trivial function job, from submit to its value back, through clusterjob
and through submitit, in the same run on a real Slurm (the local sandbox).

Each run is a fresh child Python that submits ``trivial()`` (returns 42) and waits for its
result; the child times submit -> result, what a user's driver waits, and prints it. The
runs alternate (clusterjob, submitit, submitit, clusterjob, ...) so both see the same load
on the machine and the cluster. Both use the same Slurm clients through logging wrappers on
PATH, so the Slurm calls each made while waiting are counted as the controller sees them.

submitit runs from its own virtual environment (never a clusterjob dependency; see
``cli.submitit_python``), and its job runs that environment's Python; clusterjob's job runs
the Python that submitted it. Both jobs ask for nothing but a 5-minute time limit.

``python -m benchmarks --only result_latency`` writes the figures with the others;
``python -m benchmarks.result_latency [--repeats N]`` prints them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.cli import submitit_python
from benchmarks.common import PYTHON, Result, median
from benchmarks.slurm_load import count_calls, wrap_clients
from benchmarks.submission import SANDBOX_SITE

CLUSTERJOB = "clusterjob: submit_function(trivial).result()"
SUBMITIT = "submitit: executor.submit(trivial).result()"

CLUSTERJOB_CODE = """\
import sys, time
import clusterjob

def trivial():
    return 42

cluster = clusterjob.Cluster(sys.argv[1])
start = time.perf_counter()
job = cluster.options(time="0:05:00").submit_function(trivial)
submitted = time.perf_counter() - start
assert job.result(timeout=300) == 42
print(time.perf_counter() - start, submitted, getattr(job, "settled_by", None) or "slurm")
"""

SUBMITIT_CODE = """\
import sys, time
import submitit

def trivial():
    return 42

executor = submitit.AutoExecutor(folder=sys.argv[1], cluster="slurm")
executor.update_parameters(timeout_min=5)
start = time.perf_counter()
job = executor.submit(trivial)
submitted = time.perf_counter() - start
assert job.result() == 42
print(time.perf_counter() - start, submitted, "-")
"""


def _one(
    cmd: list[str], env: dict[str, str], log: Path, cwd: Path
) -> tuple[float, float, str, dict[str, int]]:
    """One child's submit -> result seconds, of which the submit call's, how it got the
    result, and its Slurm calls."""
    count_calls(log)  # start from none
    done = subprocess.run(
        cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {done.returncode}: {done.stderr[-2000:]}")
    seconds, submitting, how = done.stdout.split()[-3:]
    return float(seconds), float(submitting), how, count_calls(log)


def run(
    work: Path, *, quick: bool, repeats: int | None = None, revisions: tuple[str, ...] = ()
) -> Result:
    """The figures; ``revisions``: clusterjob at these git revisions too, in the same run
    (each exported as ``compare`` does), for a before/after."""
    result = Result("result_latency", "Result latency of a trivial function job, vs submitit")
    site = os.environ.get("CLUSTERJOB_BENCH_SITE", SANDBOX_SITE)
    if shutil.which("sbatch") is None or not Path(site).is_file():
        result.notes.append(f"skipped: needs sbatch on PATH and a site file ({site})")
        return result
    submitit, how = submitit_python(install=not quick)
    result.notes.append(how)
    n = repeats or (2 if quick else 5)
    log = work / "latency-calls.log"
    bin_dir = work / "latency-wrappers"
    wrap_clients(bin_dir, log)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["CLUSTERJOB_DATA_DIR"] = str(work / "latency-data")
    env["XDG_CACHE_HOME"] = str(work / "xdg-cache")  # template, site caches
    env.pop("CLUSTERJOB_STATUS_CACHE_SECONDS", None)  # as a user has it
    env.pop("CLUSTERJOB_HOST", None)
    (work / "cwd").mkdir(exist_ok=True)
    commands = {CLUSTERJOB: ([PYTHON, "-c", CLUSTERJOB_CODE, site], env)}
    for rev in revisions:
        from benchmarks.compare import export

        old = dict(env, PYTHONPATH=str(export(rev, work / f"rev-{rev}")))
        commands[f"clusterjob at {rev}: the same"] = (
            [PYTHON, "-P", "-c", CLUSTERJOB_CODE, site],
            old,
        )
    if submitit:
        folder = work / "submitit-logs"
        commands[SUBMITIT] = ([submitit, "-c", SUBMITIT_CODE, str(folder)], env)
    times: dict[str, list[float]] = {name: [] for name in commands}
    submits: dict[str, list[float]] = {name: [] for name in commands}
    calls: dict[str, list[int]] = {name: [] for name in commands}
    hows: dict[str, list[str]] = {name: [] for name in commands}
    names = list(commands)
    for i in range(n):
        for name in names if i % 2 == 0 else reversed(names):
            cmd, cmd_env = commands[name]
            seconds, submitting, got, counted = _one(cmd, cmd_env, log, work / "cwd")
            times[name].append(seconds)
            submits[name].append(submitting)
            hows[name].append(got)
            calls[name].append(sum(v for k, v in counted.items() if k != "sbatch"))
    cj = median(times[CLUSTERJOB])
    if submitit:
        sub = median(times[SUBMITIT])
        result.add(SUBMITIT, sub * 1000, "ms", note=f"median of {n}; {_spread(times[SUBMITIT])}")
        result.compared(
            CLUSTERJOB,
            cj,
            SUBMITIT,
            sub,
            note=f"median of {n}, alternated with submitit; {_spread(times[CLUSTERJOB])}",
        )
    else:
        result.add(CLUSTERJOB, cj * 1000, "ms", note=f"median of {n}")
    for name in names:
        if name.startswith("clusterjob at "):
            then = median(times[name])
            result.add(
                name,
                then * 1000,
                "ms",
                ratio=then / median(times[SUBMITIT]) if submitit else None,
                reference=SUBMITIT if submitit else None,
                note=f"median of {n}; {_spread(times[name])}; this tree's is {cj / then:.2f}x it",
            )
    for name in names:  # what is not waiting for the job: the submit call itself
        result.add(
            f"{name.split(':')[0]}: of which the submit call",
            median(submits[name]) * 1000,
            "ms",
            note=f"median of {n}; {_spread(submits[name])}",
        )
    for name in names:
        result.add(
            f"{name.split(':')[0]}: Slurm status calls while waiting",
            median([float(c) for c in calls[name]]),
            "calls",
            note="squeue/sacct/scontrol per job, median; each run: "
            + ", ".join(str(c) for c in calls[name]),
        )
    result.notes.append(
        f"clusterjob results settled by: {', '.join(hows[CLUSTERJOB])} (marker: the result file "
        "seen before Slurm said the job ended)"
    )
    result.notes.append(f"site {site}; Python {sys.version.split()[0]}")
    return result


def _spread(values: list[float]) -> str:
    return "runs " + ", ".join(f"{v:.2f}" for v in values) + " s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.result_latency")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--rev", action="append", default=[], help="clusterjob at this git revision too"
    )
    args = parser.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="clusterjob-latency-") as tmp:
        started = time.monotonic()
        result = run(Path(tmp), quick=False, repeats=args.repeats, revisions=tuple(args.rev))
    print(f"{result.title} (load average {os.getloadavg()})")
    for row in result.rows:
        ratio = f"  {row.ratio:5.2f}x {row.reference}" if row.ratio is not None else ""
        print(f"  {row.figure:<58} {row.value:9.1f} {row.unit}{ratio}  ({row.note})")
    for note in result.notes:
        print(f"  - {note}")
    print(f"  took {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
