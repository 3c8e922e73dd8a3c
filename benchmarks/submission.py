"""Submission: N jobs through ``clusterjob submit`` against the same N through plain sbatch.

Runs on a real Slurm (the local sandbox: SLURM_CONF and its site file). Every job is tiny
and starts no earlier than an hour from now (``--begin=now+1hour``), so nothing runs; all
of them carry one job name unique to this run and are cancelled by that name at the end,
whatever happens. Plain sbatch submits the very script clusterjob renders, so the
difference is clusterjob's own work: load the site, render, record in the registry.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from benchmarks.common import (
    REFERENCE,
    REFERENCE_NAME,
    CommandServer,
    Result,
    clusterjob_command,
    controller_jobs,
    median,
    time_round,
)
from benchmarks.slurm_load import count_calls, wrap_clients
from clusterjob.sandbox.cluster import resolve_state_dir
from clusterjob.sandbox.config import Layout

SERVED = "clusterjob submit, per job (served)"
TARGET_RATIO = 5.0  # a one-job submit (or a sweep, one array job) / a bare sbatch of its script
SWEEP_TASKS = 200
DATA = "CLUSTERJOB_DATA_DIR"
# The local sandbox's site: the one CLUSTERJOB_SANDBOX_DIR names (each Slurm release's
# sandbox has its own state dir), else the default.
SANDBOX_SITE = str(Layout(resolve_state_dir()).site_yaml)


def run(work: Path, *, quick: bool, jobs: int | None = None) -> Result:
    result = Result("submission", "Submission through clusterjob vs plain sbatch")
    site = os.environ.get("CLUSTERJOB_BENCH_SITE", SANDBOX_SITE)
    if shutil.which("sbatch") is None or not Path(site).is_file():
        result.notes.append(f"skipped: needs sbatch on PATH and a site file ({site})")
        return result
    n = jobs or (10 if quick else 200)
    name = f"cjbench-{os.getpid()}-{int(time.time())}"
    script = work / "tiny.py"
    script.write_text("print('tiny')\n")
    log = work / "submit-calls.log"
    bin_dir = work / "submit-wrappers"
    wrap_clients(bin_dir, log)
    env = dict(os.environ)
    env["CLUSTERJOB_DATA_DIR"] = str(work / "submit-data")
    env["XDG_CACHE_HOME"] = str(work / "xdg-cache")  # template, site caches
    counted = dict(env, PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}")
    model = os.environ.get("CLUSTERJOB_BENCH_MODEL", "A100")
    cj = [*clusterjob_command(), "submit", str(script), "--gpus", "1", "--model", model,
          "--site", site, "--job-name", name, "--sbatch-arg=--begin=now+1hour"]  # fmt: skip
    rendered = subprocess.run(
        [*cj, "--dry-run"], env=env, capture_output=True, text=True, check=True
    ).stdout
    plain_script = work / "plain.sh"
    plain_script.write_text(rendered)
    plain = ["sbatch", "--parsable", f"--chdir={work}", str(plain_script)]

    held = controller_jobs(env)  # before: the loop's own jobs are cancelled after it
    times: dict[str, list[float]] = {
        "clusterjob submit": [], SERVED: [], "sbatch": [], REFERENCE_NAME: []
    }  # fmt: skip
    try:
        with CommandServer(env) as server:
            for i in range(n):
                order = [
                    ("clusterjob submit", cj, env),
                    (SERVED, cj, server.env),
                    ("sbatch", plain, env),
                    (REFERENCE_NAME, REFERENCE, env),
                ]
                time_round(order if i % 2 else order[::-1], times)
            served = server.served("submit", n)
        for _ in range(3):  # apart from the timed runs: the wrappers cost a shell each
            subprocess.run(cj, env=counted, capture_output=True, check=True)
    finally:
        subprocess.run(["scancel", f"--name={name}"], capture_output=True, check=False)
    cj_median, sb_median = median(times["clusterjob submit"]), median(times["sbatch"])
    result.add(
        "plain sbatch, per job",
        sb_median * 1000,
        "ms",
        note=f"median of {n}; the controller held {'?' if held is None else f'{held:,}'} jobs "
        "before the loop",
    )
    result.compared(
        SERVED,
        median(times[SERVED]),
        "plain sbatch, per job",
        sb_median,
        TARGET_RATIO,
        note=f"median of {n}, interleaved with sbatch; {served} of them run by the server "
        "(a shell loop's every submit but its first)",
    )
    result.compared(
        "clusterjob submit, per job, each in a process of its own",
        cj_median,
        "plain sbatch, per job",
        sb_median,
        note=f"median of {n}, interleaved; CLUSTERJOB_SERVER=0, or a loop's first submit",
    )
    floor = median(times[REFERENCE_NAME])
    result.add(
        f"{REFERENCE_NAME} (the floor of any Python command)",
        floor * 1000,
        "ms",
        ratio=floor / sb_median,
        reference="plain sbatch, per job",
        note="starting the interpreter alone, interleaved with the submissions",
    )
    result.add(
        f"floor: {REFERENCE_NAME}, then plain sbatch",
        (floor + sb_median) * 1000,
        "ms",
        ratio=(floor + sb_median) / sb_median,
        reference="plain sbatch, per job",
        note="the least a command costs that starts Python and then runs sbatch (any Python "
        f"CLI run once per command); the target leaves clusterjob the rest of {TARGET_RATIO:g}x",
    )
    result.add(
        "clusterjob submit against the Python floor",
        cj_median * 1000,
        "ms",
        ratio=cj_median / floor,
        reference=REFERENCE_NAME,
    )
    total_sb = sum(times["sbatch"])
    for label, total in (
        ("through clusterjob, served", sum(times[SERVED])),
        ("through clusterjob, each in a process of its own", sum(times["clusterjob submit"])),
    ):
        result.add(
            f"{n} jobs, total wall time {label}",
            total,
            "s",
            ratio=total / total_sb,
            reference=f"{n} jobs through plain sbatch ({total_sb:.1f} s)",
        )
    calls = count_calls(log)
    result.add(
        "Slurm client calls per clusterjob submit",
        sum(calls.values()) / 3,
        "calls",
        note="over 3 submits: " + ", ".join(f"{k} {v}" for k, v in sorted(calls.items())),
    )
    result.notes.append(f"site {site}; model {model}; all jobs cancelled by name {name}")
    sweep(result, work, cj, env, counted, log, quick=quick)
    return result


def sweep(
    result: Result,
    work: Path,
    cj: list[str],
    env: dict[str, str],
    counted: dict[str, str],
    log: Path,
    *,
    quick: bool,
) -> None:
    """A sweep of TASKS tasks (``submit --sweep``, one array job) against one ``sbatch`` of
    the same array script written by hand (clusterjob's own rendering of it), interleaved;
    then the Slurm calls of one ``status`` over a 1,000-task sweep.

    Interleaved with them, where the sweep's time goes: a one-job ``submit`` (what the tasks
    add over it is the per-task cost) and the sweep's ``--dry-run`` (everything before Slurm:
    the interpreter, imports, the site, rendering; the rest is sbatch and the registry)."""
    tasks, rounds = (20, 3) if quick else (SWEEP_TASKS, 21)
    name = f"cjsweep-{os.getpid()}-{int(time.time())}"
    values = ",".join(str(i) for i in range(tasks))
    swept = [*cj[:-3], "--job-name", name, cj[-1], "--sweep", f"i={values}"]
    rendered = subprocess.run(
        [*swept, "--dry-run"], env=env, capture_output=True, text=True, check=True
    ).stdout
    script = work / "array.sh"
    script.write_text(rendered)  # `#SBATCH --array=0-N` and a case on SLURM_ARRAY_TASK_ID
    array = ["sbatch", "--parsable", f"--chdir={work}", str(script)]
    one = [*cj[:-3], "--job-name", name, cj[-1]]
    times: dict[str, list[float]] = {
        "sweep": [], "served": [], "array": [], "one": [], "dry": [], "pass": []
    }  # fmt: skip
    try:
        with CommandServer(env) as server:
            for i in range(rounds):
                order = [
                    ("sweep", swept, env),
                    ("served", swept, server.env),
                    ("array", array, env),
                    ("one", one, env),
                    ("dry", [*swept, "--dry-run"], env),
                    ("pass", list(REFERENCE), env),
                ]
                time_round(order if i % 2 else order[::-1], times)
            served = server.served("submit", rounds)
        ours, theirs = median(times["sweep"]), median(times["array"])
        note = f"median of {rounds}"
        result.add("plain sbatch of the array script", theirs * 1000, "ms", note=note)
        warm = median(times["served"])
        result.compared(
            f"clusterjob submit --sweep, {tasks} tasks (one array job, served)",
            warm,
            "plain sbatch of the array script",
            theirs,
            TARGET_RATIO,
            note=f"{note}, interleaved; {served} of them run by the server",
        )
        result.compared(
            f"clusterjob submit --sweep, {tasks} tasks (one array job, its own process)",
            ours,
            "plain sbatch of the array script",
            theirs,
            note=f"{note}, interleaved; {ours / tasks * 1000:.2f} ms per task",
        )
        single, dry = median(times["one"]), median(times["dry"])
        result.compared(
            "clusterjob submit, one job (same options, no --sweep)",
            single,
            "plain sbatch of the array script",
            theirs,
            note=f"{note}, interleaved with the sweep; sweep minus this: "
            f"{(ours - single) * 1000:+.0f} ms for {tasks} tasks "
            f"({(ours - single) / tasks * 1000:+.3f} ms a task; noise is tens of ms)",
        )
        result.compared(
            f"clusterjob submit --sweep --dry-run, {tasks} tasks",
            dry,
            "plain sbatch of the array script",
            theirs,
            note=f"{note}, interleaved; all but Slurm and the registry: "
            f"{dry / ours:.0%} of the sweep's time",
        )
        floor = median(times["pass"])
        result.compared(
            f"floor of any Python CLI: {REFERENCE_NAME}",
            floor,
            "plain sbatch of the array script",
            theirs,
            note=f"{note}, interleaved; {floor / ours:.0%} of the sweep's time; the rest "
            f"({(ours - floor) * 1000:.0f} ms) is clusterjob's own imports, site, rendering, "
            f"registry and its sbatch call (neither Typer nor Jinja2 is loaded)",
        )
        _status_of_a_big_sweep(result, work, swept, counted, log)
    finally:
        subprocess.run(["scancel", f"--name={name}"], capture_output=True, check=False)
    result.notes.append(f"sweeps cancelled by name {name}")


def _status_of_a_big_sweep(
    result: Result, work: Path, swept: list[str], counted: dict[str, str], log: Path
) -> None:
    """One ``status`` over a 1,000-task sweep: its Slurm calls."""
    big = ",".join(str(i) for i in range(1_000))
    env = dict(counted, **{DATA: str(work / "sweep-status-data")})
    for _ in range(3):  # a busy controller may refuse a moment (exit 4): ask again
        done = subprocess.run([*swept[:-1], f"i={big}"], env=env, capture_output=True, text=True)
        if done.returncode == 0:
            break
        time.sleep(2)
    else:
        result.notes.append(f"1,000-task sweep not submitted: {done.stderr.strip()[-200:]}")
        return
    count_calls(log)
    subprocess.run([*clusterjob_command(), "status"], env=env, capture_output=True)
    calls = count_calls(log)
    slurm = sum(calls.get(c, 0) for c in ("squeue", "sacct", "scontrol"))
    result.add(
        "Slurm calls, one `status` of a 1,000-task sweep",
        slurm,
        "calls",
        target="<= 2",
        met=slurm <= 2,
        note=", ".join(f"{k} {v}" for k, v in sorted(calls.items())),
    )
