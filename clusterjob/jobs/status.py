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
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from clusterjob.errors import UsageError
from clusterjob.jobs.explain import explain
from clusterjob.jobs.registry import JobRecord, Registry, StateUpdate, data_dir
from clusterjob.slurm import parse
from clusterjob.slurm.commands import SlurmClient

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

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# --- the status cache -------------------------------------------------------------------------


class StatusCache:
    """Recent squeue/sacct answers shared by clusterjob invocations (a JSON file).

    An answer is reused when it is younger than ``ttl`` seconds and was asked for a superset
    of the job ids wanted now. Raw command output is kept and parsed again on reuse.
    """

    def __init__(self, path: Path | None = None, ttl: float | None = None) -> None:
        self.path = path or data_dir() / CACHE_FILE
        env_ttl = os.environ.get("CLUSTERJOB_STATUS_CACHE_SECONDS")
        self.ttl = ttl if ttl is not None else _seconds(env_ttl, DEFAULT_CACHE_SECONDS)

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def get(self, kind: str, ids: Sequence[str], now: float) -> dict[str, Any] | None:
        entry = self._load().get(kind)
        if not isinstance(entry, dict) or self.ttl <= 0:
            return None
        fresh = 0 <= now - float(entry.get("at", 0)) < self.ttl
        if fresh and set(ids) <= set(entry.get("ids", ())):
            return entry
        return None

    def put(self, kind: str, ids: Sequence[str], now: float, **payload: object) -> None:
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


def _squeue(
    client: SlurmClient, cache: StatusCache, ids: list[str], now: float
) -> list[parse.QueuedJob]:
    if not ids:
        return []
    hit = cache.get("squeue", ids, now)
    if hit is not None:
        wanted = set(ids)
        return [j for j in parse.parse_squeue(hit["stdout"]) if j.job_id in wanted]
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
        wanted = set(ids)
        return [j for j in parse.parse_sacct(hit["stdout"]) if j.job_id in wanted]
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
        for spec in jobs:
            job_id = registry.resolve_id(spec)
            record = registry.get(job_id)
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
    client: SlurmClient | None = None,
    registry: Registry | None = None,
    cache: StatusCache | None = None,
    now: float | None = None,
) -> list[JobStatus]:
    """The state of tracked jobs (or of ``jobs``; ``last`` allowed), oldest first.

    At most one squeue and one sacct call, whatever the number of jobs; none when every
    job's end is already recorded or a recent answer is cached.
    """
    client = client or SlurmClient()
    registry = registry or Registry()
    cache = cache or StatusCache()
    now = time.time() if now is None else now
    records, untracked = _select(registry, jobs, show_all, now)
    live = [r for r in records if not parse.is_final(r.state)]
    ask = sorted({r.job_id for r in live} | set(untracked))

    queued: dict[str, list[parse.QueuedJob]] = {}
    for queued_row in _squeue(client, cache, ask, now):
        queued.setdefault(queued_row.job_id, []).append(queued_row)
    # squeue cannot say how a job ended (exit code): ask sacct about ended ones too
    missing = [i for i in ask if i not in queued or any(parse.is_final(q.state) for q in queued[i])]
    accounted: dict[str, list[parse.AccountedJob]] = {}
    accounting = True
    rows = _sacct(client, cache, missing, now)
    if rows is None:
        accounting = False
    else:
        for accounted_row in rows:
            accounted.setdefault(accounted_row.job_id, []).append(accounted_row)

    results: list[JobStatus] = []
    updates: list[StateUpdate] = []
    for record in records:
        if parse.is_final(record.state):
            results.append(_from_record(record))
            continue
        q = _pick(queued.get(record.job_id), record.cluster)
        a = _pick(accounted.get(record.job_id), record.cluster)
        if q is not None and not (parse.is_final(q.state) and a and parse.is_final(a.state)):
            exit_code = _ended_exit_code(client, q) if parse.is_final(q.state) else None
            stdout = _expand(q.stdout, q, record) if q.stdout else None
            stderr = _expand(q.stderr, q, record) if q.stderr else None
            update = StateUpdate(record.token, q.cluster, q.state, q.reason, exit_code, q.nodes)
            if not (parse.is_final(q.state) and exit_code is None):
                # A final state is recorded only with its exit code: the registry never asks
                # Slurm about a finished job again, so the code could never be filled in.
                updates.append(
                    update._replace(
                        stdout_path=stdout,
                        stderr_path=stderr,
                        gpus=_gpus_of(q),
                        elapsed=q.elapsed or None,
                    )
                )
            results.append(_from_row(q, record, "squeue", exit_code=exit_code))
        elif a is not None:
            updates.append(
                StateUpdate(
                    record.token,
                    a.cluster,
                    a.state,
                    a.reason,
                    a.exit_code,
                    a.nodes,
                    gpus=_gpus_of(a),
                    elapsed=a.elapsed or None,
                )  # fmt: skip
            )
            results.append(_from_row(a, record, "sacct"))
        else:
            note = (
                "Slurm no longer reports it (it ended over MinJobAge ago?) and accounting is "
                "off, so its end state is unknown"
                if not accounting
                else "neither squeue nor sacct knows this job (submitted on another cluster?)"
            )
            results.append(_from_record(record, state="UNKNOWN", note=note))
    for job_id in untracked:
        row: parse.QueuedJob | parse.AccountedJob | None
        row = _pick(queued.get(job_id), "") or _pick(accounted.get(job_id), "")
        if row is None:
            raise UsageError(f"job {job_id}: Slurm does not know it")
        code = None
        if isinstance(row, parse.QueuedJob) and parse.is_final(row.state):
            code = _ended_exit_code(client, row)
        results.append(
            _from_row(row, None, "squeue" if job_id in queued else "sacct", exit_code=code)
        )
    registry.update_states(updates, checked_at=now)
    return results


def _gpus_of(row: parse.QueuedJob | parse.AccountedJob) -> str | None:
    """The job's GPUs as Slurm reports them: sacct's AllocTRES, squeue's TRES per node."""
    return parse.gpu_tres(
        row.alloc_tres if isinstance(row, parse.AccountedJob) else row.tres_per_node
    )


def _ended_exit_code(client: SlurmClient, row: parse.QueuedJob) -> int | None:
    """The exit code of a job squeue shows as ended but sacct does not yet (slurmdbd records
    the end a moment later): scontrol's live record has it as ``ExitCode=``."""
    job = client.scontrol_job(row.job_id)
    if job is None or not parse.is_final(job.state):
        return None
    return job.exit_code


def _from_row(
    row: parse.QueuedJob | parse.AccountedJob,
    record: JobRecord | None,
    source: str,
    *,
    exit_code: int | None = None,
) -> JobStatus:
    return JobStatus(
        job_id=row.job_id,
        cluster=row.cluster,
        name=row.name,
        state=row.state,
        reason=row.reason,
        explanation=explain(row.state, row.reason, row.job_id),
        nodes=row.nodes,
        elapsed=row.elapsed,
        exit_code=row.exit_code if isinstance(row, parse.AccountedJob) else exit_code,
        submitted=_iso(record.submitted_at) if record else None,
        site=record.site if record else "",
        source=source,
        gpus=_gpus_of(row),
    )


def _from_record(record: JobRecord, *, state: str | None = None, note: str = "") -> JobStatus:
    return JobStatus(
        job_id=record.job_id,
        cluster=record.cluster,
        name=record.job_name,
        state=state or record.state,
        reason=record.reason,
        explanation=note or explain(record.state, record.reason, record.job_id),
        nodes=record.nodes,
        elapsed=record.elapsed,
        exit_code=record.exit_code,
        submitted=_iso(record.submitted_at),
        site=record.site,
        source="registry" if state is None else "none",
        gpus=record.gpus,
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
