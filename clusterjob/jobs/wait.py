"""Waiting for jobs to end, at the cost of one status per interval (shared through the
status cache with every other clusterjob polling the same jobs)."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from clusterjob.errors import UsageError
from clusterjob.jobs.registry import Registry
from clusterjob.jobs.status import JobStatus, StatusCache, cache_for, status
from clusterjob.slurm import parse
from clusterjob.slurm.commands import SlurmClient

TIMED_OUT = 124  # what `wait --timeout` exits with when a job is still going, as timeout(1)
# What `wait` exits with when a job waits for something that cannot happen (a dependency on a
# job that failed or was cancelled): nothing will change without you, so waiting ends there.
NEVER_STARTS = 125
NEVER_START_REASONS = frozenset({"DependencyNeverSatisfied"})
# How long a job that ended other than COMPLETED is polled for its exit code: squeue shows the
# end (of a job, or an array's task) a moment before slurmdbd records the code in sacct. A CI
# run's `wait` caught an array FAILED with its failed task's code not yet known and exited 1
# instead of the task's 7. Without accounting the code never comes: then the end is final.
EXIT_CODE_GRACE = 30.0
# A job whose own marker says it ended (a function job's result file) is asked about again at
# once, then after ENDING_FIRST seconds, doubling up to the interval, until Slurm shows the end.
ENDING_FIRST = 0.25


@dataclass(frozen=True)
class WaitResult:
    rows: list[JobStatus]
    timed_out: bool
    # what happened on the way: a bad node recorded, a job submitted again without it
    notes: tuple[str, ...] = ()

    @property
    def stuck(self) -> list[JobStatus]:
        """The jobs that will never start (``never_starts``)."""
        return [r for r in self.rows if never_starts(r)]

    @property
    def ended(self) -> bool:
        """Whether every job ended (not timed out, none that will never start)."""
        return not self.timed_out and not self.stuck

    @property
    def exit_code(self) -> int:
        """The first non-zero of the jobs' exit codes (a job that ended other than COMPLETED
        without a code counts as 1; an array as its first failed task); 124 on a timeout, 125
        when a job will never start."""
        if self.timed_out:
            return TIMED_OUT
        if self.stuck:
            return NEVER_STARTS
        for row in self.rows:
            code = job_exit_code(row)
            if code:
                return code
        return 0

    def __str__(self) -> str:
        notes = [*self.notes]
        if self.timed_out:
            going = [f"{r.job_id} {r.state}" for r in self.rows if not ended(r)]
            return "\n".join([*notes, f"timed out; still going: {', '.join(going)}"])
        return "\n".join(notes + [_line(r) for r in self.rows])


def _line(row: JobStatus) -> str:
    """``123 COMPLETED (exit 0)``, ``123 FAILED (exit 3)``, ``123 CANCELLED`` (a cancelled
    job's code 0 is not its program's), or why a job will never start."""
    if never_starts(row):
        return f"{row.job_id} PENDING ({row.reason}): {row.explanation}"
    shown = row.exit_code is not None and (row.exit_code != 0 or row.state == "COMPLETED")
    # a job that stopped itself past its requeue limit says so, not a bare exit 79
    past_limit = f": {row.explanation}" if row.requeue_limit is not None else ""
    return (
        f"{row.job_id} {row.state}"
        + (f" (exit {row.exit_code})" if shown else "")
        + (f": {row.tasks_summary}" if row.tasks_summary else "")
        + past_limit
        + (f": hardware: {row.hardware} during the job" if row.hardware else "")
    )


def ended(row: JobStatus) -> bool:
    return parse.is_final(row.state) or row.state == "UNKNOWN"


def never_starts(row: JobStatus) -> bool:
    """A pending job that waits for what cannot happen (Slurm keeps such a job until it is
    cancelled, unless the site sets ``kill_invalid_depend``)."""
    return row.state == "PENDING" and row.reason in NEVER_START_REASONS


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
    ending: Callable[[Sequence[str], float], Collection[str]] | None = None,
    follow: Callable[[JobStatus], tuple[str | None, str | None]] | None = None,
) -> WaitResult:
    """Poll ``status(jobs)`` every ``interval`` seconds until every job has ended (an array:
    every task) or will never start, or ``timeout`` seconds have passed.

    ``ending(ids, within)``: which of ``ids`` (jobs not ended yet) announced their end by a
    marker of their own (a function job's result file), waiting up to ``within`` seconds
    for one instead of sleeping. Slurm is then asked about them soon, past the status cache
    (its answer predates the marker), instead of after ``interval``.

    ``follow(row)``, once for each job that ended: (the id of a job submitted in its place,
    then waited for instead, or None; a line to say, or None): ``--retry-bad-node``."""
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

    shared = cache or cache_for(client)
    announced: dict[str, float] = {}  # job id -> when its marker was first seen
    fresh = False
    asked_ids = list(jobs)
    followed: set[str] = set()
    notes: list[str] = []
    while True:
        asked = StatusCache(shared.path, ttl=0) if fresh else shared
        rows = status(asked_ids, client=client, registry=registry, cache=asked)
        now = clock()
        if follow is not None:
            instead: dict[str, str] = {}
            for row in rows:
                if settled(row, now) and row.job_id not in followed:
                    followed.add(row.job_id)
                    new_id, note = follow(row)
                    notes += [note] if note else []
                    if new_id is not None:
                        instead[row.job_id] = new_id
            if instead:  # the new jobs are waited for in their place, from now
                asked_ids = [instead.get(r.job_id, r.job_id) for r in rows]
                fresh = False
                continue
        if all([settled(r, now) or never_starts(r) for r in rows]):
            return WaitResult(rows, timed_out=False, notes=tuple(notes))
        if deadline is not None and clock() >= deadline:
            return WaitResult(rows, timed_out=True, notes=tuple(notes))
        pause = interval if deadline is None else max(0.0, min(interval, deadline - clock()))
        unsettled = [r for r in rows if not settled(r, now) and not never_starts(r)]
        if ending is not None:  # shown ended, its exit code not yet: asked again soon too
            for row in unsettled:
                if ended(row):
                    announced.setdefault(row.job_id, now)
        going = [r.job_id for r in unsettled]
        since = [announced[i] for i in going if i in announced]
        if since:  # ending: asked again after as long as it has been ending (at least 0.25 s)
            sleep(min(pause, max(ENDING_FIRST, now - min(since))))
            fresh = True
        elif ending is not None and going:
            seen = ending(going, pause)
            for job_id in seen:
                announced.setdefault(job_id, clock())
            fresh = bool(seen)
        else:
            sleep(pause)
            fresh = False
