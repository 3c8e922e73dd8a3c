"""When the API looks for a job's end: the job's own marker often, Slurm seldom.

A function job announces its own end: its worker writes ``result-I.pkl`` into the job's
directory (renamed into place whole) just before it exits. Looking for that file is a
directory listing on the shared file system, or one ssh round trip for every job of a
cluster at once, so it is done often and the result is back within a second or two of the
function's return. Slurm is asked too, but only to notice a job that died without writing
anything (cancelled, a node failure, preempted, killed at its time limit), and less and less
often as the job gets older. A command job has no marker: Slurm is its only word, every
``poll_interval`` seconds as before. A shared file system may show a new file late (NFS
caches a directory's attributes for some seconds): the file is then seen at a later look,
or read when Slurm says the job ended, as before.

The schedules are pure functions of a job's age (seconds since it was submitted or found
again); ``tests/test_api_polling.py`` pins them.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Collection, Mapping

from clusterjob.slurm.runner import LocalTransport, SshTransport

# The marker, here: a directory listing every MARKER_FIRST seconds at first, the interval
# growing with the job's age (MARKER_GROWTH of it) up to MARKER_LONGEST.
MARKER_FIRST = 0.2
MARKER_GROWTH = 0.02
MARKER_LONGEST = 1.0
# ... and never so often that the looks take more than MARKER_CPU_SHARE of a core: a look
# at a thousand job directories takes ~10 ms of CPU, every 0.2 s that was 5% of a core.
MARKER_CPU_SHARE = 0.02
# Over ssh, one round trip for all the jobs, which waits on the login node (looking every
# REMOTE_STEP seconds) until a marker shows or REMOTE_HOLD seconds have passed: a result is
# seen within about REMOTE_STEP plus the round trip, at one round trip per REMOTE_HOLD while
# nothing ends (Slurm was asked twice per poll_interval before).
REMOTE_STEP = 0.5
REMOTE_HOLD = 10.0
# Slurm, about a job with a marker: every poll_interval at first, then SLURM_GROWTH of its
# age, at most SLURM_LONGEST times poll_interval (60 s by default).
SLURM_GROWTH = 0.1
SLURM_LONGEST = 6.0

RESULT_FILE = "result-{task}.pkl"


def marker_interval(age: float, look_cpu: float = 0.0) -> float:
    """Seconds until the markers are looked for again (here), ``age`` seconds after the
    youngest function job waited for was submitted: 0.2 s, backing off to 1 s; at least
    ``look_cpu`` (the CPU seconds the last look took) / MARKER_CPU_SHARE, so many jobs'
    directories are looked at less often rather than at a growing share of a core."""
    return max(
        min(MARKER_LONGEST, max(MARKER_FIRST, age * MARKER_GROWTH)), look_cpu / MARKER_CPU_SHARE
    )


def slurm_interval(age: float, poll_interval: float, *, marker: bool) -> float:
    """Seconds until Slurm is asked again about a job ``age`` seconds old. A command job
    (``marker=False``): ``poll_interval``, Slurm being the only word on its end. A function
    job: ``poll_interval`` while young, then a tenth of its age, at most 6 x ``poll_interval``
    (its marker says when it ended; Slurm only says that it died without one)."""
    if not marker:
        return poll_interval
    return min(poll_interval * SLURM_LONGEST, max(poll_interval, age * SLURM_GROWTH))


def first_slurm_look(*, marker: bool, found_again: bool, poll_interval: float) -> float:
    """Seconds after a ``Job`` is made until Slurm is first asked about it: at once for a
    command job (as before) and for a job found again by its id (it may have ended long
    ago, without a result); one ``poll_interval`` for a function job just submitted (it is
    pending: only its marker can say more in the meantime)."""
    return 0.0 if found_again or not marker else poll_interval


def result_name(task: int) -> str:
    return RESULT_FILE.format(task=task)


# For each directory then its tasks ("0 1 2"; a directory is the word starting with /), the
# "DIR TASK" lines of the tasks whose result file is there; with none, it looks again every
# $2 seconds, $1 times at most. `sleep` of a fraction is GNU's and busybox's; else 1 s.
_MARKERS = (
    "n=$1; step=$2; shift 2; while :; do hit=; for a do case $a in /*) d=$a ;; *) "
    'for t in $a; do if [ -e "$d/result-$t.pkl" ]; then echo "$d $t"; hit=1; fi; done ;; '
    'esac; done; if [ -n "$hit" ] || [ "$n" -le 0 ]; then exit 0; fi; n=$((n - 1)); '
    'sleep "$step" 2>/dev/null || sleep 1; done'
)


def finished_tasks(
    transport: LocalTransport,
    wanted: Mapping[str, Collection[int]],
    *,
    within: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> set[tuple[str, int]]:
    """The ``(job directory, task)`` pairs of ``wanted`` whose result file is there. With
    ``within``, wait up to that many seconds for one to appear (returning as soon as one
    does): here by looking every ``MARKER_FIRST`` seconds, over ssh in ONE round trip that
    waits on the login node. Only a hint: the file is read, and checked, by the caller."""
    asked = {d: sorted(tasks) for d, tasks in wanted.items() if tasks}
    if not asked:
        return set()
    if isinstance(transport, SshTransport):
        return _remote_finished(transport, asked, within)
    deadline = time.monotonic() + within
    while True:
        found = _local_finished(asked)
        if found or time.monotonic() >= deadline:
            return found
        sleep(min(MARKER_FIRST, max(0.0, deadline - time.monotonic())))


def _local_finished(wanted: Mapping[str, list[int]]) -> set[tuple[str, int]]:
    found: set[tuple[str, int]] = set()
    for directory, tasks in wanted.items():
        try:  # one listing per job directory: a map's thousand tasks are one call
            names = set(os.listdir(directory))
        except OSError:
            continue
        found |= {(directory, t) for t in tasks if result_name(t) in names}
    return found


def _remote_finished(
    transport: SshTransport, wanted: Mapping[str, list[int]], within: float
) -> set[tuple[str, int]]:
    from clusterjob.api.remote import remote_sh

    looks = max(0, math.ceil(within / REMOTE_STEP))
    words: list[str] = []
    for directory, tasks in wanted.items():
        if directory.startswith("/"):  # always: the remote dir is made absolute first
            words += [directory, " ".join(str(t) for t in tasks)]
    if not words:
        return set()
    out = remote_sh(transport, _MARKERS, str(looks), str(REMOTE_STEP), *words, timeout=within + 60)
    found: set[tuple[str, int]] = set()
    for line in out.splitlines():
        directory, _, task = line.rpartition(" ")
        if directory in wanted and task.isdigit() and int(task) in wanted[directory]:
            found.add((directory, int(task)))
    return found
