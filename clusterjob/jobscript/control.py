"""Submitting, following and cancelling a scheduler's jobs through one small interface.

``JobControl`` is what the jobs layer asks of a scheduler whose jobs it follows through a
backend (``SchedulerBackend.control``): submit a written script, the state of some jobs in
clusterjob's words (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED), why one waits, cancel,
the free GPUs on each host (``avail``).
Grid Engine implements it here over ``clusterjob.gridengine``; Slurm's jobs still go
through the jobs layer's own ``SlurmClient`` path (its backend has no ``control`` yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from clusterjob.gridengine.commands import GridEngineClient
    from clusterjob.gridengine.parse import AccountedJob, JobDetail, QueuedJob

# A job (or task) that left the queue but whose end the scheduler has not accounted for yet:
# not ended for ``wait`` (Slurm's word for a job on its way out).
ENDING = "COMPLETING"


@dataclass(frozen=True)
class TaskState:
    """One job, or one task of an array, as the scheduler reports it now."""

    task: int | None  # an array task's index, counted from 0 as --array's; None: no array
    state: str
    exit_code: int | None = None
    reason: str | None = None  # why it failed, in the scheduler's words
    nodes: str | None = None
    source: str = ""  # the command that said so: qstat, qacct


@dataclass(frozen=True)
class HostGpus:
    """One execution host's GPUs as the scheduler counts them now."""

    host: str
    gpu_type: str | None  # the scheduler's name for the model (a site model's gres_type)
    free: int  # what the scheduler would still hand out there


@dataclass(frozen=True)
class Submission:
    job_id: str
    cluster: str = ""


class JobControl(Protocol):
    """A scheduler's job commands in clusterjob's words."""

    def submit(self, script_path: str, *, workdir: str) -> Submission:
        """Submit the written script (its directives carry the request) from ``workdir``."""
        ...

    def states(self, job_ids: Sequence[str]) -> dict[str, tuple[TaskState, ...]]:
        """Each job's tasks now (one queue listing for all, accounting for those not in it);
        a job missing from the answer is in neither yet."""
        ...

    def why_pending(self, job_id: str) -> str | None:
        """Why a pending job does not start, in a line; None when the scheduler says nothing."""
        ...

    def cancel(self, job_ids: Sequence[str]) -> list[str]:
        """Cancel the jobs; the ids the scheduler did not know."""
        ...

    def output_path(self, workdir: str, name: str, job_id: str, task: int | None) -> str:
        """Where a job's output goes when its script names no file."""
        ...

    def gpu_hosts(self) -> list[HostGpus]:
        """Every host with GPUs and how many are free now (one scheduler call)."""
        ...


class GridEngineControl:
    """``JobControl`` over ``qsub -wd``, ``qstat -xml`` (one per refresh), ``qacct -j`` (each
    job qstat no longer lists), ``qstat -j`` (scheduling info) and ``qdel``."""

    def __init__(self, client: GridEngineClient | None = None) -> None:
        from clusterjob.gridengine.commands import GridEngineClient

        self.client = client or GridEngineClient()

    def submit(self, script_path: str, *, workdir: str) -> Submission:
        return Submission(self.client.qsub(script_path, options=("-wd", workdir)).job_id)

    def states(self, job_ids: Sequence[str]) -> dict[str, tuple[TaskState, ...]]:
        if not job_ids:
            return {}
        wanted = set(job_ids)
        listed: dict[str, list[TaskState]] = {}
        for job in self.client.qstat():
            if job.job_id in wanted:
                listed.setdefault(job.job_id, []).extend(_queued_tasks(job))
        found = {job_id: tuple(tasks) for job_id, tasks in listed.items()}
        for job_id in sorted(wanted - set(listed)):
            records = self.client.accounting(job_id)
            if records:
                found[job_id] = tuple(_accounted_task(r) for r in records)
        return found

    def why_pending(self, job_id: str) -> str | None:
        detail = self.client.job_detail(job_id)
        return None if detail is None else pending_text(detail)

    def cancel(self, job_ids: Sequence[str]) -> list[str]:
        unknown = [j for j in job_ids if not self.client.qdel([j])]
        return unknown

    def output_path(self, workdir: str, name: str, job_id: str, task: int | None) -> str:
        # qsub -j y -cwd: NAME.oID (an array task: NAME.oID.TASK, Grid Engine's task id)
        suffix = f".{task + 1}" if task is not None else ""
        return f"{workdir.rstrip('/')}/{name}.o{job_id}{suffix}"

    def gpu_hosts(self) -> list[HostGpus]:
        # qhost -F shows a consumable's remaining capacity ("hc:gpu=2.000000" on a 4-GPU
        # host running a 2-GPU job), so the value is what is free, bookings already taken off.
        return [
            HostGpus(h.name, h.gpu_type, h.gpus) for h in self.client.hosts() if h.gpus is not None
        ]


def _queued_tasks(job: QueuedJob) -> list[TaskState]:
    """A qstat line as tasks: a pending range (``1-4:1``) is one task per id."""
    from clusterjob.gridengine.parse import TaskRange
    from clusterjob.gridengine.states import live_state

    state = live_state(job)
    if job.tasks is None:
        return [TaskState(None, state, nodes=job.host, source="qstat")]
    ids = TaskRange.parse(job.tasks).ids
    return [TaskState(i - 1, state, nodes=job.host, source="qstat") for i in ids]


def _accounted_task(record: AccountedJob) -> TaskState:
    from clusterjob.gridengine.states import outcome

    end = outcome(record)
    task = record.task_id - 1 if record.task_id is not None else None
    return TaskState(
        task, end.state, end.exit_code, end.reason or None, record.hostname or None, "qacct"
    )


def pending_text(detail: JobDetail) -> str | None:
    """Why the job waits: the hosts short of a resource it asks for (``host1 offers 0 of
    gpu``), else qstat -j's first scheduling info line."""
    short = detail.shortfalls()
    if short:
        by_resource: dict[str, list[str]] = {}
        for s in short:
            by_resource.setdefault(s.resource, []).append(f"{s.where} has {s.offered:g} free")
        parts = []
        for resource, hosts in by_resource.items():
            asked = detail.resources.get(resource)
            what = "GPUs" if resource == "gpu" else resource
            ask = f" (it asks for {asked})" if asked else ""
            parts.append(f"waiting for {what}{ask}: " + ", ".join(hosts))
        return "; ".join(parts)
    return detail.scheduling_info[0] if detail.scheduling_info else None
