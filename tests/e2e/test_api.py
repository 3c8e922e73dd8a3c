"""The Python API (``clusterjob.Cluster``) against the real local Slurm cluster: a command
job, function jobs (a result and a raised exception come back), ``map`` as one array job
and one sbatch call, and the cost of polling many futures at once."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

import clusterjob
from clusterjob.api.cluster import Cluster, RemoteTraceback
from clusterjob.errors import JobFailed, JobTimeout, UsageError
from clusterjob.sandbox import cluster as sandbox_cluster
from clusterjob.slurm.runner import SlurmResult, subprocess_exec

from .conftest import REQUEUED_START, Sandbox

pytestmark = pytest.mark.slurm


class Recorder:
    """The real Slurm commands, each one recorded: what the API asked Slurm, and how often."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []
        self.threads: list[int] = []

    def __call__(self, cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        self.commands.append(list(cmd))
        self.threads.append(threading.get_ident())
        return subprocess_exec(cmd, timeout, input)

    def by_thread(self, ident: int, start: int = 0) -> list[list[str]]:
        pairs = list(zip(self.commands, self.threads, strict=False))[start:]
        return [c for c, t in pairs if t == ident]

    def named(self, name: str) -> list[list[str]]:
        return [c for c in self.commands if c[0] == name]


@pytest.fixture
def here(sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's shell on the login node: the sandbox's Slurm and site, a registry of its
    own, no status cache (each refresh asks Slurm), cwd a fresh directory."""
    for key, value in sandbox_cluster.client_env(sandbox.state_dir).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CLUSTERJOB_STATUS_CACHE_SECONDS", "0")
    monkeypatch.delenv("CLUSTERJOB_HOST", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def test_a_command_job_runs_and_its_output_comes_back(here: Path) -> None:
    cluster = clusterjob.Cluster(poll_interval=0.5)
    job = cluster.submit(["bash", "-c", 'echo "hello from $SLURM_JOB_ID"; echo oops >&2'])
    assert job.id.isdigit()
    final = job.wait(timeout=120)
    assert (final.state, final.exit_code) == ("COMPLETED", 0)
    assert job.result() == final  # a command job's result: its final status
    assert job.state() == "COMPLETED"
    assert f"hello from {job.id}" in job.logs()
    assert (here / f"slurm-{job.id}.out").is_file()  # submitted from the working directory
    # the registry has it, as for the CLI
    record = cluster.registry().get(job.id)
    assert record is not None and record.host == "" and record.work_dir == str(here)


def test_a_failing_command_job_raises_job_failed(here: Path) -> None:
    cluster = Cluster(poll_interval=0.5)
    job = cluster.submit(["bash", "-c", "exit 7"])
    with pytest.raises(JobFailed) as info:
        job.result(timeout=120)
    assert (info.value.state, info.value.exit_code) == ("FAILED", 7)
    assert str(info.value).startswith(f"job {job.id} ended FAILED (exit 7)")


def test_keywords_are_the_cli_options_with_the_same_errors(here: Path) -> None:
    cluster = Cluster()
    with pytest.raises(UsageError, match=r"^unknown GPU model 'B300' at site sandbox; "):
        cluster.submit(["true"], gpus=1, model="B300")
    with pytest.raises(UsageError, match=r"^unknown job option 'gpu' "):
        cluster.submit(["true"], gpu=1)
    with pytest.raises(UsageError, match=r"^--mem-per-gpu '64 G' is not a Slurm memory size"):
        cluster.submit(["true"], gpus=1, model="A100", mem_per_gpu="64 G")
    assert cluster.registry().all() == []  # nothing was submitted


def test_a_function_job_returns_its_value_and_raises_its_exception(here: Path) -> None:
    cluster = Cluster(poll_interval=0.5)
    offset = 5

    def add(a: int, b: int = 0) -> dict[str, object]:
        return {"sum": a + b + offset, "job": os.environ["SLURM_JOB_ID"]}

    def divide(a: int, b: int) -> float:
        return a / b

    ok = cluster.submit_function(add, 1, b=2)
    bad = cluster.options(job_name="divide").submit_function(divide, 1, 0)
    assert ok.result(timeout=120) == {"sum": 8, "job": ok.id}
    with pytest.raises(ZeroDivisionError) as info:
        bad.result(timeout=120)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "in divide" in cause.text  # the frame where it was raised, on the node
    assert cause.text.rstrip().endswith("ZeroDivisionError: division by zero")
    assert bad.wait(timeout=60).state == "FAILED"  # the worker exits 1 when the function raised
    assert isinstance(bad.exception(), ZeroDivisionError)
    # the job's Python is the one that pickled the function
    assert cluster.provenance(ok.id)["python"] == sys.executable


def test_map_over_20_inputs_is_one_array_job_and_one_sbatch(here: Path) -> None:
    calls = Recorder()
    cluster = Cluster(poll_interval=0.5, exec=calls)

    def square(x: int) -> int:
        return x * x

    jobs = cluster.map(square, range(20))
    assert len(calls.named("sbatch")) == 1
    base = jobs[0].id.split("_")[0]
    assert [j.id for j in jobs] == [f"{base}_{i}" for i in range(20)]
    done = list(concurrent.futures.as_completed(jobs, timeout=180))
    assert len(done) == 20
    assert [j.result() for j in jobs] == [i * i for i in range(20)]
    assert len(calls.named("sbatch")) == 1  # waiting submitted nothing more


def test_fifty_futures_cost_at_most_two_slurm_calls_per_refresh(
    here: Path, sandbox: Sandbox
) -> None:
    calls = Recorder()
    cluster = Cluster(poll_interval=1.0, exec=calls)
    # held: all fifty are still pending when polled by hand below
    held = {"sbatch_args": ["--hold"]}
    jobs = [cluster.submit(["true"], job_name=f"poll-{i}", **held) for i in range(50)]
    # one refresh of all fifty, by hand: one squeue naming them all, at most one sacct
    start = len(calls.commands)
    cluster._poller.refresh(jobs)
    mine = calls.by_thread(threading.get_ident(), start)
    assert 1 <= len(mine) <= 2, mine
    assert mine[0][0] == "squeue"
    assert len(next(w for w in mine[0] if w.startswith("--jobs=")).split(",")) == 50
    # and the poller, while the futures are waited for: never more than two per refresh
    sandbox.run("scontrol", "release", ",".join(j.id for j in jobs))
    poller = cluster._poller
    before, refreshes = len(calls.commands), poller.refreshes
    done, pending = concurrent.futures.wait(jobs, timeout=300)
    assert not pending and all(j.result().state == "COMPLETED" for j in done)
    polled = calls.commands[before:]  # the poller's: this thread only waited
    count = poller.refreshes - refreshes
    assert count >= 1
    # Every call counted, also when many of the fifty end together ahead of slurmdbd (a
    # clean-clone run once made 15 calls for 6 refreshes: a per-job scontrol call fetched the
    # exit code that squeue's exit_code column now gives in the batched call).
    assert {c[0] for c in polled} <= {"squeue", "sacct"}, polled
    assert len(polled) <= 2 * count, f"{len(polled)} Slurm calls for {count} refreshes"


def test_cancel_wait_timeout_and_the_executor(here: Path) -> None:
    cluster = Cluster(poll_interval=0.5)
    job = cluster.submit(["sleep", "300"])
    with pytest.raises(JobTimeout, match=rf"^job {job.id} still "):
        job.wait(timeout=1)
    assert job.cancel() is True
    assert job.cancelled()
    assert cluster.wait([job.id], timeout=60, interval=1).rows[0].state == "CANCELLED"
    with cluster.executor(time="0:05:00") as pool:
        assert list(pool.map(pow, [2, 3], [5, 2], timeout=180)) == [32, 9]
        assert pool.submit(divmod, 17, 5).result(timeout=120) == (3, 2)


def test_the_readme_example_runs(here: Path) -> None:
    """examples/api_tour.py, which the README shows, as a user runs it."""
    example = Path(clusterjob.__file__).resolve().parents[1] / "examples" / "api_tour.py"
    done = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith(" COMPLETED") and lines[1] == "hello from the cluster"
    assert lines[2:] == ["loss 0.9709", "losses [0.9901, 0.9709, 0.9091]"]


def test_a_checkpointable_function_is_requeued_and_resumes(here: Path, sandbox: Sandbox) -> None:
    """A callable with checkpoint() (as submitit's): warned with SIGUSR1 (here sent by hand,
    as Slurm sends it 90 s before the time limit), it returns requeue(self, ...); the job is
    requeued and the next attempt calls the saved callable, its state kept."""
    marker = here / "running"

    class Train:
        def __init__(self) -> None:
            self.attempts = 0

        def __call__(self, path: str) -> int:
            self.attempts += 1
            if self.attempts == 1:
                Path(path).write_text("first attempt")
                time.sleep(600)  # the warning comes while it runs
            return self.attempts

        def checkpoint(self, path: str) -> tuple[object, ...]:
            return clusterjob.requeue(self, path)

    cluster = Cluster(poll_interval=1)
    job = cluster.options(time="0:20:00").submit_function(Train(), str(marker))
    script = cluster.registry().get(job.id)
    assert script is not None
    assert "#SBATCH --signal=B:USR1@90" in script.script and "#SBATCH --requeue" in script.script
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline, f"job {job.id} never started: {job.state()}"
        time.sleep(0.5)
    sandbox.run("scancel", "--batch", "--signal=USR1", job.id)
    deadline = time.monotonic() + 120
    while "Restarts=1" not in sandbox.run("scontrol", "show", "job", job.id):
        assert time.monotonic() < deadline, f"job {job.id} was not requeued: {job.state()}"
        time.sleep(1)
    # Slurm makes a requeued job wait about two minutes before it is eligible again; what is
    # under test is that the next attempt resumes the saved callable, so let it start sooner.
    sandbox.run("scontrol", "update", f"JobId={job.id}", REQUEUED_START)
    assert job.result(timeout=300) == 2  # the second attempt, of the saved callable
    assert "checkpointing" in job.logs() and "resumes from its checkpoint" in job.logs()
