"""Submitting a rendered job exactly once, and submitting a recorded one again.

The script is kept in the data dir and the submission recorded in the registry with what
reproduces it (command line, directory, git commit). An sbatch refusal is worded for the
site (``clusterjob.jobs.explain``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clusterjob.errors import RegistryError, SlurmError, UsageError
from clusterjob.jobs.explain import sbatch_hints
from clusterjob.jobs.private_files import ensure_private_dir, write_private
from clusterjob.jobs.registry import JobRecord, Registry, data_dir
from clusterjob.jobs.status import StatusCache
from clusterjob.slurm.commands import COMMENT_PREFIX, SlurmClient, token_in_script
from clusterjob.slurm.parse import StartEstimate

if TYPE_CHECKING:
    from clusterjob.jobscript.render import RenderedJob
    from clusterjob.jobscript.request import ResolvedJob
    from clusterjob.site.model import Site


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


def scripts_dir() -> Path:
    return data_dir() / "scripts"


def _write_script(script: str, token: str) -> Path:
    directory = ensure_private_dir(scripts_dir())  # scripts hold command lines: owner only
    path = directory / f"clusterjob-{token}.sh"
    write_private(path, script, 0o700)
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
            with sbatch_hints(site):
                return TestOnlyResult(client.sbatch_test_only(path, workdir=work))
        finally:
            path.unlink(missing_ok=True)
    registry.check()
    path = _write_script(rendered.script, token)
    with sbatch_hints(site):
        submitted = client.sbatch(path, token=token, workdir=work)
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
    with sbatch_hints(None):  # the record names its site, but the site config is not loaded
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
