"""``clusterjob status`` over a full registry against the bare Slurm calls it makes.

The registry (a temporary CLUSTERJOB_DATA_DIR) holds 10,000 jobs (1,000 with ``--quick``):
all but a few ended (COMPLETED, FAILED, CANCELLED, TIMEOUT, their exit codes recorded) over
the last 30 days, a hundredth of them within the last day (what ``status`` lists), and a few
live ones, real jobs held in the local Slurm (``--hold``, ``--begin=now+1hour``: nothing
runs; cancelled by their unique name at the end). One ``status`` runs under logging wrappers
that record each Slurm client call with its arguments; then ``status`` (its status cache
off, so every run asks Slurm) and those very calls run bare, interleaved, and the ratio is
printed. Then (not with ``--quick``) the served ``status`` and its calls again, with the
controller filled to a busy cluster's ``BUSY_JOBS`` by held jobs: ``squeue --jobs`` reads the
controller's whole job table, so its time, and the ratio, depend on how many jobs it holds.
"""

from __future__ import annotations

import os
import random
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import (
    REFERENCE,
    REFERENCE_NAME,
    CommandServer,
    Result,
    clusterjob_command,
    controller_jobs,
    interleaved_runs,
    median,
    run_timed,
)
from benchmarks.slurm_load import CLIENTS

TARGET_RATIO = 1.5
ENDED = (("COMPLETED", 0), ("FAILED", 1), ("CANCELLED", None), ("TIMEOUT", None))
# A rendered job script's size (the registry keeps each whole): ~2.5 KB
SCRIPT = "#!/bin/bash\n" + "".join(f"#SBATCH --comment=line-{i:02d}{'x' * 40}\n" for i in range(40))
SEP = "\x1e"  # between the logged arguments of one call (sacct's delimiter is \x1f)


def wrap_with_arguments(bin_dir: Path, log: Path) -> dict[str, str]:
    """Wrappers that log each call's name and arguments, then run the real client; the
    real clients' paths by name."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    real: dict[str, str] = {}
    for name in CLIENTS:
        found = shutil.which(name)
        if found is None:
            continue
        real[name] = found
        (bin_dir / name).write_text(
            "#!/bin/sh\n"
            f"{{ printf '%s' {name}; for a do printf '{SEP}%s' \"$a\"; done; printf '\\n'; }}"
            f' >> "{log}"\n'
            f'exec "{found}" "$@"\n'
        )
        (bin_dir / name).chmod(0o755)
    return real


def logged_calls(log: Path) -> list[list[str]]:
    text = log.read_text() if log.exists() else ""  # not splitlines(): it splits at \x1e too
    calls = [line.split(SEP) for line in text.split("\n") if line]
    log.unlink(missing_ok=True)
    return calls


def seed(data: Path, ended: int, live: dict[str, str], cluster: str) -> None:
    """``ended`` ended jobs over the last 30 days, and the ``live`` ones (id -> name)."""
    from clusterjob.jobs.registry import REGISTRY_FILE, JobRecord, Registry

    now = time.time()
    rng = random.Random(3)

    def record(
        i: int, job_id: str, name: str, at: float, state: str, code: int | None
    ) -> JobRecord:
        return JobRecord(
            job_id=job_id,
            cluster=cluster,
            site="bench",
            token=f"status{i:06d}",
            job_name=name,
            script=SCRIPT,
            script_path=str(data / f"job-{i}.sh"),
            command_line="clusterjob submit train.py --gpus 8",
            work_dir=str(data),
            git_commit=None,
            submitted_at=at,
            state=state,
            exit_code=code,
        )

    records = []
    for i in range(ended):
        state, code = ENDED[i % len(ENDED)]
        recent = i % 100 == 0  # a hundredth within the last day: what `status` lists
        at = now - (rng.uniform(60, 86_000) if recent else rng.uniform(86_400, 30 * 86_400))
        records.append(record(i, str(50_000_000 + i), f"train-{i}", at, state, code))
    for j, (job_id, name) in enumerate(live.items()):
        records.append(record(ended + j, job_id, name, now - 30, "PENDING", None))
    Registry(data / REGISTRY_FILE).add(*records)


BUSY_JOBS = 7_500  # a busy cluster's controller: Slurm's default MaxJobCount is 10,000
BUSY_REPEATS = 11


def _on_a_busy_controller(
    runs: dict[str, Callable[[], float]], held: int, env: dict[str, str], name: str, work: Path
) -> tuple[int, dict[str, list[float]]] | None:
    """``runs`` again, with the controller holding ``BUSY_JOBS`` jobs (it held ``held``;
    held ones of ``name`` added, cancelled with the live ones): the jobs it held then, and
    the times; None where it could not be filled."""
    fill = ["sbatch", "--hold", f"--job-name={name}", f"--chdir={work}", "--output=/dev/null",
            "--wrap=true"]  # fmt: skip
    for _ in range(BUSY_JOBS - held):
        if subprocess.run(fill, env=env, capture_output=True, check=False).returncode != 0:
            return None  # the controller's MaxJobCount, most likely
    times = interleaved_runs(runs, BUSY_REPEATS, random.Random(5))
    return controller_jobs(env) or BUSY_JOBS, times


def run(work: Path, *, quick: bool) -> Result:
    result = Result("status_scale", "`clusterjob status` with a full registry vs bare Slurm calls")
    if shutil.which("squeue") is None or shutil.which("sbatch") is None:
        result.notes.append("skipped: no Slurm clients (squeue, sbatch) on PATH")
        return result
    total, live_count = (1_000, 2) if quick else (10_000, 5)
    repeats = 5 if quick else 21
    cluster = os.environ.get("CLUSTERJOB_BENCH_CLUSTER", "sandbox")
    name = f"cj-bench-status-{uuid.uuid4().hex[:8]}"
    live: dict[str, str] = {}
    try:
        for _ in range(live_count):
            done = subprocess.run(
                ["sbatch", "--parsable", "--hold", "--begin=now+1hour", f"--job-name={name}",
                 f"--chdir={work}", f"--output={work}/slurm-%j.out", "--wrap=true"],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            live[done.stdout.strip().split(";")[0]] = name
        data = work / "data"
        seed(data, total - live_count, live, cluster)
        log = work / "calls.log"
        bin_dir = work / "wrappers"
        real = wrap_with_arguments(bin_dir, log)
        env = dict(os.environ)
        env.update(
            CLUSTERJOB_DATA_DIR=str(data),
            CLUSTERJOB_STATUS_CACHE_SECONDS="0",  # every run asks Slurm, as the bare calls do
        )
        status = [*clusterjob_command(), "status"]
        run_timed(status, env)  # first run: records whatever Slurm says, as a user's would
        logged = {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"}
        run_timed(status, logged)
        calls = logged_calls(log)
        bare = [[real.get(c[0], c[0]), *c[1:]] for c in calls]
        with CommandServer(env) as server:
            runs: dict[str, Callable[[], float]] = {
                "status": lambda: run_timed(status, env),
                "served": lambda: run_timed(status, server.env),
                "bare": lambda: sum(run_timed(cmd, env) for cmd in bare),
                REFERENCE_NAME: lambda: run_timed(REFERENCE, env),  # any Python command's floor
            }
            times = interleaved_runs(runs, repeats, random.Random(4))
            served = server.served("status", repeats)
            held = controller_jobs(env)
            busy = None
            if not quick and held is not None:  # then on a controller as busy as a cluster's
                busy = _on_a_busy_controller(
                    {k: runs[k] for k in ("served", "bare")}, held, env, name, work
                )
    finally:
        if live:
            subprocess.run(["scancel", f"--name={name}"], capture_output=True, check=False)
    ours, theirs = median(times["status"]), median(times["bare"])
    described = (
        "; ".join(shlex.join(c).encode("unicode_escape").decode()[:160] for c in calls)
        or "no Slurm call"
    )
    bare_name = " + ".join(c[0] for c in calls) or "no Slurm call"
    result.add(
        f"bare {bare_name}, the calls `status` made",
        theirs * 1000,
        "ms",
        note=f"median of {repeats}, each call timed alone and summed; the controller held "
        f"{'?' if held is None else f'{held:,}'} jobs: {described}",
    )
    if theirs > 0:
        result.compared(
            f"clusterjob status, {total:,} jobs in the registry ({live_count} live), served",
            median(times["served"]),
            f"bare {bare_name}",
            theirs,
            TARGET_RATIO,
            note=f"median of {repeats}, interleaved; {served} of them run by the command server",
        )
        result.compared(
            f"clusterjob status, {total:,} jobs in the registry ({live_count} live), "
            "its own process",
            ours,
            f"bare {bare_name}",
            theirs,
            note=f"median of {repeats}, interleaved; status cache off; "
            f"{total - live_count:,} ended, {(total - live_count + 99) // 100} of them in the "
            "last day",
        )
    else:
        result.add(f"clusterjob status, {total:,} jobs", ours * 1000, "ms", note="no Slurm call")
    floor = median(times[REFERENCE_NAME])
    if theirs > 0:
        result.compared(
            REFERENCE_NAME,
            floor,
            f"bare {bare_name}",
            theirs,
            note=f"median of {repeats}, interleaved: starting Python alone, against the bare calls",
        )
        result.compared(
            f"floor: {REFERENCE_NAME}, then the same calls",
            floor + theirs,
            f"bare {bare_name}",
            theirs,
            note="the least a command costs that starts Python and then makes these calls: any "
            "Python CLI, the command server's client too (its worker makes the calls); a target "
            "below this ratio needs a client that is not a Python program",
        )
    if busy is not None:
        held_busy, busy_times = busy
        busy_served, busy_bare = median(busy_times["served"]), median(busy_times["bare"])
        result.add(
            f"bare {bare_name}, the controller holding {held_busy:,} jobs",
            busy_bare * 1000,
            "ms",
            note=f"median of {BUSY_REPEATS}, the same calls; the controller filled with held "
            "jobs (cancelled after) to a busy cluster's size: squeue reads its whole job table",
        )
        result.compared(
            f"clusterjob status, {total:,} jobs in the registry ({live_count} live), served, "
            f"the controller holding {held_busy:,} jobs",
            busy_served,
            f"bare {bare_name}, the controller holding {held_busy:,} jobs",
            busy_bare,
            TARGET_RATIO,
            note=f"median of {BUSY_REPEATS}, interleaved: what `status` adds to its squeue does "
            "not grow with the controller, squeue does",
        )
    result.add(
        "Slurm calls, one `status`",
        len(calls),
        "calls",
        target="<= 2",
        met=len(calls) <= 2,
        note=", ".join(c[0] for c in calls),
    )
    return result
