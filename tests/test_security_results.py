"""A function job's result is unpickled only if no one but the submitting user could have
written it, and only if it is that job's (and task's) own.

The worker here is the real one (``clusterjob_worker.py JOBDIR`` run as the job would run
it); another user is a real Unix user who owns the ``.clusterjob/functions`` tree of a
shared directory and plants a pickle that, once unpickled, would leave a marker file. Over
ssh the same checks run on the login node: a stand-in ``ssh`` runs the remote command here.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import cloudpickle
import pytest
from unix_users import UnixUser, unix_user

from clusterjob.api import worker
from clusterjob.api.cluster import Cluster, Job
from clusterjob.errors import JobFailed
from clusterjob.jobs.status import JobStatus
from clusterjob.slurm import ssh

COMPLETED = JobStatus("7", "c", "fn", "COMPLETED", None, "", "n1", "0:01", 0, None, "lab", "sacct")


class Planted:
    """Unpickling this runs ``touch MARKER``: proof that a file was unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {self.marker}",))


def run_worker(jobdir: Path, calls: list, task: int | None = None) -> None:
    """Submit-side files as ``_function_jobs`` writes them, then the real worker on them."""
    jobdir.mkdir(mode=0o700, parents=True)
    (jobdir / "input.pkl").write_bytes(cloudpickle.dumps((worker.PROTOCOL, pow, calls)))
    shutil.copy(worker.__file__, jobdir / "clusterjob_worker.py")
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(task)} if task is not None else None
    subprocess.run(
        [sys.executable, str(jobdir / "clusterjob_worker.py"), str(jobdir)], env=env, check=True
    )


def outcome(cluster: Cluster, jobdir: Path | str, task: int = 0) -> object:
    """What ``Job.result()`` gives once the poller saw the job COMPLETED: value or exception."""
    job = Job(cluster, "7", jobdir=str(jobdir), task=task)
    job._settle(COMPLETED, 0.0)
    assert job.done()
    try:
        return concurrent.futures.Future.result(job, 0)
    except JobFailed as exc:
        return exc


@pytest.fixture
def local(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    monkeypatch.delenv("CLUSTERJOB_HOST", raising=False)
    return unpolled(Cluster())


def unpolled(cluster: Cluster) -> Cluster:
    """No poller thread asking Slurm about job 7: the test settles it itself, once."""
    cluster._poller = SimpleNamespace(add=lambda job: None, wake=lambda: None)  # type: ignore[assignment]
    return cluster


@pytest.fixture
def remote(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """A Cluster over ssh whose `ssh` runs the remote command on this machine."""
    base = Path(tempfile.mkdtemp(prefix="cj-"))
    (base / "bin").mkdir()
    fake = base / "bin" / "ssh"
    fake.write_text('#!/bin/sh\nfor last; do :; done\nexec sh -c "$last"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{base / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv(ssh.RUNTIME_DIR_ENV, str(base / "rt"))
    monkeypatch.delenv(ssh.SSH_CONFIG_ENV, raising=False)
    yield unpolled(Cluster(host="ada@login1"))
    shutil.rmtree(base)


@pytest.fixture(params=["local", "remote"])
def cluster(request: pytest.FixtureRequest) -> Cluster:
    return request.getfixturevalue(request.param)


def label(cluster: Cluster) -> str:
    return "ada@login1:" if cluster.remote else ""


def test_own_result_is_read(cluster: Cluster, tmp_path: Path) -> None:
    jobdir = tmp_path / ".clusterjob" / "functions" / "tokA"
    run_worker(jobdir, [((7, 2), {})])
    assert outcome(cluster, jobdir) == 49
    assert (jobdir / "result-0.pkl").stat().st_mode & 0o777 == 0o600


def test_another_jobs_result_is_refused_unread(cluster: Cluster, tmp_path: Path) -> None:
    functions = tmp_path / ".clusterjob" / "functions"
    run_worker(functions / "tokA", [((7, 2), {})])
    run_worker(functions / "tokB", [((3, 2), {})])
    shutil.copy(functions / "tokA" / "result-0.pkl", functions / "tokB" / "result-0.pkl")
    failed = outcome(cluster, functions / "tokB")
    assert isinstance(failed, JobFailed)
    assert f"refusing {functions}/tokB/result-0.pkl: not this job's result" in str(failed)
    assert "'clusterjob-result 2 tokA 0'" in str(failed) and "not unpickled" in str(failed)


def test_another_tasks_result_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    jobdir = tmp_path / ".clusterjob" / "functions" / "tokM"
    run_worker(jobdir, [((2, 2), {}), ((3, 2), {})], task=1)
    assert outcome(cluster, jobdir, task=1) == 9
    shutil.copy(jobdir / "result-1.pkl", jobdir / "result-0.pkl")
    failed = outcome(cluster, jobdir, task=0)
    assert isinstance(failed, JobFailed) and "not this job's result" in str(failed)


def test_a_result_without_the_binding_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    """A bare pickle (as an older worker, or anyone, writes it) is never unpickled."""
    jobdir = tmp_path / ".clusterjob" / "functions" / "tokA"
    jobdir.mkdir(mode=0o700, parents=True)
    marker = tmp_path / "unpickled"
    (jobdir / "result-0.pkl").write_bytes(cloudpickle.dumps(("ok", Planted(marker))))
    (jobdir / "result-0.pkl").chmod(0o600)
    failed = outcome(cluster, jobdir)
    assert isinstance(failed, JobFailed) and "not this job's result" in str(failed)
    assert not marker.exists()


@pytest.fixture(scope="module")
def other() -> Iterator[UnixUser]:
    with unix_user("cjres") as user:
        yield user


CASES = [
    ("their-clusterjob-dir", "{functions}/..: owned by uid {uid}"),
    ("their-functions-dir", "{functions}: owned by uid {uid}"),
    ("their-job-dir", "{functions}/tokA: owned by uid {uid}"),
    ("their-file", "{functions}/tokA/{name}: owned by uid {uid}"),
    ("writable-functions-dir", "{functions}: group/world-writable (mode 0777)"),
    ("writable-file", "{functions}/tokA/{name}: group/world-writable (mode 0666)"),
    ("symlinked-job-dir", "{functions}/tokA: "),
]


def shared_tree(other: UnixUser, case: str, name: str, content: bytes) -> tuple[Path, Path]:
    """A shared work dir whose `.clusterjob/functions` another user made (or can write), with
    ``tokA/name`` in it: (the job dir, the functions dir)."""
    shared = Path(other.home) / "shared"
    shutil.rmtree(shared, ignore_errors=True)
    functions = shared / ".clusterjob" / "functions"
    jobdir = functions / "tokA"
    jobdir.mkdir(mode=0o700, parents=True)
    shared.chmod(0o755)
    for d in (shared / ".clusterjob", functions, jobdir):
        d.chmod(0o700)
    planted = jobdir / name
    planted.write_bytes(content)
    planted.chmod(0o600)
    theirs = {
        "their-clusterjob-dir": [shared, shared / ".clusterjob", functions],
        "their-functions-dir": [functions],
        "their-job-dir": [jobdir],
        "their-file": [planted],
    }.get(case, [])
    for path in theirs:
        os.chown(path, other.uid, other.gid)
    if case == "writable-functions-dir":
        functions.chmod(0o777)
    if case == "writable-file":
        planted.chmod(0o666)
    if case == "symlinked-job-dir":
        jobdir.rename(functions / "elsewhere")
        jobdir.symlink_to(functions / "elsewhere")
    return jobdir, functions


def refusal(template: str, functions: Path, other: UnixUser, name: str) -> str:
    expected = template.format(functions=functions, uid=other.uid, name=name)
    return expected.replace(f"{functions}/..", str(functions.parent))


@pytest.fixture
def marker(other: UnixUser) -> Path:
    """Created only if a planted pickle is unpickled."""
    path = Path(other.home) / "unpickled"
    path.unlink(missing_ok=True)
    return path


@pytest.mark.parametrize(("case", "refused"), CASES)
def test_a_result_another_user_could_have_written_is_refused_unread(
    cluster: Cluster, other: UnixUser, marker: Path, case: str, refused: str
) -> None:
    """The result there carries the right header and would run code if unpickled."""
    planted = worker.result_header("tokA", 0) + cloudpickle.dumps(("ok", Planted(marker)))
    jobdir, functions = shared_tree(other, case, "result-0.pkl", planted)
    failed = outcome(cluster, jobdir)
    assert isinstance(failed, JobFailed), failed
    expected = refusal(refused, functions, other, "result-0.pkl")
    assert f"job 7: result not read: refusing {label(cluster)}{expected}" in str(failed)
    assert not marker.exists()


@pytest.mark.parametrize(("case", "refused"), CASES)
def test_the_worker_never_unpickles_an_input_another_user_could_have_written(
    other: UnixUser, marker: Path, case: str, refused: str
) -> None:
    """The job's side: input.pkl in such a tree is not run as the job's user."""
    planted = cloudpickle.dumps((worker.PROTOCOL, Planted(marker), [((), {})]))
    jobdir, functions = shared_tree(other, case, "input.pkl", planted)
    shutil.copy(worker.__file__, Path(other.home) / "clusterjob_worker.py")
    done = subprocess.run(
        [sys.executable, str(Path(other.home) / "clusterjob_worker.py"), str(jobdir)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    expected = refusal(refused, functions, other, "input.pkl")
    assert done.stderr.startswith(f"clusterjob worker: refusing to unpickle {expected}")
    assert not marker.exists()
    assert sorted(p.name for p in jobdir.iterdir()) == ["input.pkl"]  # nothing written there
