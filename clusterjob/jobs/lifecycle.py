"""Jobs clusterjob submitted: submit once, see their state cheaply, read logs, cancel, resubmit.

Slurm load is the constraint here: status asks ``squeue`` once for every tracked active job,
``sacct`` once for those squeue no longer knows, and shares the answers between invocations
for a few seconds (a file in the data dir), so a ``watch clusterjob status`` or a script
polling in a loop costs the controller at most two calls per cache period.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from clusterjob.errors import RegistryError, UsageError
from clusterjob.jobs.registry import JobRecord, Registry, StateUpdate, data_dir
from clusterjob.slurm import parse
from clusterjob.slurm.commands import COMMENT_PREFIX, SlurmClient, token_in_script
from clusterjob.slurm.parse import StartEstimate

if TYPE_CHECKING:
    from clusterjob.jobscript.render import RenderedJob
    from clusterjob.jobscript.request import ResolvedJob
    from clusterjob.site.model import Site

CACHE_FILE = "status-cache.json"
DEFAULT_CACHE_SECONDS = 10.0
RECENT_SECONDS = 24 * 3600  # `status` without --all: active jobs and those of the last day


# --- pending reasons and end states, in GPU terms -------------------------------------------

REASONS = {
    "Resources": "waiting for free GPUs of that type (or CPUs/memory on the nodes with them)",
    "Priority": "other jobs are ahead in the queue (priority / fair share); it waits its turn",
    "QOSMaxGRESPerUser": "you already use as many GPUs as your QOS allows; it starts when one "
    "of your jobs ends",
    "QOSMaxGRESPerAccount": "your account already uses as many GPUs as its QOS allows",
    "AssocGrpGRES": "your account's GPU limit is reached; it starts when its jobs end",
    "AssocGrpGRESMinutes": "your account's GPU-hours budget is used up; ask its coordinator",
    "AssocGrpGRESRunMinutes": "your account has too many GPU-minutes running at once",
    "QOSMaxJobsPerUserLimit": "you already run as many jobs as your QOS allows",
    "QOSMaxSubmitJobPerUserLimit": "you already have as many jobs queued as your QOS allows",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved (see `sinfo -R`)",
    # what squeue prints for a job whose only possible nodes are down or drained (seen on 22.05)
    "Nodes required for job are DOWN, DRAINED": "every node that could run it is down or "
    "drained (see `sinfo -R`; the clusterjob Prolog drains nodes whose GPUs are wrong)",
    "NodeDown": "a node it needs is down",
    "Dependency": "waiting for the jobs it depends on",
    "DependencyNeverSatisfied": "a job it depends on failed, so it will never start: cancel it",
    "BeginTime": "waiting for its --begin time",
    "JobHeldUser": "held by you: `scontrol release <id>` to let it start",
    "JobHeldAdmin": "held by an administrator",
    "PartitionTimeLimit": "its --time is over the partition's limit, so it will never start: "
    "cancel it and resubmit with a shorter --time",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows; it will never start",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "BadConstraints": "no node can satisfy this request (GPU type/count, constraint)",
    "Reservation": "waiting for its reservation to start",
    "Prolog": "the nodes are running the Prolog (clusterjob's GPU check)",
    "launch failed requeued held": "the clusterjob Prolog (or another) failed on the node; the "
    "node was drained and your job is held: `scontrol release <id>` once it can run elsewhere "
    "(`sinfo -R` shows the node's reason)",
}

STATE_NOTES = {
    "OUT_OF_MEMORY": "killed for using more host memory than requested (--mem-per-gpu)",
    "TIMEOUT": "reached its time limit",
    "NODE_FAIL": "a node of the job failed; resubmit (`clusterjob resubmit <id>`)",
    "PREEMPTED": "preempted by a higher-priority job",
    "BOOT_FAIL": "a node failed to boot for the job",
    "DEADLINE": "could not finish before its --deadline",
}


def explain(state: str, reason: str | None, job_id: str = "<id>") -> str:
    """One line saying why a job is where it is, in GPU terms; "" when nothing to add."""
    if reason:
        text = REASONS.get(reason)
        if text is None and reason.startswith("launch failed requeued held"):
            text = REASONS["launch failed requeued held"]
        if text is None:
            for key, value in REASONS.items():
                if reason.startswith(key):
                    text = value
                    break
        if text:
            return text.replace("<id>", job_id)
    return STATE_NOTES.get(state, "").replace("<id>", job_id)


# --- results --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submitted:
    job_id: str
    cluster: str
    site: str
    script_path: str

    def __str__(self) -> str:
        on = f" on cluster {self.cluster}" if self.cluster else ""
        return (
            f"Submitted job {self.job_id}{on} (site {self.site}); script kept at "
            f"{self.script_path}\nFollow it with: clusterjob status {self.job_id}; "
            f"clusterjob logs {self.job_id} -f"
        )


@dataclass(frozen=True)
class TestOnlyResult:
    estimate: StartEstimate
    __test__ = False  # not a pytest class

    def __str__(self) -> str:
        e = self.estimate
        when = e.start.strftime("%Y-%m-%d %H:%M:%S") if e.start else "no foreseeable time"
        if e.start is None:
            when += f" (Slurm says {e.start_text}: the request fits, but the nodes are busy)"
        return (
            f"Slurm accepts this job: it would start at {when} on {e.nodes} in partition "
            f"{e.partition} ({e.processors} processors). Nothing was submitted."
        )


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


# --- submit -----------------------------------------------------------------------------------


def scripts_dir() -> Path:
    return data_dir() / "scripts"


def _write_script(script: str, token: str) -> Path:
    directory = scripts_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"clusterjob-{token}.sh"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(script)
    os.chmod(tmp, 0o700)
    os.replace(tmp, path)
    return path


def git_commit(workdir: Path) -> str | None:
    """The commit checked out in ``workdir`` (with ``-dirty``), for reproducing a run."""
    try:
        head = subprocess.run(
            ["git", "-C", str(workdir), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(workdir), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = head.stdout.strip()
    return commit + ("-dirty" if dirty.stdout.strip() else "") if commit else None


def _cluster_name(client: SlurmClient) -> str:
    from clusterjob.errors import SlurmError

    try:
        return client.cluster_name()
    except SlurmError:
        return ""  # learned from squeue at the first status


def submit(
    site: Site,
    resolved: ResolvedJob,
    rendered: RenderedJob,
    *,
    test_only: bool = False,
    client: SlurmClient | None = None,
    registry: Registry | None = None,
    workdir: str | Path | None = None,
    command_line: Sequence[str] | None = None,
) -> Submitted | TestOnlyResult:
    """Write the rendered script to the data dir and submit it exactly once.

    The registry is opened first, so a corrupt one stops us before a job exists.
    ``test_only``: ``sbatch --test-only``, nothing is submitted or recorded.
    """
    client = client or SlurmClient()
    registry = registry or Registry()
    work = Path(workdir or os.getcwd()).resolve()
    token = rendered.token
    if token_in_script(rendered.script) != token:
        raise UsageError(
            f"the job script does not carry `#SBATCH --comment={COMMENT_PREFIX}{token}`; a "
            "site template that overrides job.sh.j2 must keep that line (it makes "
            "submission safe to retry)"
        )
    if test_only:
        path = _write_script(rendered.script, f"test-{token}")
        try:
            return TestOnlyResult(client.sbatch_test_only(path, workdir=work, site=site))
        finally:
            path.unlink(missing_ok=True)
    registry.check()
    path = _write_script(rendered.script, token)
    submitted = client.sbatch(path, token=token, workdir=work, site=site)
    cluster = submitted.cluster or site.cluster_name or _cluster_name(client)
    record = JobRecord(
        job_id=submitted.job_id,
        cluster=cluster,
        site=site.name,
        token=token,
        job_name=resolved.job_name,
        script=rendered.script,
        script_path=str(path),
        command_line=shlex.join(command_line if command_line is not None else sys.argv),
        work_dir=str(work),
        git_commit=git_commit(work),
        submitted_at=time.time(),
        state="PENDING",
    )
    _record(registry, record)
    return Submitted(submitted.job_id, cluster, site.name, str(path))


def _record(registry: Registry, record: JobRecord) -> None:
    try:
        registry.add(record)
    except RegistryError as exc:
        raise RegistryError(
            f"job {record.job_id} WAS submitted, but could not be recorded: {exc}"
        ) from None


def resubmit(
    job: str,
    *,
    client: SlurmClient | None = None,
    registry: Registry | None = None,
) -> Submitted:
    """Submit a recorded job's script again, from its original directory, as a new job.

    The script gets a fresh token (its ``--comment``), so the new submission is told apart
    from the old job when a timed-out sbatch is looked up.
    """
    from clusterjob.jobscript.request import new_token

    client = client or SlurmClient()
    registry = registry or Registry()
    record = _tracked(registry, job)
    token = new_token()
    old = f"{COMMENT_PREFIX}{record.token}"
    if old not in record.script:
        raise UsageError(f"job {record.job_id}: its recorded script has no {old} comment")
    # the token is random hex: every occurrence (the comment, CLUSTERJOB_TOKEN) is it
    script = record.script.replace(record.token, token)
    path = _write_script(script, token)
    submitted = client.sbatch(path, token=token, workdir=record.work_dir)
    new = JobRecord(
        job_id=submitted.job_id,
        cluster=submitted.cluster or record.cluster,
        site=record.site,
        token=token,
        job_name=record.job_name,
        script=script,
        script_path=str(path),
        command_line=record.command_line,
        work_dir=record.work_dir,
        git_commit=git_commit(Path(record.work_dir)),
        submitted_at=time.time(),
        resubmit_of=record.job_id,
        state="PENDING",
    )
    _record(registry, new)
    StatusCache().clear()
    return Submitted(new.job_id, new.cluster, new.site, str(path))


def _tracked(registry: Registry, job: str) -> JobRecord:
    job_id = registry.resolve_id(job)
    record = registry.get(job_id)
    if record is None:
        raise UsageError(f"job {job_id} was not submitted with clusterjob (not in the registry)")
    return record


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

    def _load(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def get(self, kind: str, ids: Sequence[str], now: float) -> dict | None:
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


def _squeue(client: SlurmClient, cache: StatusCache, ids: list[str], now: float):
    if not ids:
        return []
    hit = cache.get("squeue", ids, now)
    if hit is not None:
        wanted = set(ids)
        return [j for j in parse.parse_squeue(hit["stdout"]) if j.job_id in wanted]
    out = client.squeue_output(ids)
    cache.put("squeue", ids, now, stdout=out)
    return parse.parse_squeue(out)


def _sacct(client: SlurmClient, cache: StatusCache, ids: list[str], now: float):
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


def _select(registry: Registry, jobs: Sequence[str], show_all: bool, now: float):
    """(records to show, ids asked for that clusterjob did not submit)."""
    if jobs:
        records, untracked = [], []
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
    for row in _squeue(client, cache, ask, now):
        queued.setdefault(row.job_id, []).append(row)
    # squeue cannot say how a job ended (exit code): ask sacct about ended ones too
    missing = [i for i in ask if i not in queued or any(parse.is_final(q.state) for q in queued[i])]
    accounted: dict[str, list[parse.AccountedJob]] = {}
    accounting = True
    rows = _sacct(client, cache, missing, now)
    if rows is None:
        accounting = False
    else:
        for row in rows:
            accounted.setdefault(row.job_id, []).append(row)

    def pick(rows, cluster: str):
        for row in rows or ():
            if not cluster or row.cluster == cluster:
                return row
        return None

    results: list[JobStatus] = []
    updates: list[StateUpdate] = []
    for record in records:
        if parse.is_final(record.state):
            results.append(_from_record(record))
            continue
        q = pick(queued.get(record.job_id), record.cluster)
        a = pick(accounted.get(record.job_id), record.cluster)
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
        row = pick(queued.get(job_id), "") or pick(accounted.get(job_id), "")
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


def _expand(pattern: str, q, record: JobRecord) -> str:
    first = q.nodes.split(",")[0] if q.nodes and "[" not in q.nodes else None
    if q.nodes and "[" in q.nodes:
        import hostlist

        first = hostlist.expand_hostlist(q.nodes)[0]
    path = parse.expand_output_pattern(
        pattern, job_id=q.job_id, name=q.name, user=q.user, first_node=first
    )
    return path if os.path.isabs(path) else os.path.join(q.work_dir or record.work_dir, path)


# --- logs, cancel ---------------------------------------------------------------------------


def output_path(
    job: str,
    *,
    stderr: bool = False,
    client: SlurmClient | None = None,
    registry: Registry | None = None,
) -> Path:
    """Where the job writes its stdout (or stderr): Slurm's expanded path while it remembers
    the job, else the one recorded, else ``slurm-<id>.out`` in the submission directory."""
    client = client or SlurmClient()
    registry = registry or Registry()
    job_id = registry.resolve_id(job)
    record = registry.get(job_id)
    recorded = None
    if record is not None:
        recorded = record.stderr_path if stderr else record.stdout_path
    if recorded is None or record is None or not parse.is_final(record.state):
        paths = client.job_output_paths(job_id)
        if paths is not None:
            chosen = paths[1] if stderr else paths[0]
            if chosen:
                return Path(chosen)
    if recorded:
        return Path(recorded)
    if record is None:
        raise UsageError(f"job {job_id}: Slurm no longer knows it and clusterjob did not submit it")
    return Path(record.work_dir) / f"slurm-{job_id}.out"


def follow(
    path: Path,
    *,
    finished: Callable[[], bool],
    poll: float = 0.5,
    check_every: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[str]:
    """Yield what is appended to ``path`` until ``finished()`` says the job ended (asked at
    most every ``check_every`` seconds, so following costs Slurm little) and all is read."""
    position = 0
    last_check = clock()
    done = False
    while True:
        if path.exists():
            with path.open("r", errors="replace") as f:
                f.seek(position)
                chunk = f.read()
                position = f.tell()
            if chunk:
                yield chunk
                continue
        if done:
            return
        if clock() - last_check >= check_every:
            last_check = clock()
            done = finished()
            continue
        sleep(poll)


def is_finished(job: str, *, client: SlurmClient | None = None) -> bool:
    rows = status([job], client=client)
    return all(parse.is_final(r.state) or r.state == "UNKNOWN" for r in rows)


def cancel(
    jobs: Sequence[str],
    *,
    client: SlurmClient | None = None,
    registry: Registry | None = None,
) -> list[str]:
    """Ask Slurm to cancel ``jobs`` (ids or ``last``) in one scancel call."""
    client = client or SlurmClient()
    registry = registry or Registry()
    ids = [registry.resolve_id(j) for j in jobs]
    if not ids:
        raise UsageError("name at least one job to cancel")
    client.scancel(ids)
    StatusCache().clear()
    return ids
