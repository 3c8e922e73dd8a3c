"""A Grid Engine job's state in clusterjob's words (the job states its registry, ``status``
and ``wait`` already speak: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED...): the one table
from qstat's state codes and qacct's ``failed``/``exit_status`` to them. Pure.

Grid Engine forgets a job once it ends (``qstat`` no longer lists it) and ``qacct`` has it
only seconds later: between the two the job is in neither, and the caller waits.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterjob.gridengine.parse import (
    DELETING,
    ERROR,
    HELD,
    PENDING,
    RUNNING,
    SUSPENDED,
    AccountedJob,
    QueuedJob,
)

# qstat's word for a job it still lists -> clusterjob's state. A job in error (Eqw) waits for
# an admin's `qmod -cj`: it has not failed yet, it is held.
_LIVE = {
    PENDING: "PENDING",
    HELD: "PENDING",
    ERROR: "PENDING",
    RUNNING: "RUNNING",
    SUSPENDED: "SUSPENDED",
    DELETING: "CANCELLED",
}
# qacct's ``failed``: 0 the job ran (its exit status says how it went); 100 "assumedly after
# job", a qdel or a kill (exit 137); any other code, Grid Engine could not start or finish it
# (26 "opening input/output file", 27 "searching requested shell", ...: sge_status(5)).
FAILED_AFTER_JOB = 100


@dataclass(frozen=True)
class Outcome:
    """What became of a job (or one array task) Grid Engine has accounted for."""

    state: str  # COMPLETED, FAILED or CANCELLED
    exit_code: int
    reason: str  # qacct's words for a non-zero ``failed``; "" when it ran


def live_state(job: QueuedJob) -> str:
    """The state of a job qstat still lists."""
    return _LIVE[job.state]


def outcome(record: AccountedJob) -> Outcome:
    """A finished job's state from its accounting record."""
    if record.failed == 0:
        state = "COMPLETED" if record.exit_status == 0 else "FAILED"
        return Outcome(state, record.exit_status, "")
    reason = f"failed {record.failed}" + (
        f": {record.failed_reason}" if record.failed_reason else ""
    )
    if record.failed == FAILED_AFTER_JOB:
        return Outcome("CANCELLED", record.exit_status, reason)
    return Outcome("FAILED", record.exit_status, reason)


# Several array tasks as one job: the first state any task is in, in this order.
_LIVE_ORDER = ("RUNNING", "SUSPENDED", "PENDING", "CANCELLED")
_ENDED_ORDER = ("CANCELLED", "FAILED", "COMPLETED")


def job_state(queued: list[QueuedJob], accounted: list[AccountedJob]) -> Outcome | str | None:
    """One job's state from what qstat lists of it (its tasks) and its qacct records: a
    state word while qstat lists any of it; once it lists none, the ``Outcome`` of its
    records (a cancelled task over a failed one over the completed); None when it is in
    neither (just ended and qacct has not written it yet, or an unknown id)."""
    if queued:
        live = {live_state(j) for j in queued}
        return next(s for s in _LIVE_ORDER if s in live)
    outcomes = [outcome(r) for r in accounted]
    for state in _ENDED_ORDER:
        found = next((o for o in outcomes if o.state == state), None)
        if found is not None:
            return found
    return None
