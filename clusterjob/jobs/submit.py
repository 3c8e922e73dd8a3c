"""Submitting a rendered job exactly once, and submitting a recorded one again.

The script is kept in the data dir and the submission recorded in the registry with what
reproduces it (command line, directory, git commit). An sbatch refusal is worded for the
site (``clusterjob.jobs.explain``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from clusterjob.errors import (
    RegistryError,
    SlurmError,
    SubmissionUncertain,
    SubmitInterrupted,
    UsageError,
)
from clusterjob.jobs.explain import sbatch_hints
from clusterjob.jobs.followup import follow_up
from clusterjob.jobs.private_files import data_dir, ensure_private_dir, write_private
from clusterjob.jobs.registry import JobRecord, Registry
from clusterjob.jobs.status import cache_for, settle_pending
from clusterjob.jobscript.backends import backend_for, backend_named, check_submits
from clusterjob.process import answer_later
from clusterjob.slurm.commands import COMMENT_PREFIX, SlurmClient, token_in_script
from clusterjob.slurm.parse import StartEstimate, SubmittedJobId, is_final
from clusterjob.slurm.syntax import split_array_id

if TYPE_CHECKING:
    from clusterjob.jobscript.control import JobControl
    from clusterjob.jobscript.render import RenderedJob
    from clusterjob.jobscript.request import JobRequest, ResolvedJob
    from clusterjob.site.model import Site

# The form of a recorded request (the registry's `request` column): 2 keeps tasks_per_node
# None when it was not asked for; before, 1 stood for both.
REQUEST_FORMAT = 2


@dataclass(frozen=True)
class Submitted:
    job_id: str
    cluster: str
    site: str
    script_path: str
    sbatch_command: str = ""
    tasks: int | None = None  # an array's (or sweep's) number of tasks
    host: str = ""  # the login node it went through (--host), "" for this machine

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def __str__(self) -> str:
        on = f" on cluster {self.cluster}" if self.cluster else ""
        status = follow_up("status", self.job_id, host=self.host)
        logs = follow_up("logs", self.job_id, "-f", host=self.host)
        return (
            f"Submitted job {self.job_id}{on} (site {self.site}); script kept at "
            f"{self.script_path}\nFollow it with: {status}; {logs}"
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


def scripts_dir() -> Path:
    return data_dir() / "scripts"


def _write_script(script: str, token: str) -> Path:
    directory = ensure_private_dir(scripts_dir())  # scripts hold command lines: owner only
    path = directory / f"clusterjob-{token}.sh"
    write_private(path, script, 0o700)
    return path


def start_git_commit(workdir: Path) -> Callable[[], str | None]:
    """The commit checked out in ``workdir`` (with ``-dirty``), for reproducing a run, begun
    now and given when the result is called: git reads the work tree while the job is
    submitted. Outside any git work tree, git is not run."""
    if "GIT_DIR" not in os.environ and not any(
        os.path.lexists(os.path.join(folder, ".git")) for folder in (workdir, *workdir.parents)
    ):  # where git finds a repository without GIT_DIR: a .git (folder or file) above
        return lambda: None
    try:
        proc = subprocess.Popen(  # the commit and the changed files in one git process
            ["git", "-C", str(workdir), "status", "--porcelain=v2", "--branch",
             "--untracked-files=no"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
    except OSError:
        return lambda: None
    return answer_later(
        proc, 5, lambda out, code: commit_of_status(out) if code == 0 else None
    )  # a submission that failed first: no stray git


def commit_of_status(porcelain: str) -> str | None:
    """The commit (``-dirty`` where a tracked file changed) in ``git status --porcelain=v2
    --branch``'s output; None before the first commit."""
    lines = porcelain.splitlines()
    oid = next((ln.split()[2] for ln in lines if ln.startswith("# branch.oid ")), None)
    if oid is None or oid == "(initial)":
        return None
    dirty = any(ln and not ln.startswith("#") for ln in lines)
    return oid + ("-dirty" if dirty else "")


def _cluster_name(client: SlurmClient) -> str:
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
    resubmit_of: str | None = None,
    source_dir: str | Path | None = None,
) -> Submitted | TestOnlyResult:
    """Write the rendered script to the data dir and submit it exactly once.

    The registry is opened first, so a corrupt one stops us before a job exists.
    ``test_only``: ``sbatch --test-only``, nothing is submitted or recorded.
    On a remote cluster (the client's transport is ssh) ``workdir`` is a directory there,
    taken as given; ``source_dir`` is the local directory it was synced from (its git
    commit is recorded), and the record names the host.
    """
    check_submits(site)  # a scheduler clusterjob only renders for stops here
    control = backend_for(site).control()
    if control is not None:  # a scheduler followed through its backend (Grid Engine)
        return _submit_controlled(
            site, resolved, rendered, control, test_only, registry, workdir,
            command_line, resubmit_of, source_dir,
        )  # fmt: skip
    client = client or SlurmClient()
    registry = registry or Registry(host=client.runner.transport.label)
    remote = client.remote
    if remote:
        if workdir is None:
            raise UsageError("a job on a remote cluster needs its directory there")
        work = Path(str(workdir))
    else:
        work = Path(workdir or os.getcwd()).resolve()
    local = Path(source_dir).resolve() if source_dir is not None else (None if remote else work)
    commit = start_git_commit(local) if local is not None and not test_only else lambda: None
    token = rendered.token
    if token_in_script(rendered.script) != token:
        raise UsageError(
            f"the job script does not carry `#SBATCH --comment={COMMENT_PREFIX}{token}`; a "
            "site template that overrides job.sh.j2 must keep that line (it makes "
            "submission safe to retry)"
        )
    check_dependency(resolved.request.dependency, client)
    snapshot = resolved.request.snapshot
    if snapshot and not remote and not test_only and not Path(snapshot).is_dir():
        raise UsageError(  # resubmit of a job whose copy was pruned (jobs/snapshot.py)
            f"the job's code snapshot {snapshot} is gone (it is removed a week after its "
            "job ended): submit the job again, which copies the code as it is now"
        )
    if test_only:
        path = _write_script(rendered.script, f"test-{token}")
        try:
            with sbatch_hints(site):
                return TestOnlyResult(
                    client.sbatch_test_only(path, workdir=work, script=rendered.script)
                )
        finally:
            path.unlink(missing_ok=True)
    with registry.held():  # one connection for the check, the record and its job id
        return _submit_recorded(
            site, resolved, rendered, client, registry, work, commit, command_line, resubmit_of
        )  # fmt: skip


def _submit_recorded(
    site: Site,
    resolved: ResolvedJob,
    rendered: RenderedJob,
    client: SlurmClient,
    registry: Registry,
    work: Path,
    commit: Callable[[], str | None],
    command_line: Sequence[str] | None,
    resubmit_of: str | None,
) -> Submitted:
    """Record the job, run sbatch, record its id (``send_recorded``)."""
    token = rendered.token
    registry.check()
    path = _write_script(rendered.script, token)
    request = resolved.request
    pending = JobRecord(
        job_id="",
        cluster=site.cluster_name or "",
        site=site.name,
        token=token,
        job_name=resolved.job_name,
        script=rendered.script,
        script_path=str(path),
        command_line=shlex.join(command_line if command_line is not None else sys.argv),
        work_dir=str(work),
        git_commit=None,  # read by git while sbatch runs: recorded with the job id
        submitted_at=time.time(),
        state="PENDING",
        request=json.dumps({**asdict(request), "request_format": REQUEST_FORMAT}),
        resubmit_of=resubmit_of,
        host=client.runner.transport.label,
        scheduler=backend_for(site).name,
    )

    def sbatch() -> SubmittedJobId:
        with sbatch_hints(site):
            return client.sbatch(path, token=token, workdir=work, script=rendered.script)

    record = send_recorded(registry, pending, sbatch, lambda: _cluster_name(client), commit)
    return Submitted(
        record.job_id,
        record.cluster,
        site.name,
        str(path),
        shlex.join(["sbatch", "--parsable", f"--chdir={work}", str(path)]),
        _task_count(request.array),
        record.host,
    )


def _submit_controlled(
    site: Site,
    resolved: ResolvedJob,
    rendered: RenderedJob,
    control: JobControl,
    test_only: bool,
    registry: Registry | None,
    workdir: str | Path | None,
    command_line: Sequence[str] | None,
    resubmit_of: str | None,
    source_dir: str | Path | None,
) -> Submitted:
    from clusterjob.jobs import controlled

    if test_only:
        raise UsageError(f"--test-only is Slurm's (sbatch --test-only); site {site.name} is not")
    return controlled.submit(
        site, resolved, rendered, control, registry=registry, workdir=workdir,
        command_line=command_line, resubmit_of=resubmit_of, source_dir=source_dir,
    )  # fmt: skip


class _Sent(Protocol):
    """What a submission answered: ``SubmittedJobId`` (sbatch) or a ``Submission``."""

    @property
    def job_id(self) -> str: ...

    @property
    def cluster(self) -> str | None: ...


class _HeldInterrupt:
    """Ctrl-C (SIGINT) held while a submission is sent and recorded: the first is noted and
    acted on once the job is recorded; a second interrupts at once. Signals reach only the
    main thread: elsewhere (and where SIGINT is ignored) nothing is held."""

    def __init__(self) -> None:
        self.interrupted = False
        self._previous: Any = None
        self._held = False

    def __enter__(self) -> _HeldInterrupt:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if previous not in (signal.SIG_IGN, None):
                self._previous = signal.signal(signal.SIGINT, self._note)
                self._held = True
        return self

    def _note(self, signum: int, frame: object) -> None:
        if self.interrupted:
            raise KeyboardInterrupt
        self.interrupted = True
        print(
            "clusterjob: interrupted: finishing the submission first, so that its job is not "
            "lost (Ctrl-C again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def __exit__(self, *exc: object) -> None:
        if self._held:
            signal.signal(signal.SIGINT, self._previous)
            self._held = False


def send_recorded(
    registry: Registry,
    pending: JobRecord,
    sbatch: Callable[[], _Sent],
    cluster_name: Callable[[], str],
    git_commit: Callable[[], str | None] = lambda: None,
) -> JobRecord:
    """Submit exactly once with no job ever unrecorded: ``pending`` (no job id yet) is
    recorded before ``sbatch`` runs and completed with the id once it answers; a refusal
    (or a look-up that found no job) removes it, any other failure keeps it for ``status``
    to settle by its token. Ctrl-C is held meanwhile (``_HeldInterrupt``): one before sbatch
    submits nothing, one after it says which job was submitted and how to cancel it.
    ``git_commit`` (``start_git_commit``'s answer, git reading the work tree meanwhile) is
    asked for once sbatch has answered, and recorded with the job id."""
    token, host = pending.token, pending.host
    with _HeldInterrupt() as held:
        registry.add(pending)
        if held.interrupted:  # nothing was sent
            registry.discard(token)
            raise KeyboardInterrupt
        try:
            submitted = sbatch()
        except SlurmError as exc:
            if not isinstance(exc, SubmissionUncertain):  # refused, or looked up: no job
                registry.discard(token)
            raise
        except KeyboardInterrupt:
            raise SubmitInterrupted(
                "interrupted while sbatch ran: the job may or may not exist; "
                f"`{follow_up('status', host=host)}` looks for it (its comment is "
                f"{COMMENT_PREFIX}{token}) and records it"
            ) from None
        job_id = submitted.job_id
        cancel = follow_up("cancel", job_id, host=host)
        try:
            cluster = submitted.cluster or pending.cluster or cluster_name()
            commit = git_commit()
            registry.complete(token, job_id, cluster, git_commit=commit)
        except RegistryError as exc:
            raise RegistryError(
                f"job {job_id} WAS submitted, but could not be recorded: {exc}; cancel it "
                f"with `{cancel}`"
            ) from None
        except KeyboardInterrupt:
            raise SubmitInterrupted(
                f"interrupted: job {job_id} WAS submitted; `{follow_up('status', host=host)}` "
                f"completes its record; cancel it with `{cancel}`"
            ) from None
    if held.interrupted:
        raise SubmitInterrupted(
            f"interrupted: job {job_id} was submitted and is recorded; cancel it with `{cancel}`"
        )
    return replace(pending, job_id=job_id, cluster=cluster, git_commit=commit)


_JOB_ID = re.compile(r"^[0-9]+(?:_[0-9]+)?$")


def dependency_job_ids(dependency: str) -> list[str]:
    """The job ids a ``--dependency`` names: ``afterok:12:13,afterany:14+5?singleton`` -> 12,
    13, 14 (a bare id is Slurm's ``afterany``); words that are no job id are sbatch's to judge."""
    ids: list[str] = []
    for part in re.split(r"[,?]", dependency):
        kind, _, rest = part.partition(":")
        words = rest.split(":") if rest else [kind]
        ids.extend(w.split("+", 1)[0] for w in words if _JOB_ID.match(w.split("+", 1)[0]))
    return ids


def check_dependency(dependency: str | None, client: SlurmClient) -> None:
    """Refuse a dependency on a job Slurm does not know: sbatch takes it, and Slurm drops it
    and starts the job at once (seen on 22.05). A job is known while the controller holds it
    (squeue) and, once forgotten, to accounting (sacct)."""
    wanted = dependency_job_ids(dependency or "")
    if not wanted:
        return
    known = {split_array_id(j.job_id)[0] for j in client.squeue_jobs(wanted)}
    missing = [j for j in wanted if split_array_id(j)[0] not in known]
    if missing:
        accounted = client.sacct_jobs(missing) or []  # None: no accounting to ask
        known |= {split_array_id(j.job_id)[0] for j in accounted}
        missing = [j for j in missing if split_array_id(j)[0] not in known]
    if missing:
        jobs = ", ".join(dict.fromkeys(missing))
        raise UsageError(
            f"--dependency {dependency}: Slurm knows no job {jobs} (neither queued nor in "
            "accounting); Slurm would drop the dependency and start this job at once"
        )


def _task_count(array: str | None) -> int | None:
    from clusterjob.slurm.syntax import array_task_ids

    try:
        return len(array_task_ids(array)) if array else None
    except ValueError:
        return None


def check_output_dirs(
    output: str | None, error: str | None, workdir: str | Path, *, mkdir: bool = False
) -> list[Path]:
    """The directories of ``-o``/``-e`` must exist: Slurm cannot create them, and a job whose
    log cannot be opened fails without a word. ``mkdir``: create them. Returns those made."""
    made: list[Path] = []
    for option, pattern in (("--output", output), ("--error", error)):
        if not pattern:
            continue
        directory = Path(os.path.dirname(pattern))
        if "%" in str(directory) or str(directory) in ("", "."):
            continue  # a directory per job (%j) is made by nobody: Slurm's own business
        full = directory if directory.is_absolute() else Path(workdir) / directory
        if full.is_dir():
            continue
        if not mkdir:
            raise UsageError(
                f"{option} {pattern}: directory {full} does not exist (Slurm cannot create it "
                "and the job would fail silently); create it or pass --mkdir"
            )
        try:
            full.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"{option} {pattern}: cannot create {full}: {exc.strerror}") from None
        made.append(full)
    return made


_LAST = re.compile(r"(?<=[:,?])last(?:~([0-9]+))?(?=$|[:,?+])")


def expand_dependency(dependency: str, registry: Registry | None = None) -> str:
    """``afterok:last`` (and ``last~N``) -> the job ids clusterjob submitted last."""
    if "last" not in dependency:
        return dependency
    registry = registry or Registry()
    return _LAST.sub(lambda m: registry.resolve_id(m.group(0)), dependency)


@dataclass(frozen=True)
class Changes:
    """What ``resubmit`` changes in the recorded request (None / empty: keep it). ``env``:
    ``KEY=VALUE`` over the recorded ones of the same key; ``venv``: the job's interpreter
    instead of the recorded one."""

    args: tuple[str, ...] = ()
    gpus: int | None = None
    model: str | None = None
    time: str | None = None
    nodes: int | None = None
    partition: str | None = None
    array: str | None = None
    env: tuple[str, ...] = ()
    venv: str | None = None

    def any(self) -> bool:
        kept = (self.gpus, self.model, self.time, self.nodes, self.partition, self.array, self.venv)
        return bool(self.args or self.env) or any(v is not None for v in kept)


# The task states `resubmit --failed` runs again: every end but COMPLETED.
RERUN_STATES = frozenset(
    {"FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE",
     "PREEMPTED"}
)  # fmt: skip


def array_ranges(ids: Sequence[int]) -> str:
    """Task indices as one ``--array`` value: [1, 2, 3, 7] -> ``1-3,7``."""
    ordered = sorted(set(ids))
    parts: list[str] = []
    start = prev = ordered[0]
    for i in [*ordered[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def rerun_tasks(tasks: Sequence[tuple[int, str]]) -> list[int]:
    """The tasks ``resubmit --failed`` runs again: those (index, state) that ended other than
    COMPLETED (failed, cancelled, timed out, out of memory, node failure, preempted)."""
    return sorted(i for i, state in tasks if state in RERUN_STATES)


def _sweep_range(array: str, count: int) -> bool:
    """Whether a recorded sweep's ``--array`` is the whole sweep as submit derived it
    (``0-N`` with any ``%limit``), not some of its tasks (a resubmission of those)."""
    return array.partition("%")[0] == (f"0-{count - 1}" if count > 1 else "0")


def recorded_request(record: JobRecord) -> JobRequest:
    """The request a job was submitted with, as the registry keeps it."""
    from clusterjob.jobscript.request import JobRequest

    if not record.request:
        raise UsageError(
            f"job {record.job_id} was recorded without its request (an older clusterjob); "
            "resubmit it with --same-script"
        )
    try:
        data = json.loads(record.request)
        if data.pop("request_format", 1) < 2 and data.get("tasks_per_node") == 1:
            data["tasks_per_node"] = None  # recorded before 2: 1 was also "not asked for"
        data["args"] = tuple(data.get("args") or ())
        data["sbatch_args"] = tuple(data.get("sbatch_args") or ())
        data["task_args"] = tuple(tuple(t) for t in data.get("task_args") or ())
        for name in ("setup", "modules", "env", "launcher_args", "gres"):
            if name in data:
                data[name] = tuple(data[name] or ())
        return JobRequest(**data)
    except (ValueError, TypeError) as exc:
        raise UsageError(
            f"job {record.job_id}: its recorded request is unreadable ({exc})"
        ) from None


def resubmit(
    job: str,
    *,
    site: Site | None = None,
    changes: Changes | None = None,
    same_script: bool = False,
    failed: bool = False,
    client: SlurmClient | None = None,
    registry: Registry | None = None,
    interpreter: Callable[[Site, ResolvedJob], ResolvedJob] | None = None,
) -> Submitted:
    """Submit a recorded job again, from its original directory, as a new job.

    By default the recorded request (with ``changes``) is resolved and rendered again with
    ``site`` as it is today and the shipped templates; ``same_script`` replays the old
    script byte for byte but for its token (and its ``--array`` line, for some tasks).
    ``job`` ``ID_TASK``: that one task of an array (or sweep) again, as a one-task array of
    the same index; ``failed``: the tasks that did not complete, as one array of their
    indices. ``interpreter``: the job's Python is chosen by it (a cluster over ssh, whose
    files are not here) instead of on this machine.
    """

    from clusterjob.jobscript.render import render
    from clusterjob.jobscript.request import new_token, resolve

    changes = changes or Changes()
    client = client or SlurmClient()
    registry = registry or Registry(host=client.runner.transport.label)
    base, task = split_array_id(registry.resolve_id(job))
    record = _tracked(registry, base, client)
    _refuse_replays_the_scheduler_lacks(record, task, failed=failed, same_script=same_script)
    tasks = _tasks_again(record, task, failed, changes, client, registry)
    resubmit_of = record.job_id if task is None else f"{record.job_id}_{task}"
    if same_script:
        if changes.any():
            raise UsageError("--same-script replays the old script: it takes no changes")
        return _replay(record, client, registry, array=tasks, resubmit_of=resubmit_of)
    if site is None:
        raise UsageError("resubmit needs the site config to render the job again")
    if record.site and site.name != record.site:
        raise UsageError(
            f"job {record.job_id} was submitted at site {record.site}, but the site config "
            f"found here is {site.name}; pass --site (or --same-script)"
        )
    request = recorded_request(record)
    updates: dict[str, object] = {"token": new_token()}
    if changes.args:
        updates["args"] = changes.args
    for name in ("gpus", "model", "time", "nodes", "partition"):
        value = getattr(changes, name)
        if value is not None:
            updates[name] = value
    if changes.env:
        updates["env"] = _merged_env(request.env, changes.env)
    if changes.venv is not None:  # instead of the recorded choice, whatever it was
        updates.update(venv=changes.venv, python=None, conda=None, python_why=None)
    request = replace(request, **updates)  # type: ignore[arg-type]
    swept = request.array is not None and request.task_args
    if swept and _sweep_range(str(request.array), len(request.task_args)):
        # the sweep's own 0-N range is derived again; keep only the %N limit given
        limit = str(request.array).partition("%")[2]
        request = replace(request, array=f"%{limit}" if limit else None)
    if tasks is not None or changes.array is not None:
        request = replace(request, array=tasks if tasks is not None else changes.array)
    resolved = resolve(site, request, choose_interpreter=interpreter is None)
    if interpreter is not None:
        resolved = _keep_recorded_why(interpreter(site, resolved), request)
    rendered = render(site, resolved)
    result = submit(
        site,
        resolved,
        rendered,
        client=client,
        registry=registry,
        workdir=record.work_dir,
        resubmit_of=resubmit_of,
    )
    cache_for(client).clear()
    assert isinstance(result, Submitted)
    return result


def _refuse_replays_the_scheduler_lacks(
    record: JobRecord, task: str | None, *, failed: bool, same_script: bool
) -> None:
    """A job of a scheduler followed through its backend (Grid Engine) is resubmitted by
    rendering it again: replaying its script and picking tasks read Slurm's #SBATCH lines and
    submit with sbatch, so they are refused in one line rather than sent to the wrong
    scheduler."""
    backend = backend_named(record.scheduler)
    if backend.control() is None:
        return
    asked = [
        name
        for name, wanted in (
            ("--same-script", same_script), ("a task id", task is not None), ("--failed", failed)
        )
        if wanted
    ]  # fmt: skip
    if asked:
        raise UsageError(
            f"job {record.job_id} ran on {backend.label}, where resubmit renders the job "
            f"again: {', '.join(asked)} not yet; leave it out"
        )


def _keep_recorded_why(resolved: ResolvedJob, recorded: JobRequest) -> ResolvedJob:
    """The interpreter chosen over ssh, with the recorded reason when it is the recorded one
    (it would otherwise read as ``--python``)."""
    request = resolved.request
    if recorded.python_why is None or request.python != recorded.python:
        return resolved
    return replace(resolved, request=replace(request, python_why=recorded.python_why))


def _merged_env(recorded: Sequence[str], given: Sequence[str]) -> tuple[str, ...]:
    """``KEY=VALUE`` words: the given ones replace the recorded ones of the same key."""
    keys = {word.partition("=")[0] for word in given}
    return (*(w for w in recorded if w.partition("=")[0] not in keys), *given)


def _tasks_again(
    record: JobRecord,
    task: str | None,
    failed: bool,
    changes: Changes,
    client: SlurmClient,
    registry: Registry,
) -> str | None:
    """The ``--array`` of a resubmission of some of an array's tasks: one task (``ID_TASK``),
    or those that did not complete (``failed``); None: the job as it was."""
    from clusterjob.jobs.status import array_spec, status

    if task is None and not failed:
        return None
    if task is not None and failed:
        raise UsageError(
            f"--failed takes an array job's id ({record.job_id}), not one of its tasks"
        )
    if changes.array is not None:
        raise UsageError("--array and a task id (or --failed) exclude each other: give one")
    spec = array_spec(record.script)
    if spec is None:
        what = f"no task {task}" if task is not None else "no tasks to resubmit with --failed"
        raise UsageError(f"job {record.job_id} is not an array job: it has {what}")
    if task is not None:
        known = _spec_task_ids(spec)
        if not task.isdigit() or int(task) not in known:
            raise UsageError(
                f"job {record.job_id} has no task {task} (its tasks: {spec.partition('%')[0]})"
            )
        return str(int(task))
    (row,) = status([record.job_id], tasks=True, client=client, registry=registry)
    ended = [(int(t.job_id.rpartition("_")[2]), t.state) for t in row.tasks]
    again = rerun_tasks(ended)
    if not again:
        raise UsageError(
            f"job {record.job_id}: no task failed, was cancelled or timed out "
            f"({row.tasks_summary or row.state}); nothing to resubmit"
        )
    limit = spec.partition("%")[2]
    return array_ranges(again) + (f"%{limit}" if limit and len(again) > 1 else "")


def _spec_task_ids(spec: str) -> list[int]:
    from clusterjob.slurm.syntax import array_task_ids

    try:
        return array_task_ids(spec)
    except ValueError:
        return []


_ARRAY_DIRECTIVE = re.compile(r"^#SBATCH\s+(?:--array[= ]|-a\s*)\S+$", re.MULTILINE)
_EXCLUDE_DIRECTIVE = re.compile(r"^#SBATCH\s+(?:--exclude[= ]|-x\s*)\S+$", re.MULTILINE)
_RETRY_COMMENT = re.compile(r"^# --retry-bad-node [0-9]+: .*\n", re.MULTILINE)


def resubmit_elsewhere(
    job: str,
    avoid: Sequence[str],
    token: str,
    *,
    client: SlurmClient | None = None,
    registry: Registry | None = None,
) -> Submitted:
    """A ``--retry-bad-node`` retry: the recorded job's script replayed (as ``--same-script``:
    the same site file, Python and code) with ``avoid`` added to its ``--exclude`` and one
    retry spent, under ``token`` (derived from the job's: ``badnodes.retry_token``)."""
    from clusterjob.jobs.badnodes import merged_exclude
    from clusterjob.jobscript.shell import sbatch_value

    client = client or SlurmClient()
    registry = registry or Registry(host=client.runner.transport.label)
    record = _tracked(registry, registry.resolve_id(job), client)
    request = recorded_request(record)
    exclude, added = merged_exclude(request.exclude, avoid, request.nodelist)
    if not added:
        raise UsageError(f"job {record.job_id}: no node left to exclude (--nodelist names it)")
    line = f"#SBATCH --exclude={sbatch_value(str(exclude))}"
    script, found = _EXCLUDE_DIRECTIVE.subn(line, record.script, 1)
    if not found:  # before the comment line every job script has (submit checks it)
        comment = f"#SBATCH --comment={COMMENT_PREFIX}{record.token}"
        script = script.replace(comment, f"{line}\n{comment}", 1)
    left = max(0, request.retry_bad_node - 1)
    script = _RETRY_COMMENT.sub(
        lambda m: m[0].replace(f" {request.retry_bad_node}:", f" {left}:", 1) if left else "",
        script,
    )
    data = {**asdict(replace(request, exclude=exclude, retry_bad_node=left)),
            "request_format": REQUEST_FORMAT}  # fmt: skip
    again = replace(record, script=script, request=json.dumps(data))
    return _replay(again, client, registry, resubmit_of=record.job_id, token=token)


def _replay(
    record: JobRecord,
    client: SlurmClient,
    registry: Registry,
    *,
    array: str | None = None,
    resubmit_of: str | None = None,
    token: str | None = None,
) -> Submitted:
    """The recorded script again, byte for byte but for its token (``--same-script``; given,
    or a new one), and its ``#SBATCH --array`` line when ``array`` says which tasks to run
    again.

    The script gets a fresh token (its ``--comment``), so the new submission is told apart
    from the old job when a timed-out sbatch is looked up.
    """
    from clusterjob.jobscript.request import new_token
    from clusterjob.jobscript.shell import sbatch_value

    token = token or new_token()
    old = f"{COMMENT_PREFIX}{record.token}"
    if old not in record.script:
        raise UsageError(f"job {record.job_id}: its recorded script has no {old} comment")
    # the token is random hex: every occurrence (the comment, CLUSTERJOB_TOKEN) is it
    script = record.script.replace(record.token, token)
    if array is not None:
        script, found = _ARRAY_DIRECTIVE.subn(f"#SBATCH --array={sbatch_value(array)}", script, 1)
        if not found:
            raise UsageError(f"job {record.job_id}: its recorded script has no --array line")
    path = _write_script(script, token)
    pending = JobRecord(
        job_id="",
        cluster=record.cluster,
        site=record.site,
        token=token,
        job_name=record.job_name,
        script=script,
        script_path=str(path),
        command_line=record.command_line,
        work_dir=record.work_dir,
        git_commit=None,  # read by git while sbatch runs: recorded with the job id
        submitted_at=time.time(),
        resubmit_of=resubmit_of or record.job_id,
        state="PENDING",
        request=record.request,
        host=client.runner.transport.label,
        scheduler=record.scheduler,
    )

    def sbatch() -> SubmittedJobId:
        with sbatch_hints(None):  # the record names its site, but the site config is not loaded
            return client.sbatch(path, token=token, workdir=record.work_dir, script=script)

    commit = (lambda: None) if client.remote else start_git_commit(Path(record.work_dir))
    new = send_recorded(registry, pending, sbatch, lambda: "", commit)
    cache_for(client).clear()
    return Submitted(
        new.job_id,
        new.cluster,
        new.site,
        str(path),
        shlex.join(["sbatch", "--parsable", f"--chdir={record.work_dir}", str(path)]),
        host=new.host,
    )


def provenance(
    job: str, *, registry: Registry | None = None, client: SlurmClient | None = None
) -> dict[str, object]:
    """Where a job came from: command line, directory, git commit, site, token, script.
    ``client``: Slurm, to settle submissions interrupted before their id was recorded."""
    registry = registry or Registry()
    record = _tracked(registry, job, client)
    commit = record.git_commit or ""
    return {
        "job_id": record.job_id,
        "cluster": record.cluster,
        "site": record.site,
        "submitted": record.submitted.isoformat(timespec="seconds"),
        "command_line": record.command_line,
        "work_dir": record.work_dir,
        "git_commit": commit.removesuffix("-dirty") or None,
        "git_dirty": commit.endswith("-dirty") if commit else None,
        "token": record.token,
        "script_path": record.script_path,
        # the key keeps its name for every scheduler (``submit --json`` names it so too)
        "sbatch_command": shlex.join(
            backend_named(record.scheduler).submit_command(record.script_path, record.work_dir)
        ),
        "resubmit_of": record.resubmit_of,
        "state": record.state,
        **_interpreter_of(record),
        **_requeues_of(record),
        "hardware": _hardware_of(record, registry),
        "gpu_usage": _usage_of(record),
    }


def _usage_of(record: JobRecord) -> list[dict[str, object]]:
    """How busy the job's GPUs were, as its in-job sampler recorded it (jobs.usage)."""
    from dataclasses import asdict

    from clusterjob.jobs.usage import read_usage

    return [asdict(u) for u in read_usage(record.token)]


def _hardware_of(record: JobRecord, registry: Registry) -> str | None:
    """The GPU fault ``status`` found on the job's node during it (jobs.hardware), if any."""
    from clusterjob.jobs.hardware import recorded_finding
    from clusterjob.jobs.status import StatusCache

    return recorded_finding(StatusCache(host=registry.host), record.cluster, record.job_id)


def _requeues_of(record: JobRecord) -> dict[str, object]:
    """The job's requeue limit, how often it was requeued as last seen, and, when it stopped
    itself past the limit, that said in words (None: it did not, or not yet seen)."""
    from clusterjob.jobscript.requeues import limit_text, recorded_limit, stopped_at_limit

    reached = stopped_at_limit(record.exit_code, record.script) if is_final(record.state) else None
    return {
        "max_requeues": recorded_limit(record.script),
        "restarts": record.restarts,
        "requeue_limit_reached": None if reached is None else limit_text(reached, record.restarts),
    }


def _interpreter_of(record: JobRecord) -> dict[str, object]:
    """The interpreter the job ran with and why, as recorded (None for older records)."""
    try:
        data = json.loads(record.request or "{}")
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    python = data.get("python") or (f"conda env {data['conda']}" if data.get("conda") else None)
    return {"python": python, "python_why": data.get("python_why")}


def tracked(registry: Registry, job: str, client: SlurmClient | None = None) -> JobRecord:
    """The record of ``job`` (an id, ``ID_TASK`` or ``last``); refused in one line when
    clusterjob did not submit it."""
    base = job if job.startswith("last") else job.split("_", 1)[0]
    return _tracked(registry, registry.resolve_id(base), client)


def _tracked(registry: Registry, job: str, client: SlurmClient | None = None) -> JobRecord:
    job_id = registry.resolve_id(job)
    record = registry.get(job_id)
    if record is None and client is not None and registry.pending():
        settle_pending(registry, client)
        record = registry.get(job_id)
    if record is None:
        raise UsageError(f"job {job_id} was not submitted with clusterjob (not in the registry)")
    return record
