"""The API's poller with 1,000 futures: Slurm calls per refresh, CPU between refreshes.

One ``Cluster`` holds 1,000 futures (100 with ``--quick``) of jobs held in the queue, in
three shapes: command jobs (Slurm their only word), the tasks of one ``map()`` (one array
job, one directory), and separate function jobs (one directory each, their result files
looked for between refreshes). Slurm's answers come from a stand-in behind the cluster's
``exec`` hook that says every asked job is pending (held), in squeue's own format, so the
figures are the poller's alone: each command the poller runs is counted, and the poller
thread's CPU clock (``pthread_getcpuclockid``) is read around every refresh, so its CPU
between refreshes is known apart from the refreshes' own. ``poll_interval`` is 1 s here
(10 s by default): ten times the looks a user's program pays, the worst case of the share.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.common import Result

TARGET_CALLS = 2  # per refresh
TARGET_PERCENT = 5.0  # of one core, between refreshes
POLL_INTERVAL = 1.0
SHAPES = ("command jobs", "tasks of one map()", "separate function jobs")


class HeldSlurm:
    """Answers squeue with every asked job (or array) pending, held; sacct with nothing."""

    def __init__(self, cluster_name: str = "bench") -> None:
        self.cluster_name = cluster_name
        self.calls: list[str] = []
        self.counting = False  # count from the first refresh of all the futures on
        self.counted = 0
        self.lock = threading.Lock()

    def __call__(self, cmd: Sequence[str], timeout: float, input: str | None) -> object:
        from clusterjob.slurm.parse import DELIMITER, SQUEUE_FIELDS
        from clusterjob.slurm.runner import SlurmResult

        with self.lock:
            self.calls.append(cmd[0])
            if self.counting:
                self.counted += 1
        out = ""
        if cmd[0] == "squeue":
            ids = next((a.split("=", 1)[1] for a in cmd if a.startswith("--jobs=")), "")
            rows = []
            for job_id in filter(None, ids.split(",")):
                shown = f"{job_id}_[0-999]" if job_id.startswith("7") else job_id  # map()
                values = {
                    "job_id": shown, "cluster": self.cluster_name, "state": "PENDING",
                    "exit_code": "0", "reason": "JobHeldUser", "partition": "gpu",
                    "nodes": "", "elapsed": "0:00", "time_limit": "1:00:00", "start": "N/A",
                    "submit": "2026-01-01T00:00:00", "tres_per_node": "gres/gpu:1",
                    "tres_per_job": "N/A", "tres_per_task": "N/A", "user": "bench",
                    "work_dir": "/tmp", "stdout": "/tmp/out", "stderr": "/tmp/out",
                    "comment": "", "name": "bench",
                }  # fmt: skip
                rows.append(DELIMITER.join(values[name] for name, _ in SQUEUE_FIELDS))
            out = "\n".join(rows) + "\n"
        return SlurmResult(tuple(cmd), 0, out, "")


def _thread_cpu(thread: threading.Thread) -> float:
    ident = thread.ident
    if ident is None:
        return 0.0
    return time.clock_gettime(time.pthread_getcpuclockid(ident))


def measure(work: Path, shape: str, n: int, seconds: float) -> dict[str, float]:
    """Hold ``n`` futures of ``shape`` for ``seconds``; the poller's calls and CPU."""
    from clusterjob.api.cluster import Cluster, Job

    data = work / f"data-{SHAPES.index(shape)}"
    data.mkdir(parents=True, exist_ok=True)
    os.environ["CLUSTERJOB_DATA_DIR"] = str(data)
    os.environ["CLUSTERJOB_STATUS_CACHE_SECONDS"] = "0"  # every refresh asks
    slurm = HeldSlurm()
    cluster = Cluster(str(work / "site.yaml"), host="", exec=slurm, poll_interval=POLL_INTERVAL)  # type: ignore[arg-type]
    poller = cluster._poller
    # per refresh of all n, read in the poller thread: CPU at start, at end, wall at start,
    # at end (those while the futures were still being made are left out)
    spans: list[tuple[float, float, float, float]] = []
    refresh: Callable[[Sequence[Job]], None] = poller.refresh

    def timed(asked: Sequence[Job]) -> None:
        whole = len(asked) == n
        slurm.counting = slurm.counting or whole
        cpu, wall = time.thread_time(), time.monotonic()
        try:
            refresh(asked)
        finally:
            if whole:
                spans.append((cpu, time.thread_time(), wall, time.monotonic()))

    poller.refresh = timed  # type: ignore[method-assign]
    jobs: list[Job] = []
    if shape == "command jobs":
        jobs = [Job(cluster, str(60_000_000 + i)) for i in range(n)]
    elif shape == "tasks of one map()":
        jobdir = work / "map"
        jobdir.mkdir(exist_ok=True)
        jobs = [Job(cluster, f"7000001_{i}", jobdir=str(jobdir), task=i) for i in range(n)]
    else:
        for i in range(n):
            jobdir = work / "functions" / f"f{i:05d}"
            jobdir.mkdir(parents=True, exist_ok=True)
            jobs.append(Job(cluster, str(61_000_000 + i), jobdir=str(jobdir), task=0))
    thread = poller._thread
    assert thread is not None
    time.sleep(seconds)
    poller.stop()
    thread.join(timeout=60)
    undone = sum(not j.done() for j in jobs)
    # between two refreshes: the thread's CPU from the end of one to the start of the next,
    # over the wall time between them (the first refresh is at once: jobs found by id)
    gaps = list(zip(spans, spans[1:], strict=False))
    between_cpu = sum(b[0] - a[1] for a, b in gaps)
    between_wall = sum(b[2] - a[3] for a, b in gaps)
    refresh_cpu = [s[1] - s[0] for s in spans]
    return {
        "calls_per_refresh": slurm.counted / len(spans) if spans else float("nan"),
        "refreshes": len(spans),
        "percent_between": 100 * between_cpu / between_wall if between_wall > 0 else float("nan"),
        "refresh_cpu_ms": 1000 * sum(refresh_cpu) / len(spans) if spans else 0.0,
        "pending": undone,
    }


def run(work: Path, *, quick: bool) -> Result:
    result = Result("poller", "API poller with many futures: Slurm calls and CPU")
    n = 100 if quick else 1_000
    seconds = 3.0 if quick else 20.0
    saved = {
        k: os.environ.get(k) for k in ("CLUSTERJOB_DATA_DIR", "CLUSTERJOB_STATUS_CACHE_SECONDS")
    }
    site = work / "site.yaml"
    from clusterjob import resources

    site.write_text((resources.site_configs_dir() / "mllab.yaml").read_text())
    try:
        for shape in SHAPES:
            figures = measure(work, shape, n, seconds)
            calls = figures["calls_per_refresh"]
            result.add(
                f"Slurm calls per refresh, {n:,} futures ({shape})",
                calls,
                "calls",
                target=f"<= {TARGET_CALLS}",
                met=calls <= TARGET_CALLS,
                note=f"{figures['refreshes']:.0f} refreshes in {seconds:g} s at poll_interval "
                f"{POLL_INTERVAL:g} s; {figures['refresh_cpu_ms']:.1f} ms CPU per refresh; "
                f"{figures['pending']:.0f} futures still pending at the end",
            )
            percent = figures["percent_between"]
            result.add(
                f"poller CPU between refreshes, {n:,} futures ({shape})",
                percent,
                "% of a core",
                target=f"< {TARGET_PERCENT}%",
                met=percent < TARGET_PERCENT,
                note="the poller thread's CPU clock over the wall time outside its refreshes",
            )
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        from clusterjob.api.cluster import stop_polling

        stop_polling()
    result.notes.append(
        "Slurm's answers: a stand-in behind Cluster(exec=...) saying every job is held"
    )
    return result
