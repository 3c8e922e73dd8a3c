"""Waiting for jobs to end, at the cost of one status per interval (shared through the
status cache with every other clusterjob polling the same jobs)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from clusterjob.errors import UsageError
from clusterjob.jobs.registry import Registry
from clusterjob.jobs.status import JobStatus, StatusCache, cache_for, status
from clusterjob.slurm import parse
from clusterjob.slurm.commands import SlurmClient

TIMED_OUT = 124  # what `wait --timeout` exits with when a job is still going, as timeout(1)
# How long a job that ended other than COMPLETED is polled for its exit code: squeue shows the
# end (of a job, or an array's task) a moment before slurmdbd records the code in sacct. A CI
# run's `wait` caught an array FAILED with its failed task's code not yet known and exited 1
# instead of the task's 7. Without accounting the code never comes: then the end is final.
EXIT_CODE_GRACE = 30.0


@dataclass(frozen=True)
class WaitResult:
    rows: list[JobStatus]
    timed_out: bool

    @property
    def exit_code(self) -> int:
        """The first non-zero of the jobs' exit codes (a job that ended other than COMPLETED
        without a code counts as 1; an array as its first failed task); 124 on a timeout."""
        if self.timed_out:
            return TIMED_OUT
        for row in self.rows:
            code = job_exit_code(row)
            if code:
                return code
        return 0

    def __str__(self) -> str:
        if self.timed_out:
            going = [f"{r.job_id} {r.state}" for r in self.rows if not ended(r)]
            return f"timed out; still going: {', '.join(going)}"
        return "\n".join(
            f"{r.job_id} {r.state}"
            + (f" (exit {r.exit_code})" if r.exit_code is not None else "")
            + (f": {r.tasks_summary}" if r.tasks_summary else "")
            for r in self.rows
        )


def ended(row: JobStatus) -> bool:
    return parse.is_final(row.state) or row.state == "UNKNOWN"


def job_exit_code(row: JobStatus) -> int:
    if row.state == "COMPLETED":
        return row.exit_code or 0
    return row.exit_code or 1


def wait(
    jobs: Sequence[str],
    *,
    timeout: float | None = None,
    interval: float = 10.0,
    client: SlurmClient | None = None,
    registry: Registry | None = None,
    cache: StatusCache | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> WaitResult:
    """Poll ``status(jobs)`` every ``interval`` seconds until every job has ended (an array:
    every task) or ``timeout`` seconds have passed."""
    if not jobs:
        raise UsageError("name at least one job to wait for (or `last`)")
    if interval <= 0 or (timeout is not None and timeout < 0):
        raise UsageError("--interval must be positive and --timeout not negative")
    client = client or SlurmClient()
    registry = registry or Registry(host=client.runner.transport.label)
    deadline = None if timeout is None else clock() + timeout
    ended_without_code: dict[str, float] = {}  # job id -> when first seen so

    def settled(row: JobStatus, now: float) -> bool:
        if not ended(row):
            return False
        if row.exit_code is not None:
            return True
        first = ended_without_code.setdefault(row.job_id, now)
        return row.state != "COMPLETED" and now - first >= EXIT_CODE_GRACE

    while True:
        rows = status(jobs, client=client, registry=registry, cache=cache or cache_for(client))
        now = clock()
        if all([settled(r, now) for r in rows]):
            return WaitResult(rows, timed_out=False)
        if deadline is not None and clock() >= deadline:
            return WaitResult(rows, timed_out=True)
        pause = interval if deadline is None else max(0.0, min(interval, deadline - clock()))
        sleep(pause)
