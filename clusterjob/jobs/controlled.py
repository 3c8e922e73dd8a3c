"""The jobs of a scheduler followed through its backend's ``JobControl`` (Grid Engine):
submitting, status rows, cancelling and the output file, each one step the Slurm path of
``submit``, ``status``, ``cancel`` and ``logs`` hands such jobs to.

Which scheduler a job belongs to is its registry record's ``scheduler``; the backend of that
name says whether it has a ``JobControl`` (Slurm's has none: its path is the jobs layer's own).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from clusterjob.errors import GridEngineError, GridEngineTransientError, UsageError
from clusterjob.jobs.registry import JobRecord, Registry, StateUpdate
from clusterjob.jobscript.backends import backend_for, backend_named
from clusterjob.jobscript.control import ENDING, JobControl, Submission, TaskState

if TYPE_CHECKING:
    from clusterjob.jobs.status import JobStatus
    from clusterjob.jobs.submit import Submitted
    from clusterjob.jobscript.render import RenderedJob
    from clusterjob.jobscript.request import ResolvedJob
    from clusterjob.site.model import Site

FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED"})


def control_of(record: JobRecord) -> JobControl | None:
    """The ``JobControl`` that follows ``record``'s job; None: a Slurm job."""
    return backend_named(record.scheduler).control()


def split_records(records: Sequence[JobRecord]) -> tuple[list[JobRecord], list[JobRecord]]:
    """(Slurm's records, those followed through a ``JobControl``), each in the given order."""
    slurm: list[JobRecord] = []
    controlled: list[JobRecord] = []
    followed: dict[str | None, bool] = {}  # asked once per scheduler, not once per record
    for record in records:
        if record.scheduler not in followed:
            followed[record.scheduler] = backend_named(record.scheduler).control() is not None
        (controlled if followed[record.scheduler] else slurm).append(record)
    return slurm, controlled


# --- submit -----------------------------------------------------------------------------------


def submit(
    site: Site,
    resolved: ResolvedJob,
    rendered: RenderedJob,
    control: JobControl,
    *,
    registry: Registry | None,
    workdir: str | Path | None,
    command_line: Sequence[str] | None,
    resubmit_of: str | None,
    source_dir: str | Path | None,
) -> Submitted:
    """Write the script, record the submission, submit it once: ``jobs.submit.submit`` for a
    scheduler with a ``JobControl``."""
    from clusterjob.jobs.submit import (
        REQUEST_FORMAT,
        Submitted,
        _task_count,
        _write_script,
        send_recorded,
        start_git_commit,
    )

    registry = registry or Registry()
    work = Path(workdir or Path.cwd()).resolve()
    registry.check()
    path = _write_script(rendered.script, rendered.token)
    request = resolved.request
    backend = backend_for(site)
    pending = JobRecord(
        job_id="",
        cluster=site.cluster_name or "",
        site=site.name,
        token=rendered.token,
        job_name=resolved.job_name,
        script=rendered.script,
        script_path=str(path),
        command_line=shlex.join(command_line if command_line is not None else sys.argv),
        work_dir=str(work),
        git_commit=None,  # read by git while the scheduler takes the job: recorded with its id
        submitted_at=time.time(),
        state="PENDING",
        request=json.dumps({**asdict(request), "request_format": REQUEST_FORMAT}),
        resubmit_of=resubmit_of,
        scheduler=backend.name,
    )

    def send() -> Submission:
        try:
            return control.submit(str(path), workdir=str(work))
        except GridEngineError as exc:
            if not isinstance(exc, GridEngineTransientError):  # refused: no job was made
                registry.discard(pending.token)
            raise

    commit = start_git_commit(Path(source_dir).resolve() if source_dir else work)
    record = send_recorded(registry, pending, send, lambda: "", commit)
    command = backend.submit_command(str(path), str(work))
    return Submitted(
        record.job_id,
        record.cluster,
        site.name,
        str(path),
        shlex.join(command),
        _task_count(request.array),
    )


# --- status -----------------------------------------------------------------------------------


def status_rows(
    records: Sequence[JobRecord], registry: Registry, now: float, *, with_tasks: bool
) -> list[JobStatus]:
    """The rows of ``records`` (all followed through the same kind of ``JobControl``): one
    queue listing for the live ones, accounting for those that left it, ``qstat -j`` for
    each pending one's reason; what was learned is recorded."""
    rows: list[JobStatus] = []
    updates: list[StateUpdate] = []
    asked = [r for r in records if _needs_asking(r, with_tasks)]
    control = control_of(asked[0]) if asked else None
    found = control.states([r.job_id for r in asked]) if control is not None else {}
    asked_tokens = {r.token for r in asked}
    for record in records:
        tasks = found.get(record.job_id)
        if record.token not in asked_tokens or (not tasks and record.state in FINAL):
            rows.append(_recorded_row(record))
            continue
        assert control is not None
        row = _row(record, tasks, _is_array(record), control, with_tasks)
        rows.append(row)
        updates.append(_update(record, row, control))
    registry.update_states(updates, checked_at=now)
    return rows


def _needs_asking(record: JobRecord, with_tasks: bool) -> bool:
    if record.state not in FINAL:
        return True
    return with_tasks and _is_array(record)  # its tasks are in accounting


def is_controlled_array(record: JobRecord) -> bool:
    """Whether ``record`` is an array job of a scheduler followed through a ``JobControl``."""
    return control_of(record) is not None and _is_array(record)


def _is_array(record: JobRecord) -> bool:
    """Whether the job is an array (or a sweep), as its recorded request says."""
    try:
        request = json.loads(record.request or "{}")
    except ValueError:
        return False
    return isinstance(request, dict) and request.get("array") is not None


def _row(
    record: JobRecord,
    tasks: tuple[TaskState, ...] | None,
    is_array: bool,
    control: JobControl,
    with_tasks: bool,
) -> JobStatus:
    if not tasks:  # left the queue, not accounted for yet (qacct lags seconds)
        note = "it left the queue; its end is not accounted for yet"
        return _status(record, ENDING, None, note, None, "none")
    if is_array:
        return _array_row(record, tasks, control, with_tasks)
    task = tasks[0]
    return _status(
        record,
        task.state,
        task.exit_code,
        _explanation(record, task.state, task.reason, control),
        task.nodes,
        task.source,
        reason=task.reason,
    )


def _array_row(
    record: JobRecord, tasks: tuple[TaskState, ...], control: JobControl, with_tasks: bool
) -> JobStatus:
    from dataclasses import replace

    from clusterjob.jobs.status import _summary, _Task

    summed = [
        _Task(t.task or 0, t.state, t.reason, t.exit_code, t.nodes, None, None, t.source)
        for t in sorted(tasks, key=lambda t: t.task or 0)
    ]
    state, summary, code, _ = _summary(summed)
    nodes = ",".join(sorted({t.nodes for t in tasks if t.nodes})) or None
    row = _status(
        record,
        state,
        code,
        _explanation(record, state, None, control),
        nodes,
        tasks[0].source,
    )
    shown = tuple(
        _status(
            record,
            t.state,
            t.exit_code,
            t.reason or "",
            t.nodes,
            t.source,
            job_id=f"{record.job_id}_{t.task}",
            reason=t.reason,
        )  # fmt: skip
        for t in sorted(tasks, key=lambda t: t.task or 0)
    )
    return replace(row, tasks_summary=summary, tasks=shown if with_tasks else ())


def _explanation(record: JobRecord, state: str, reason: str | None, control: JobControl) -> str:
    if state == "PENDING":
        return control.why_pending(record.job_id) or "waiting to be scheduled"
    if state == "RUNNING":
        return "running"
    if reason:
        return reason
    return {"COMPLETED": "finished", "FAILED": "failed", "CANCELLED": "cancelled"}.get(state, "")


def _status(
    record: JobRecord,
    state: str,
    exit_code: int | None,
    explanation: str,
    nodes: str | None,
    source: str,
    *,
    job_id: str | None = None,
    reason: str | None = None,
) -> JobStatus:
    from clusterjob.jobs.status import JobStatus

    return JobStatus(
        job_id=job_id or record.job_id,
        cluster=record.cluster,
        name=record.job_name,
        state=state,
        reason=reason,
        explanation=explanation,
        nodes=nodes or record.nodes,
        elapsed=None,
        exit_code=exit_code,
        submitted=datetime.fromtimestamp(record.submitted_at).isoformat(timespec="seconds"),
        site=record.site,
        source=source,
    )


def _recorded_row(record: JobRecord) -> JobStatus:
    note = record.reason or record.state.lower()
    return _status(record, record.state, record.exit_code, note, record.nodes, "registry",
                   reason=record.reason)  # fmt: skip


def _update(record: JobRecord, row: JobStatus, control: JobControl) -> StateUpdate:
    """What the registry keeps of ``row``: a final state only with its exit code, as the
    Slurm path does (a finished job is never asked about again)."""
    state = row.state
    if state == ENDING or (state in FINAL and row.exit_code is None):
        state = record.state
    output = None if row.tasks_summary else _output(record, control)
    return StateUpdate(record.token, record.cluster, state, row.reason, row.exit_code,
                       row.nodes, stdout_path=output, stderr_path=output)  # fmt: skip


def _output(record: JobRecord, control: JobControl) -> str:
    return control.output_path(record.work_dir, record.job_name, record.job_id, None)


def output_path(record: JobRecord, task: str | None, control: JobControl) -> Path:
    """Where the job (or task ``task``, counted from 0) writes its output: ``-j y`` puts its
    stderr there too."""
    if record.script and "\n#$ -o " in record.script:
        raise UsageError(f"job {record.job_id}: its --output is not followed by logs yet")
    index = int(task) if task is not None else None
    return Path(control.output_path(record.work_dir, record.job_name, record.job_id, index))


# --- cancel -----------------------------------------------------------------------------------


def cancel(ids: Sequence[str], registry: Registry) -> tuple[list[str], list[str]]:
    """Cancel the jobs of ``ids`` followed through a ``JobControl``: (the ids left for Slurm,
    those the other scheduler did not know)."""
    left: list[str] = []
    unknown: list[str] = []
    for job_id in ids:
        record = registry.get(job_id.split("_", 1)[0])
        control = control_of(record) if record is not None else None
        if record is None or control is None:
            left.append(job_id)
        else:
            unknown += _cancel_one(record, control, registry)
    return left, unknown


def _cancel_one(record: JobRecord, control: JobControl, registry: Registry) -> list[str]:
    """Cancel one job; one that never started is recorded CANCELLED now, since Grid Engine
    accounts only for jobs that ran (``qacct`` never learns of it)."""
    tasks = control.states([record.job_id]).get(record.job_id, ())
    unknown = control.cancel([record.job_id])
    if not unknown and tasks and all(t.state == "PENDING" for t in tasks):
        update = StateUpdate(record.token, record.cluster, "CANCELLED", NEVER_STARTED, 0)
        registry.update_states([update], checked_at=time.time())
    return unknown


NEVER_STARTED = "cancelled before it started"
