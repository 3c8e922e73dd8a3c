"""The state of the jobs clusterjob submitted, cheaply.

Slurm load is the constraint here: status asks ``squeue`` once for every tracked active job,
``sacct`` once for those squeue no longer knows, and shares the answers between invocations
for a few seconds (a file in the data dir), so a ``watch clusterjob status`` or a script
polling in a loop costs the controller at most two calls per cache period.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from clusterjob import envvars
from clusterjob.errors import UsageError
from clusterjob.jobs.explain import explain, is_pending_reason
from clusterjob.jobs.hardware import with_hardware
from clusterjob.jobs.private_files import data_dir
from clusterjob.jobs.registry import JobRecord, Registry, StateUpdate
from clusterjob.jobs.usage import GpuUsage, with_usage
from clusterjob.jobscript.requeues import LIMIT_EXIT, limit_text, stopped_at_limit
from clusterjob.slurm import parse
from clusterjob.slurm.commands import COMMENT_PREFIX, SUBMIT_WINDOW, SlurmClient
from clusterjob.slurm.parse import is_final
from clusterjob.slurm.ssh import file_key
from clusterjob.slurm.syntax import array_task_ids, split_array_id

CACHE_FILE = "status-cache.json"
DEFAULT_CACHE_SECONDS = 10.0
RECENT_SECONDS = 24 * 3600  # `status` without --all: active jobs and those of the last day

_Row = TypeVar("_Row", parse.QueuedJob, parse.AccountedJob)


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    cluster: str
    name: str
    state: str
    reason: str | None
    explanation: str
    nodes: str | None
    elapsed: str | None
    exit_code: int | None
    submitted: str | None  # ISO time
    site: str
    source: str  # squeue | sacct | registry | none
    gpus: str | None = None  # GPUs as Slurm accounts them: gres/gpu:a100=2
    tasks_summary: str | None = None  # an array: "10 tasks: 8 COMPLETED, 1 FAILED (exit 7), ..."
    tasks: tuple[JobStatus, ...] = ()  # an array's tasks, when asked for (status --tasks)
    params: str | None = None  # a sweep task: the arguments appended for it
    restarts: int | None = None  # how often Slurm requeued it, when known
    # the --max-requeues it stopped itself at (an attempt past it ended at once), else None
    requeue_limit: int | None = None
    # a GPU fault the Epilog found on its node during the job, e.g. "Xid 79 (GPU fell off
    # the bus) on gpu2 0000:3b:00.0 on node gpu2" (clusterjob.jobs.hardware); None: none seen
    hardware: str | None = None
    # how busy each of its GPUs was, as its in-job sampler recorded it (clusterjob.jobs.usage)
    gpu_usage: tuple[GpuUsage, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# --- the status cache -------------------------------------------------------------------------


class StatusCache:
    """Recent squeue/sacct answers shared by clusterjob invocations (a JSON file).

    An answer is reused when it is younger than ``ttl`` seconds and was asked for a superset
    of the job ids wanted now. Raw command output is kept and parsed again on reuse. A ``ttl``
    of 0 turns the cache off: nothing is read or written (the write, a JSON file replaced,
    was half a millisecond of every ``status`` with the cache off).
    """

    def __init__(
        self, path: Path | None = None, ttl: float | None = None, *, host: str = ""
    ) -> None:
        # one file per host (``--host``): the same job id names other jobs on another cluster
        self.path = path or data_dir() / (CACHE_FILE if not host else _host_cache_file(host))
        env_ttl = os.environ.get(envvars.STATUS_CACHE_SECONDS)
        self.ttl = ttl if ttl is not None else _seconds(env_ttl, DEFAULT_CACHE_SECONDS)

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def get(self, kind: str, ids: Sequence[str], now: float) -> dict[str, Any] | None:
        if self.ttl <= 0:
            return None
        entry = self._load().get(kind)
        if not isinstance(entry, dict):
            return None
        fresh = 0 <= now - float(entry.get("at", 0)) < self.ttl
        if fresh and set(ids) <= set(entry.get("ids", ())):
            return entry
        return None

    def put(self, kind: str, ids: Sequence[str], now: float, **payload: object) -> None:
        if self.ttl <= 0:
            return
        data = self._load()
        data[kind] = {"at": now, "ids": sorted(set(ids)), **payload}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.path)
        except OSError:
            pass  # a cache that cannot be written only costs a Slurm call

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def _host_cache_file(host: str) -> str:
    return f"status-cache-{file_key(host)}.json"


def cache_for(client: SlurmClient) -> StatusCache:
    """The status cache of the cluster ``client`` talks to (this machine's, or a host's)."""
    return StatusCache(host=client.runner.transport.label)


def _seconds(text: str | None, default: float) -> float:
    """CLUSTERJOB_STATUS_CACHE_SECONDS as a number (0 turns the cache off)."""
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:
        raise UsageError(
            f"CLUSTERJOB_STATUS_CACHE_SECONDS={text!r}: give a number of seconds (0: no cache)"
        )
    return value


def _asked(job_id: str, ids: Sequence[str]) -> bool:
    """Whether a row answers one of ``ids`` (an array's id is answered by its tasks' rows)."""
    return job_id in ids or split_array_id(job_id)[0] in ids


def _squeue(
    client: SlurmClient, cache: StatusCache, ids: list[str], now: float
) -> list[parse.QueuedJob]:
    if not ids:
        return []
    hit = cache.get("squeue", ids, now)
    if hit is not None:
        return [j for j in parse.parse_squeue(hit["stdout"]) if _asked(j.job_id, ids)]
    out = client.squeue_output(ids)
    cache.put("squeue", ids, now, stdout=out)
    return parse.parse_squeue(out)


def _sacct(
    client: SlurmClient, cache: StatusCache, ids: list[str], now: float
) -> list[parse.AccountedJob] | None:
    if not ids:
        return []
    hit = cache.get("sacct", ids, now)
    if hit is not None:
        if hit.get("disabled"):
            return None
        return [j for j in parse.parse_sacct(hit["stdout"]) if _asked(j.job_id, ids)]
    out = client.sacct_output(ids)
    if out is None:
        cache.put("sacct", ids, now, disabled=True)
        return None
    cache.put("sacct", ids, now, stdout=out)
    return parse.parse_sacct(out)


# --- status -----------------------------------------------------------------------------------


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts).isoformat(timespec="seconds") if ts else None


def _select(
    registry: Registry, jobs: Sequence[str], show_all: bool, now: float
) -> tuple[list[JobRecord], list[str]]:
    """(records to show, ids asked for that clusterjob did not submit)."""
    if jobs:
        records: list[JobRecord] = []
        untracked: list[str] = []
        ids = [registry.resolve_id(spec) for spec in jobs]
        known = registry.get_many(ids)  # one read for all: the API asks about 1,000 at once
        for job_id in ids:
            record = known.get(job_id)
            if record is None:
                untracked.append(job_id)
            else:
                records.append(record)
        return records, untracked
    if show_all:
        return registry.all(), []
    active = registry.with_states(sorted(parse.FINAL_STATES), exclude=True)
    recent = registry.since(now - RECENT_SECONDS)
    seen = {r.token for r in active}
    records = active + [r for r in recent if r.token not in seen]
    return sorted(records, key=lambda r: r.submitted_at), []


def settle_pending(registry: Registry, client: SlurmClient, now: float | None = None) -> None:
    """Submissions recorded before sbatch answered (clusterjob was interrupted or killed
    meanwhile): the job Slurm holds with a record's token completes the record; none, once
    the submission's window has passed, means none was created, and the record goes."""
    from clusterjob.jobs.controlled import split_records

    now = time.time() if now is None else now
    for record in split_records(registry.pending())[0]:  # Slurm's: found by their comment
        found = client.find_jobs_by_comment(record.token)
        if found:  # an array's rows are ID_N / ID_[..]: the job is ID
            job_id = split_array_id(found[0].job_id)[0]
            registry.complete(record.token, job_id, found[0].cluster or "")
        elif now - record.submitted_at > SUBMIT_WINDOW:
            registry.discard(record.token)


def _pick(rows: Iterable[_Row] | None, cluster: str) -> _Row | None:
    """The row of ``cluster`` (any row when the cluster is not known)."""
    for row in rows or ():
        if not cluster or row.cluster == cluster:
            return row
    return None


def status(
    jobs: Sequence[str] = (),
    *,
    show_all: bool = False,
    tasks: bool = False,
    client: SlurmClient | None = None,
    registry: Registry | None = None,
    cache: StatusCache | None = None,
    now: float | None = None,
) -> list[JobStatus]:
    """The state of tracked jobs (or of ``jobs``; ``last``, ``ID_TASK`` allowed), oldest first.

    At most one squeue and one sacct call, whatever the number of jobs or array tasks; none
    when every job's end is already recorded or a recent answer is cached. An array is one
    row whose state sums up its tasks (``tasks``: each task listed under it).
    """
    client = client or SlurmClient()
    registry = registry or Registry(host=client.runner.transport.label)
    cache = cache or cache_for(client)
    now = time.time() if now is None else now
    with registry.held():  # one registry connection for its reads and its one write
        return _status(jobs, show_all, tasks, client, registry, cache, now)


def _status(
    jobs: Sequence[str],
    show_all: bool,
    tasks: bool,
    client: SlurmClient,
    registry: Registry,
    cache: StatusCache,
    now: float,
) -> list[JobStatus]:
    settle_pending(registry, client, now)
    records, untracked, task_of = _select_tasks(registry, jobs, show_all, now)
    records, elsewhere = _by_scheduler(records)
    arrays = {r.token: array_spec(r.script) for r in records}
    answers = _ask_slurm(client, cache, records, untracked, arrays, now)
    results: list[JobStatus] = []
    updates: list[StateUpdate] = []
    for record in records:
        shown, update = _tracked_rows(record, arrays[record.token], answers, client, tasks, task_of)
        results += shown
        if update is not None:
            updates.append(update)
    results += [_untracked_row(job_id, answers, tasks) for job_id in untracked]
    registry.update_states(updates, checked_at=now)
    by_id = {r.job_id: r for r in records}
    results = with_hardware(results, client, cache, now)
    results = with_usage(results, records)
    results += _controlled_rows(elsewhere, registry, now, tasks, task_of)
    return [_past_limit(row, by_id) for row in results]


class _Answers(NamedTuple):
    """What Slurm said: squeue's and sacct's rows by job id (an array task's row under its
    array's id too); ``accounting``: whether sacct answers at all (off at some sites)."""

    queued: dict[str, list[parse.QueuedJob]]
    accounted: dict[str, list[parse.AccountedJob]]
    accounting: bool


def _ask_slurm(
    client: SlurmClient,
    cache: StatusCache,
    records: list[JobRecord],
    untracked: list[str],
    arrays: dict[str, str | None],
    now: float,
) -> _Answers:
    """One squeue about the jobs not known to have ended (and those asked for by id that
    clusterjob did not submit), then one sacct about those squeue cannot answer for."""
    live = [r for r in records if not parse.is_final(r.state)]
    ask = sorted({r.job_id for r in live} | set(untracked))
    queued = _by_job(_squeue(client, cache, ask, now))
    rows = _sacct(client, cache, _to_account(ask, live, arrays, queued), now)
    return _Answers(queued, _by_job(rows or []), rows is not None)


def _by_job(rows: Iterable[_Row]) -> dict[str, list[_Row]]:
    """Rows by job id; an array task's row (``ID_N``) under its array's id too."""
    found: dict[str, list[_Row]] = {}
    for row in rows:
        found.setdefault(row.job_id, []).append(row)
        base, task = split_array_id(row.job_id)
        if task is not None:
            found.setdefault(base, []).append(row)
    return found


def _to_account(
    ask: list[str],
    live: list[JobRecord],
    arrays: dict[str, str | None],
    queued: dict[str, list[parse.QueuedJob]],
) -> list[str]:
    """The jobs to ask sacct about. squeue cannot say how a job ended (its exit code): each
    it does not show, or shows ended; and an array whenever squeue does not show every one of
    its tasks still going."""
    missing = {i for i in ask if i not in queued or any(is_final(q.state) for q in queued[i])}
    for r in live:
        spec = arrays[r.token]
        if spec is not None and r.job_id not in missing:
            going = _task_ids(queued.get(r.job_id, []), final=False)
            if not set(_spec_ids(spec)) <= going:
                missing.add(r.job_id)
    return sorted(missing)


def _tracked_rows(
    record: JobRecord,
    spec: str | None,
    answers: _Answers,
    client: SlurmClient,
    tasks: bool,
    task_of: dict[str, str],
) -> tuple[list[JobStatus], StateUpdate | None]:
    """A tracked job's row (an array's, or the one task of it asked for as ``ID_N``), and
    what to record of what Slurm said (None: nothing)."""
    if spec is not None and not (is_final(record.state) and not record.tasks):
        whole, update = _array_status(
            record,
            spec,
            answers.queued.get(record.job_id, []),
            answers.accounted.get(record.job_id, []),
            with_tasks=tasks or record.token in task_of,
        )
        if record.token in task_of:
            return _only_task(whole, record, task_of[record.token]), update
        return [whole], update
    if is_final(record.state):
        return [_from_record(record)], None
    row, update = _live_row(record, answers, client)
    return [row], update


def _live_row(
    record: JobRecord, answers: _Answers, client: SlurmClient
) -> tuple[JobStatus, StateUpdate | None]:
    """A job not known to have ended, from squeue's row, else sacct's; UNKNOWN, with nothing
    to record, where neither has it or each has another job under its id."""
    queued = answers.queued.get(record.job_id)
    accounted = answers.accounted.get(record.job_id)
    q = _ours(_pick(queued, record.cluster), record)
    a = _ours(_pick(accounted, record.cluster), record)
    if q is None and a is None and (queued or accounted):
        note = (
            f"Slurm's job {record.job_id} is another job now (the cluster was rebuilt and "
            "its job ids started again?); this one's end is unknown"
        )
        return _from_record(record, state="UNKNOWN", note=note), None
    if q is not None and not (is_final(q.state) and a and is_final(a.state)):
        return _from_squeue(record, q, client)
    if a is not None:
        return _from_sacct(record, a, q, client)
    note = (
        "Slurm no longer reports it (it ended over MinJobAge ago?) and accounting is off, so "
        "its end state is unknown"
        if not answers.accounting
        else "neither squeue nor sacct knows this job (submitted on another cluster?)"
    )
    return _from_record(record, state="UNKNOWN", note=note), None


def _from_squeue(
    record: JobRecord, q: parse.QueuedJob, client: SlurmClient
) -> tuple[JobStatus, StateUpdate | None]:
    """The row squeue gives a tracked job, and what to record of it."""
    exit_code = _exit_code(q)
    restarts = _restarts(client, q, record)
    update = None
    if not (is_final(q.state) and exit_code is None):
        # A final state is recorded only with its exit code: the registry never asks Slurm
        # about a finished job again, so the code could never be filled in.
        update = StateUpdate(
            record.token,
            q.cluster,
            q.state,
            q.reason,
            exit_code,
            # squeue names only the nodes still completing while a job is COMPLETING: keep
            # the whole node list recorded before (logs --node reads it once Slurm forgets).
            nodes=None if q.state == "COMPLETING" else q.nodes,
            stdout_path=_expand(q.stdout, q, record) if q.stdout else None,
            stderr_path=_expand(q.stderr, q, record) if q.stderr else None,
            gpus=_gpus_of(q, _requested_nodes(record)),
            elapsed=q.elapsed or None,
            restarts=restarts,
        )
    return _with_restarts(_from_row(q, record, "squeue"), q, restarts), update


def _from_sacct(
    record: JobRecord, a: parse.AccountedJob, q: parse.QueuedJob | None, client: SlurmClient
) -> tuple[JobStatus, StateUpdate]:
    """The row sacct gives a tracked job (squeue has it ended, or not at all), and what to
    record of it."""
    # Right after a multi-node job ends, sacct's record can name only its first node (seen:
    # "gpu1" for gpu[1-2]) while squeue, which still has the job, names all.
    squeue_nodes = q.nodes if q is not None and q.state != "COMPLETING" else None
    # while squeue still has the job, so does scontrol: its last restart count
    restarts = _restarts(client, q, record) if q is not None else None
    update = StateUpdate(
        record.token,
        a.cluster,
        a.state,
        a.reason,
        a.exit_code,
        squeue_nodes or a.nodes,
        gpus=_gpus_of(a),
        elapsed=a.elapsed or None,
        restarts=restarts,
    )
    shown = _from_row(a, record, "sacct")
    return (_with_restarts(shown, q, restarts) if q is not None else shown), update


def _untracked_row(job_id: str, answers: _Answers, tasks: bool) -> JobStatus:
    """A job asked for by id that clusterjob did not submit, as Slurm has it (an array's
    tasks summed up as one row, as a tracked array's are)."""
    queued, accounted = answers.queued, answers.accounted
    array_rows = [r for r in queued.get(job_id, []) if "_" in r.job_id]
    array_sums = [r for r in accounted.get(job_id, []) if "_" in r.job_id]
    if "_" not in job_id and (array_rows or array_sums):
        stranger = JobRecord(job_id, "", "", "", (array_rows or array_sums)[0].name, "",
                             "", "", "", None, 0.0)  # fmt: skip
        whole, _ = _array_status(
            stranger, "", array_rows, array_sums, with_tasks=tasks, identity=False
        )
        return whole
    row: parse.QueuedJob | parse.AccountedJob | None
    row = _pick(queued.get(job_id), "") or _pick(accounted.get(job_id), "")
    if row is None:
        row = _task_row(queued, job_id) or _task_row(accounted, job_id)
    if row is None:
        raise UsageError(f"job {job_id}: Slurm does not know it")
    source = "squeue" if isinstance(row, parse.QueuedJob) else "sacct"
    shown = _from_row(row, None, source)
    return shown if row.job_id == job_id else _replace_id(shown, job_id)


def _by_scheduler(records: list[JobRecord]) -> tuple[list[JobRecord], list[JobRecord]]:
    """(Slurm's records, those followed through their backend's ``JobControl``)."""
    from clusterjob.jobs.controlled import split_records

    return split_records(records)


def _controlled_rows(
    records: list[JobRecord],
    registry: Registry,
    now: float,
    with_tasks: bool,
    task_of: dict[str, str],
) -> list[JobStatus]:
    """The rows of jobs of a scheduler other than Slurm (``clusterjob.jobs.controlled``); an
    array asked for as ``ID_N``: that task's row."""
    if not records:
        return []
    from clusterjob.jobs.controlled import status_rows

    rows = status_rows(records, registry, now, with_tasks=with_tasks or bool(task_of))
    results: list[JobStatus] = []
    for record, row in zip(records, rows, strict=True):
        task = task_of.get(record.token)
        results += [row] if task is None else _only_task(row, record, task)
    return results


def _is_array(record: JobRecord) -> bool:
    """Whether a tracked job is an array: its ``#SBATCH --array`` line, or (a scheduler
    followed through its backend) its recorded request."""
    from clusterjob.jobs.controlled import is_controlled_array

    return array_spec(record.script) is not None or is_controlled_array(record)


def _past_limit(row: JobStatus, records: dict[str, JobRecord]) -> JobStatus:
    """The row (and its tasks') of a job that stopped itself past its requeue limit, said so:
    ``requeued 4 times, limit 3 reached`` instead of a bare FAILED (exit 79)."""
    from dataclasses import replace

    if row.tasks:
        row = replace(row, tasks=tuple(_past_limit(t, records) for t in row.tasks))
    record = records.get(split_array_id(row.job_id)[0])
    if record is None or not is_final(row.state):
        return row
    limit = stopped_at_limit(row.exit_code, record.script)
    if limit is None:
        return row
    return replace(row, requeue_limit=limit, explanation=limit_text(limit, row.restarts))


# --- arrays -----------------------------------------------------------------------------------

# Not anchored with ^ and re.MULTILINE: that form tries every position of a script (~20 us for
# one of 2.5 KB, read for each job a status lists); a match's line start is checked instead.
_ARRAY_LINE = re.compile(r"#SBATCH\s+(?:--array[= ]|-a\s*)\"?([^\s\"]+)")
_RUNNING = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING"})
_FAILED = frozenset(
    {"FAILED", "OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
)
_ORDER = ("COMPLETED", "FAILED", "OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL", "CANCELLED", "RUNNING")


def array_spec(script: str) -> str | None:
    """The ``--array`` value of a recorded job script; None for a plain job."""
    for m in _ARRAY_LINE.finditer(script):
        if m.start() == 0 or script[m.start() - 1] == "\n":
            return m.group(1)
    return None


def _spec_ids(spec: str) -> list[int]:
    try:
        return array_task_ids(spec)
    except ValueError:
        return []


def _expand_task(task: str) -> list[int]:
    """``3`` -> [3]; ``[4-9%2]`` (tasks not started, as squeue/sacct print them) -> 4..9."""
    return [int(task)] if task.isdigit() else _spec_ids(task)


def _task_ids(rows: Iterable[parse.QueuedJob | parse.AccountedJob], *, final: bool) -> set[int]:
    ids: set[int] = set()
    for row in rows:
        _, task = split_array_id(row.job_id)
        if task is not None and (final or not parse.is_final(row.state)):
            ids.update(_expand_task(task))
    return ids


def _task_row(
    rows: dict[str, list[_Row]], job_id: str
) -> _Row | None:  # fmt: skip
    """The row that holds task ``ID_N`` (its own, or its pending range ``ID_[..]``)."""
    base, task = split_array_id(job_id)
    if task is None or not task.isdigit():
        return None
    for row in rows.get(base, []):
        _, held = split_array_id(row.job_id)
        if held is not None and int(task) in _expand_task(held):
            return row
    return None


def _replace_id(row: JobStatus, job_id: str) -> JobStatus:
    from dataclasses import replace

    return replace(row, job_id=job_id, explanation=explain(row.state, row.reason, job_id))


@dataclass(frozen=True)
class _Task:
    task: int
    state: str
    reason: str | None
    exit_code: int | None
    nodes: str | None
    elapsed: str | None
    gpus: str | None
    source: str


def _tasks_from_rows(
    expected: list[int], queued: list[parse.QueuedJob], accounted: list[parse.AccountedJob]
) -> dict[int, _Task]:
    """Each task's state: squeue while it is going, sacct once it ended (with its exit code);
    a task squeue shows ended but sacct has not recorded yet has no exit code."""
    tasks: dict[int, _Task] = {}
    for source, rows in (("sacct", accounted), ("squeue", queued)):
        for row in rows:
            _, held = split_array_id(row.job_id)
            if held is None:
                continue
            code = row.exit_code if isinstance(row, parse.AccountedJob) else None
            for n in _expand_task(held):
                known = tasks.get(n)
                ended = known is not None and known.source == "sacct" and is_final(known.state)
                if ended and (is_final(row.state) or row.state == "PENDING"):
                    continue  # sacct has the end (and the code); squeue's is a late echo
                final = parse.is_final(row.state)
                tasks[n] = _Task(
                    task=n,
                    state=row.state,
                    # a finished task keeps the pending reason it once had (sacct): drop it
                    reason=None
                    if final and row.state == "COMPLETED"
                    else _reason(row.state, row.reason),
                    exit_code=code if final else None,
                    nodes=row.nodes,
                    elapsed=row.elapsed or None,
                    gpus=_gpus_of(row),
                    source=source,
                )
    for n in expected:
        tasks.setdefault(n, _Task(n, "UNKNOWN", None, None, None, None, None, "none"))
    return dict(sorted(tasks.items()))


def _summary(tasks: Sequence[_Task]) -> tuple[str, str, int | None, str | None]:
    """(state, ``10 tasks: 8 COMPLETED, 1 FAILED (exit 7), 1 RUNNING``, exit code, reason)."""
    counts: dict[str, list[_Task]] = {}
    for t in tasks:
        counts.setdefault(t.state, []).append(t)
    states = set(counts)
    pending = [
        t
        for t in tasks
        if not parse.is_final(t.state) and t.state not in _RUNNING and t.state != "UNKNOWN"
    ]
    if states & _RUNNING:
        state = "RUNNING"
    elif pending:
        state = "PENDING"
    elif "UNKNOWN" in states:
        state = "UNKNOWN"  # tasks neither squeue nor sacct knows (accounting off?): lost
    elif states <= {"COMPLETED"}:
        state = "COMPLETED"
    elif states & _FAILED:
        state = "FAILED"
    else:
        state = "CANCELLED"
    parts = []
    for name in sorted(counts, key=lambda s: (_ORDER.index(s) if s in _ORDER else len(_ORDER), s)):
        codes = sorted({t.exit_code for t in counts[name] if t.exit_code})
        exits = f" (exit {','.join(map(str, codes))})" if codes else ""
        parts.append(f"{len(counts[name])} {name}{exits}")
    summary = f"{len(tasks)} task{'s' if len(tasks) != 1 else ''}: " + ", ".join(parts)
    failed = [t.exit_code for t in tasks if t.state in _FAILED and t.exit_code]
    code: int | None = None
    if not pending and not states & _RUNNING:
        code = failed[0] if failed else (0 if state == "COMPLETED" else None)
        if code is None and all(t.exit_code is not None for t in tasks):
            code = next((t.exit_code for t in tasks if t.exit_code), 0)
    reason = next((t.reason for t in pending if t.reason), None) if state == "PENDING" else None
    return state, summary, code, reason


def _params(record: JobRecord) -> list[str]:
    """A sweep's per-task arguments (task i: item i), from the recorded request."""
    if not record.request:
        return []
    try:
        task_args = json.loads(record.request).get("task_args") or []
    except (ValueError, AttributeError):
        return []
    return [shlex.join(str(a) for a in args) for args in task_args]


def _array_status(
    record: JobRecord,
    spec: str,
    queued: list[parse.QueuedJob],
    accounted: list[parse.AccountedJob],
    *,
    with_tasks: bool,
    identity: bool = True,
) -> tuple[JobStatus, StateUpdate | None]:
    """An array as one row: its state sums up its tasks (FAILED if any failed, RUNNING while
    any runs); each task keeps its own state, reason and exit code. ``identity``: keep only
    rows of this submission (its token, its submit time)."""
    queued = [
        q
        for q in queued
        if (not record.cluster or q.cluster == record.cluster)
        and (not identity or _ours(q, record))
    ]
    accounted = [
        a
        for a in accounted
        if (not record.cluster or a.cluster == record.cluster)
        and (not identity or _ours(a, record))
    ]
    update = None
    if parse.is_final(record.state) and record.tasks:
        tasks = [_Task(**t) for t in json.loads(record.tasks)]
        source = "registry"
    else:
        tasks = list(_tasks_from_rows(_spec_ids(spec), queued, accounted).values())
        source = "squeue" if queued else "sacct" if accounted else "none"
    state, summary, code, reason = _summary(tasks)
    ended = parse.is_final(state) and all(t.exit_code is not None for t in tasks)
    if source != "registry" and (queued or accounted):
        cluster = (queued or accounted)[0].cluster
        stored = json.dumps([asdict(t) for t in tasks]) if ended else None
        update = StateUpdate(
            record.token,
            cluster,
            state if ended or not parse.is_final(state) else "RUNNING",
            reason,
            code if ended else None,
            _nodes(tasks),
            tasks=stored,
        )
    params = _params(record)
    rows: tuple[JobStatus, ...] = ()
    if with_tasks:
        rows = tuple(
            JobStatus(
                job_id=f"{record.job_id}_{t.task}",
                cluster=record.cluster,
                name=record.job_name,
                state=t.state,
                reason=t.reason,
                explanation=explain(t.state, t.reason, f"{record.job_id}_{t.task}", record.host),
                nodes=t.nodes,
                elapsed=t.elapsed,
                exit_code=t.exit_code,
                submitted=_iso(record.submitted_at),
                site=record.site,
                source=t.source,
                gpus=t.gpus,
                params=params[t.task] if 0 <= t.task < len(params) else None,
            )
            for t in tasks
        )
    note = explain(state, reason, record.job_id, record.host) if state == "PENDING" else ""
    row = JobStatus(
        job_id=record.job_id,
        cluster=record.cluster,
        name=record.job_name,
        state=state,
        reason=reason,
        explanation=summary + (f"; {note}" if note else ""),
        nodes=_nodes(tasks),
        elapsed=None,
        exit_code=code if ended else None,
        submitted=_iso(record.submitted_at),
        site=record.site,
        source=source,
        gpus=next((t.gpus for t in tasks if t.gpus), None),
        tasks_summary=summary,
        tasks=rows,
    )
    return row, update


def _nodes(tasks: Sequence[_Task]) -> str | None:
    names = sorted({n for t in tasks if t.nodes for n in _hosts(t.nodes)})
    if not names:
        return None
    import hostlist

    return str(hostlist.collect_hostlist(names))


def _hosts(nodes: str) -> list[str]:
    import hostlist

    try:
        return list(hostlist.expand_hostlist(nodes))
    except hostlist.BadHostlist:
        return [nodes]


def _only_task(row: JobStatus, record: JobRecord, task: str) -> list[JobStatus]:
    wanted = f"{record.job_id}_{task}"
    found = [t for t in row.tasks if t.job_id == wanted]
    if not found:
        raise UsageError(
            f"job {record.job_id} has no task {task} ({row.tasks_summary or 'no tasks known'})"
        )
    return found


def _select_tasks(
    registry: Registry, jobs: Sequence[str], show_all: bool, now: float
) -> tuple[list[JobRecord], list[str], dict[str, str]]:
    """``_select``, with ``ID_N`` of a tracked array read as that array's task N."""
    task_of: dict[str, str] = {}
    plain: list[str] = []
    extra: list[JobRecord] = []
    resolved = [(spec, split_array_id(registry.resolve_id(spec))) for spec in jobs]
    arrays = registry.get_many([base for _, (base, task) in resolved if task is not None])
    for spec, (base, task) in resolved:
        record = arrays.get(base) if task is not None else None
        if record is not None and task is not None and _is_array(record):
            task_of[record.token] = task
            extra.append(record)
        else:
            plain.append(spec)
    if jobs and not plain:
        return extra, [], task_of
    records, untracked = _select(registry, plain, show_all, now)
    return records + extra, untracked, task_of


def _restarts(client: SlurmClient, q: parse.QueuedJob, record: JobRecord) -> int | None:
    """How often Slurm requeued the job, from scontrol: squeue's columns and sacct's fields
    (22.05) have no count. Asked only for a job waiting after a requeue (reason BeginTime:
    Slurm delays its restart) and for one seen ended that was requeued before, for its last
    count; the registry keeps the most seen for every later row. None: not asked, or none."""
    waiting = q.state == "PENDING" and q.reason == "BeginTime" and "--requeue" in record.script
    # one that stopped itself past its requeue limit: its count is the story
    ending = parse.is_final(q.state) and ((record.restarts or 0) > 0 or _exit_code(q) == LIMIT_EXIT)
    if not (waiting or ending):
        return None
    job = client.scontrol_job(q.job_id)
    try:
        restarts = int(job.raw.get("Restarts", "0")) if job is not None else 0
    except ValueError:
        restarts = 0
    return restarts if restarts >= 1 else None


def _with_restarts(row: JobStatus, q: parse.QueuedJob, restarts: int | None) -> JobStatus:
    """The row with the restart count just asked for (over the one recorded); a requeued job
    waiting to begin says so."""
    if restarts is None:
        return row
    from dataclasses import replace

    row = replace(row, restarts=max(restarts, row.restarts or 0))
    if q.state != "PENDING" or q.reason != "BeginTime":
        return row
    when = f", eligible at {q.start:%H:%M}" if q.start else ""
    return replace(row, explanation=f"requeued (restart {row.restarts}){when}")


SAME_JOB_SECONDS = 600.0  # Slurm's SubmitTime and the registry's time of one submission


def _ours(row: _Row | None, record: JobRecord) -> _Row | None:
    """``row`` if it is the job ``record`` submitted, not another that now has its id (a
    rebuilt cluster starts its ids again): squeue shows the submission token; sacct only the
    submit time, which a requeue moves later (Slurm requeues after a node failure even
    without --requeue), so a later one counts as another job only under another name."""
    if row is None:
        return None
    comment = row.comment if isinstance(row, parse.QueuedJob) else None
    if comment and comment.startswith(COMMENT_PREFIX):
        return row if comment == COMMENT_PREFIX + record.token else None
    if row.submit is not None:
        submitted = row.submit.timestamp()
        if submitted < record.submitted_at - SAME_JOB_SECONDS:
            return None
        if submitted > record.submitted_at + SAME_JOB_SECONDS and row.name != record.job_name:
            return None
    return row


def _gpus_of(row: parse.QueuedJob | parse.AccountedJob, nodes: int | None = None) -> str | None:
    """The job's GPUs spelled one way whatever the source and the state: as sacct's AllocTRES
    (``gres/gpu:a100=2,gres/gpu=2``), the whole job's. squeue has what the job asked for: per
    job, else per node times its nodes (``nodes``, the nodes asked for, while none are given
    yet); per task only with the unit said (squeue's columns have no task count)."""
    if isinstance(row, parse.AccountedJob):
        return parse.gpu_tres(row.alloc_tres)
    per_node = (row.tres_per_node, _node_count(row, nodes))
    whole = parse.alloc_tres_spelling(parse.requested_gpu_counts(row.tres_per_job, per_node))
    if whole:
        return whole
    per_task = parse.alloc_tres_spelling(parse.tres_gpu_counts(row.tres_per_task))
    return f"{per_task} per task" if per_task else None


def _requested_nodes(record: JobRecord | None) -> int | None:
    """The nodes a job asked for (its recorded request), for a job not placed yet."""
    if record is None or not record.request:
        return None
    try:
        nodes = json.loads(record.request).get("nodes")
    except (ValueError, AttributeError):
        return None
    return nodes if isinstance(nodes, int) and nodes > 0 else None


def _node_count(row: parse.QueuedJob, asked: int | None = None) -> int:
    if not row.nodes:
        return asked or 1
    import hostlist  # only for a job squeue shows ended

    try:
        return len(hostlist.expand_hostlist(row.nodes))
    except hostlist.BadHostlist:
        return 1


def _exit_code(row: parse.QueuedJob | parse.AccountedJob) -> int | None:
    """An ended job's exit code; squeue has it (its ``exit_code`` column) in the same call
    as the state, before slurmdbd has recorded the end for sacct. None while it runs."""
    if isinstance(row, parse.AccountedJob):
        return row.exit_code
    return row.exit_code if parse.is_final(row.state) else None


def _from_row(
    row: parse.QueuedJob | parse.AccountedJob,
    record: JobRecord | None,
    source: str,
) -> JobStatus:
    return JobStatus(
        job_id=row.job_id,
        cluster=row.cluster,
        # the name it was submitted with: sacct says "allocation" until slurmdbd has the
        # job's start (seen on 22.05 for a second or so after a cancel)
        name=record.job_name if record and record.job_name else row.name,
        state=row.state,
        reason=_reason(row.state, row.reason),
        explanation=explain(row.state, row.reason, row.job_id, record.host if record else ""),
        nodes=row.nodes,
        elapsed=row.elapsed,
        exit_code=_exit_code(row),
        submitted=_iso(record.submitted_at) if record else None,
        site=record.site if record else "",
        source=source,
        gpus=_gpus_of(row, _requested_nodes(record)),
        restarts=record.restarts if record else None,
    )


def _reason(state: str, reason: str | None) -> str | None:
    """An ended job keeps no pending reason (sacct shows ``Dependency`` on a job that ran)."""
    return None if is_final(state) and is_pending_reason(reason) else reason


def _from_record(record: JobRecord, *, state: str | None = None, note: str = "") -> JobStatus:
    return JobStatus(
        job_id=record.job_id,
        cluster=record.cluster,
        name=record.job_name,
        state=state or record.state,
        reason=_reason(record.state, record.reason),
        explanation=note or explain(record.state, record.reason, record.job_id, record.host),
        nodes=record.nodes,
        elapsed=record.elapsed,
        exit_code=record.exit_code,
        submitted=_iso(record.submitted_at),
        site=record.site,
        source="registry" if state is None else "none",
        gpus=record.gpus,
        restarts=record.restarts,
    )


def _expand(pattern: str, q: parse.QueuedJob, record: JobRecord) -> str:
    first = q.nodes.split(",")[0] if q.nodes and "[" not in q.nodes else None
    if q.nodes and "[" in q.nodes:
        import hostlist

        first = hostlist.expand_hostlist(q.nodes)[0]
    path = parse.expand_output_pattern(
        pattern, job_id=q.job_id, name=q.name, user=q.user, first_node=first
    )
    return path if os.path.isabs(path) else os.path.join(q.work_dir or record.work_dir, path)


# --- filters (status --state/--name/--since) ---------------------------------------------------

_AGO = re.compile(r"\A([0-9]+)([smhdw])\Z")
_AGO_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True)
class StatusFilter:
    """Which of the rows to show: states, a name glob, a submission time."""

    states: frozenset[str] = frozenset()
    name: str | None = None
    since: float | None = None  # epoch seconds

    @classmethod
    def parse(
        cls,
        *,
        state: str | None = None,
        name: str | None = None,
        since: str | None = None,
        now: float | None = None,
    ) -> StatusFilter:
        states = frozenset(parse.normalise_state(s) for s in (state or "").split(",") if s.strip())
        return cls(states, name or None, _since(since, time.time() if now is None else now))

    def apply(self, rows: Sequence[JobStatus]) -> list[JobStatus]:
        import fnmatch

        kept = []
        for row in rows:
            if self.states and parse.normalise_state(row.state) not in self.states:
                continue
            if self.name is not None and not fnmatch.fnmatchcase(row.name, self.name):
                continue
            if self.since is not None and (
                row.submitted is None
                or datetime.fromisoformat(row.submitted).timestamp() < self.since
            ):
                continue
            kept.append(row)
        return kept


def _since(text: str | None, now: float) -> float | None:
    """``30m``/``2h``/``3d``/``1w`` ago, or an ISO date/time; None when not given."""
    if text is None:
        return None
    m = _AGO.match(text.strip())
    if m:
        return now - int(m.group(1)) * _AGO_SECONDS[m.group(2)]
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise UsageError(
            f"--since {text!r}: give a time ago (30m, 2h, 3d, 1w) or a date (2026-12-01T10:00)"
        ) from None
