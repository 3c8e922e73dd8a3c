"""When the API looks for a job's end (``clusterjob.api.polling``): the schedules as tables,
the marker (a function job's result file) found here and over ssh in one round trip, and a
function job settled from its marker without a single Slurm status query."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from clusterjob.api import polling
from clusterjob.api.cluster import Cluster
from clusterjob.api.polling import (
    finished_tasks,
    first_slurm_look,
    marker_interval,
    slurm_interval,
)
from clusterjob.slurm import ssh
from clusterjob.slurm.runner import LocalTransport, SlurmResult, SshTransport

REPO = Path(__file__).resolve().parents[1]
SITE = str(REPO / "tests" / "fixtures" / "slurm" / "sandbox_site.yaml")


@pytest.mark.parametrize(
    ("age", "seconds"),
    [(0, 0.2), (5, 0.2), (10, 0.2), (20, 0.4), (40, 0.8), (50, 1.0), (3600, 1.0), (1e9, 1.0)],
)
def test_the_marker_is_looked_for_often_then_backing_off_to_a_second(
    age: float, seconds: float
) -> None:
    assert marker_interval(age) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("age", "look_cpu", "seconds"),
    [(0, 0.0, 0.2), (0, 0.001, 0.2), (0, 0.004, 0.2), (0, 0.01, 0.5), (3600, 0.01, 1.0),
     (0, 0.05, 2.5), (3600, 0.1, 5.0)],
)  # fmt: skip
def test_many_job_directories_are_looked_at_less_often_not_at_more_cpu(
    age: float, look_cpu: float, seconds: float
) -> None:
    """A look that took ``look_cpu`` seconds of CPU (a thousand directories: ~10 ms) is not
    repeated before it is 2% of a core; a few directories keep the 0.2 s schedule."""
    assert marker_interval(age, look_cpu) == pytest.approx(seconds)
    assert look_cpu / marker_interval(age, look_cpu) <= polling.MARKER_CPU_SHARE + 1e-12


@pytest.mark.parametrize(
    ("age", "poll_interval", "marker", "seconds"),
    [
        # a function job: Slurm every poll_interval while young, then a tenth of its age,
        # never more than 6 x poll_interval
        (0, 10, True, 10),
        (99, 10, True, 10),
        (200, 10, True, 20),
        (450, 10, True, 45),
        (600, 10, True, 60),
        (86400, 10, True, 60),
        (86400, 0.05, True, 0.3),
        # a command job: Slurm is its only word, every poll_interval at any age
        (0, 10, False, 10),
        (86400, 10, False, 10),
        (5, 0.5, False, 0.5),
    ],
)
def test_slurm_is_asked_about_a_function_job_less_often_as_it_ages(
    age: float, poll_interval: float, marker: bool, seconds: float
) -> None:
    assert slurm_interval(age, poll_interval, marker=marker) == pytest.approx(seconds)


def test_a_function_job_never_costs_more_slurm_queries_than_the_fixed_poll() -> None:
    """Over an hour, the backed-off schedule asks Slurm at most as often as every 10 s did."""
    for poll_interval in (0.5, 10.0, 60.0):
        age, looks = 0.0, 0
        while age < 3600:
            step = slurm_interval(age, poll_interval, marker=True)
            assert poll_interval <= step <= 6 * poll_interval
            assert step >= slurm_interval(max(0.0, age - 1), poll_interval, marker=True)
            age, looks = age + step, looks + 1
        assert looks <= 3600 / poll_interval


@pytest.mark.parametrize(
    ("marker", "found_again", "seconds"),
    [(True, False, 10.0), (True, True, 0.0), (False, False, 0.0), (False, True, 0.0)],
)
def test_the_first_look_at_slurm(marker: bool, found_again: bool, seconds: float) -> None:
    """A function job just submitted is pending: its marker is watched, Slurm asked only
    after poll_interval; a command job, or any job found again by its id, at once."""
    assert first_slurm_look(marker=marker, found_again=found_again, poll_interval=10) == seconds


def test_finished_tasks_here_are_the_result_files_asked_for(tmp_path: Path) -> None:
    one, two = tmp_path / "tokA", tmp_path / "tokB"
    one.mkdir()
    two.mkdir()
    for name in ("result-0.pkl", "result-3.pkl", "result-1.pkl.123.tmp", "result-7.pkl"):
        (one / name).write_bytes(b"")
    (two / "error-0.txt").write_text("no cloudpickle\n")
    wanted = {str(one): {0, 1, 3}, str(two): {0}, str(tmp_path / "gone"): {0}}
    found = finished_tasks(LocalTransport(), wanted)
    # task 1's file is still being written (a temporary name); task 7 was not asked for
    assert found == {(str(one), 0), (str(one), 3)}


def test_finished_tasks_waits_within_and_returns_as_soon_as_one_shows(tmp_path: Path) -> None:
    naps: list[float] = []

    def sleep(seconds: float) -> None:  # the job ends during the second nap
        naps.append(seconds)
        if len(naps) == 2:
            (tmp_path / "result-0.pkl").write_bytes(b"")

    found = finished_tasks(LocalTransport(), {str(tmp_path): [0]}, within=60, sleep=sleep)
    assert found == {(str(tmp_path), 0)}
    assert naps == [polling.MARKER_FIRST] * 2
    assert finished_tasks(LocalTransport(), {str(tmp_path): [1]}, within=0, sleep=sleep) == set()
    assert len(naps) == 2  # within=0: one look, no nap


class CountingSsh(SshTransport):
    """An ssh transport whose 'login node' is this machine: each remote command runs in sh
    here, and is counted (one count is one ssh round trip)."""

    def __init__(self) -> None:
        super().__init__(ssh.parse_target("ada@login1"))
        self.round_trips: list[list[str]] = []

    def exec(self, cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        self.round_trips.append(list(cmd))
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
        return SlurmResult(tuple(cmd), done.returncode, done.stdout, done.stderr)


def test_over_ssh_every_job_is_looked_for_in_one_round_trip(tmp_path: Path) -> None:
    dirs = [tmp_path / f"tok{i}" for i in range(3)]
    for d in dirs:
        d.mkdir()
    (dirs[0] / "result-2.pkl").write_bytes(b"")
    (dirs[2] / "result-0.pkl").write_bytes(b"")
    (dirs[2] / "result-10.pkl").write_bytes(b"")
    transport = CountingSsh()
    wanted = {str(dirs[0]): [0, 1, 2], str(dirs[1]): [0], str(dirs[2]): [0, 1]}
    found = finished_tasks(transport, wanted, within=30)
    assert found == {(str(dirs[0]), 2), (str(dirs[2]), 0)}
    assert len(transport.round_trips) == 1  # found at once: the 30 s were not waited


def test_over_ssh_the_round_trip_waits_on_the_login_node(tmp_path: Path) -> None:
    """Nothing there yet: ONE round trip looks every half second until a file shows (a
    job ending meanwhile) or the time is up, instead of one round trip per look."""
    transport = CountingSsh()
    started = time.monotonic()
    assert finished_tasks(transport, {str(tmp_path): [0]}, within=1.0) == set()
    assert time.monotonic() - started >= 1.0
    assert len(transport.round_trips) == 1
    writer = subprocess.Popen(["sh", "-c", f"sleep 0.6; : > {tmp_path}/result-0.pkl"])
    try:
        found = finished_tasks(transport, {str(tmp_path): [0]}, within=30)
    finally:
        writer.wait()
    assert found == {(str(tmp_path), 0)}
    assert len(transport.round_trips) == 2


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="cj-"))  # short: an ssh control socket path
    monkeypatch.setenv(ssh.RUNTIME_DIR_ENV, str(base / "rt"))
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CLUSTERJOB_STATUS_CACHE_SECONDS", "0")
    monkeypatch.delenv("CLUSTERJOB_HOST", raising=False)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    shutil.rmtree(base)


def run_worker(jobdir: str, task: int = 0) -> None:
    """The node's part: the job's worker, as the job script starts it."""
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(task)}
    worker = [sys.executable, "-u", f"{jobdir}/clusterjob_worker.py", jobdir]
    subprocess.run(worker, env=env, capture_output=True, check=False)


def by_value(x: int) -> int:
    return 2 * x


# pickled by value, as a function defined in a script is (this module is not importable
# where the worker runs)
by_value.__module__ = "__main__"
double = by_value


def test_a_function_result_is_settled_from_its_marker_without_asking_slurm(here: Path) -> None:
    """The job not yet ended in Slurm's eyes, its result file there: result() returns the
    value, and the poller never ran a status query (squeue/sacct) to get it."""
    from slurm_fake import FakeSlurm

    slurm = FakeSlurm("sandbox")
    cluster = Cluster(SITE, host="", exec=slurm, poll_interval=3600)
    job = cluster.submit_function(double, 21)
    mapped = cluster.map(double, [1, 2, 3])
    slurm.jobs[job.id].update(state="RUNNING", reason="None")  # the array: still PENDING
    assert job.jobdir is not None and mapped[0].jobdir is not None
    run_worker(job.jobdir)
    run_worker(mapped[0].jobdir, task=2)
    assert job.result(timeout=30) == 42
    assert mapped[2].result(timeout=30) == 6
    assert (job.settled_by, mapped[2].settled_by) == ("marker", "marker")
    assert not mapped[0].done() and not mapped[1].done()  # their workers have not run
    asked = [c[0] for c in slurm.calls]
    assert asked == ["sbatch", "sbatch"], asked  # no squeue, no sacct
    assert cluster._poller.refreshes == 0


def test_a_marker_is_read_with_the_same_checks_as_before(here: Path) -> None:
    """A result file that is not this job's (another job's, copied in) is refused by the
    marker path too, unread: the future fails naming it."""
    from slurm_fake import FakeSlurm

    from clusterjob.errors import JobFailed

    slurm = FakeSlurm("sandbox")
    cluster = Cluster(SITE, host="", exec=slurm, poll_interval=3600)
    first, second = cluster.submit_function(double, 1), cluster.submit_function(double, 2)
    assert first.jobdir is not None and second.jobdir is not None
    run_worker(first.jobdir)
    first.result(timeout=30)
    shutil.copy(f"{first.jobdir}/result-0.pkl", f"{second.jobdir}/result-0.pkl")
    with pytest.raises(JobFailed, match=r"not this job's result"):
        second.result(timeout=30)
    assert second.settled_by == "marker"


def test_a_function_job_that_died_without_a_result_is_seen_through_slurm(here: Path) -> None:
    """No marker ever shows (cancelled): Slurm's state settles it, on the backed-off
    schedule (poll_interval small here)."""
    from slurm_fake import FakeSlurm

    from clusterjob.errors import JobFailed

    slurm = FakeSlurm("sandbox")
    cluster = Cluster(SITE, host="", exec=slurm, poll_interval=0.05)
    job = cluster.submit_function(double, 1)
    slurm.jobs[job.id].update(state="CANCELLED", reason="None", exit_code="0:15")
    with pytest.raises(JobFailed, match=rf"^job {job.id} ended CANCELLED"):
        job.result(timeout=30)
    assert job.settled_by == "slurm"
    assert cluster._poller.refreshes >= 1


def test_a_function_jobs_stdout_and_stderr_are_apart_in_its_directory(here: Path) -> None:
    from slurm_fake import FakeSlurm

    slurm = FakeSlurm("sandbox")
    cluster = Cluster(SITE, host="", exec=slurm, poll_interval=3600)
    job = cluster.submit_function(double, 1)
    mapped = cluster.map(double, [1, 2])
    script = Path(slurm.commands("sbatch")[0][-1]).read_text()
    assert f"#SBATCH --output={job.jobdir}/%j.out" in script
    assert f"#SBATCH --error={job.jobdir}/%j.err" in script
    script = Path(slurm.commands("sbatch")[1][-1]).read_text()
    assert f"#SBATCH --output={mapped[1].jobdir}/%A_%a.out" in script
    assert f"#SBATCH --error={mapped[1].jobdir}/%A_%a.err" in script
    assert job.stdout() is None  # not started: no file yet
    Path(f"{job.jobdir}/{job.id}.out").write_text("printed\n")
    Path(f"{job.jobdir}/{job.id}.err").write_text("Traceback ...\n")
    Path(f"{mapped[1].jobdir}/{mapped[1].id}.err").write_text("task 1\n")
    assert (job.stdout(), job.stderr()) == ("printed\n", "Traceback ...\n")
    assert mapped[1].stderr() == "task 1\n"


def test_wait_on_a_function_job_asks_slurm_soon_after_its_marker(here: Path) -> None:
    """`clusterjob wait` (Cluster.wait) with an hour between looks at Slurm: the function
    job's result file shows, so Slurm is asked again within a second, past the status cache,
    until it shows the end (without the marker: at the deadline, a minute later)."""
    import threading

    from slurm_fake import FakeSlurm

    slurm = FakeSlurm("sandbox")
    cluster = Cluster(SITE, host="", exec=slurm, poll_interval=3600)
    job = cluster.submit_function(double, 4)
    slurm.jobs[job.id].update(state="RUNNING", reason="None")
    assert job.jobdir is not None
    run_worker(job.jobdir)  # the function returned; Slurm still shows the job running
    ends = threading.Timer(0.5, lambda: slurm.jobs[job.id].update(state="COMPLETED"))
    ends.start()
    started = time.monotonic()
    try:
        result = cluster.wait([job.id], interval=3600, timeout=60)
    finally:
        ends.cancel()
    assert time.monotonic() - started < 30  # about a second; not the 60 s deadline
    assert not result.timed_out
    assert [(r.job_id, r.state, r.exit_code) for r in result.rows] == [(job.id, "COMPLETED", 0)]
    assert len(slurm.commands("squeue")) <= 8, slurm.commands("squeue")
