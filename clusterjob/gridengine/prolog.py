"""What a Grid Engine root prolog needs of Grid Engine: the meaning of its exit code, and the
job's GPU request as the scheduler booked it. Pure; no I/O.

The request comes from ``qstat -j $JOB_ID``'s hard resource_list, not from a ``-v`` variable
the job sets: the prolog runs as root and claims GPUs for the job, so it must claim what the
scheduler counted against the host's ``gpu`` consumable, not what the job's owner wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from clusterjob.gridengine.parse import JobDetail

# The complexes a site defines for GPUs (FIELD-NOTES: ``gpu INT <= YES YES 0 0`` and
# ``gpu_type STRING == YES NO NONE 0``); 8.1 has no RSMAP, so they give no device ids.
GPU_COUNT_COMPLEX = "gpu"
GPU_TYPE_COMPLEX = "gpu_type"


class PrologExit(IntEnum):
    """A Grid Engine prolog's exit status, as sge_shepherd reads it. Any other status puts
    the queue instance on that host in error (``qmod -cq`` clears it)."""

    RUN = 0
    REQUEUE = 99  # the job goes back to the pending list
    JOB_ERROR = 100  # the job goes to error state (Eqw) with the prolog's reason; it never runs


@dataclass(frozen=True)
class GpuBooking:
    """The GPUs the scheduler booked for one job on one host: a count and, when the job named
    one, the ``gpu_type`` value."""

    count: int
    gpu_type: str | None


def gpu_booking(
    detail: JobDetail,
    count_complex: str = GPU_COUNT_COMPLEX,
    type_complex: str = GPU_TYPE_COMPLEX,
) -> GpuBooking:
    """The job's GPU request from its hard resource_list (``gpu=2,gpu_type=a100``); a job
    that asks for none books 0. ValueError for a count that is not a whole number >= 0."""
    text = detail.resources.get(count_complex)
    gpu_type = detail.resources.get(type_complex) or None
    if text is None:
        return GpuBooking(0, gpu_type)
    try:
        value = float(text)  # Grid Engine writes consumables as given: 2, or 2.000000
    except ValueError:
        raise ValueError(f"{count_complex}={text!r} is not a GPU count") from None
    if value < 0 or value != int(value):
        raise ValueError(f"{count_complex}={text!r} is not a whole number of GPUs")
    return GpuBooking(int(value), gpu_type)


def job_key(job_id: str, task_id: str | None) -> str:
    """``123`` or ``123.4``: one key per job and array task (``SGE_TASK_ID`` is ``undefined``
    outside arrays)."""
    task = (task_id or "").strip()
    return job_id if task in ("", "undefined") else f"{job_id}.{task}"


# The process that runs a job's prolog, job and epilog on its host: it lives from the first
# to the last, so a claim held while it lives is held for the whole job.
SHEPHERD = "sge_shepherd"
