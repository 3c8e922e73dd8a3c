"""A function job's result comes from its own marker (the result file its worker writes as its
last act), not from the next look at Slurm, on the real local cluster: with an hour between
looks at Slurm, the result still arrives (the old fixed poll delivered it only at the second
look: 10 s after submit by default), and Slurm was not asked at all. Also: a function job's
stdout and stderr apart in its directory, `wait` on a function job, and the submitit driver
of examples/from_submitit.py ported and run."""

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
from clusterjob.api.cluster import Cluster
from clusterjob.sandbox import cluster as sandbox_cluster
from clusterjob.slurm.runner import SlurmResult, subprocess_exec

from .conftest import Sandbox

pytestmark = pytest.mark.slurm

AN_HOUR = 3600.0  # between looks at Slurm: only a marker can settle a job within the test


class Recorder:
    """The real Slurm commands, each one recorded."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []
        self._lock = threading.Lock()

    def __call__(self, cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        with self._lock:
            self.commands.append(list(cmd))
        return subprocess_exec(cmd, timeout, input)

    def status_queries(self) -> list[list[str]]:
        return [c for c in self.commands if c[0] in ("squeue", "sacct", "scontrol")]


@pytest.fixture
def here(sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's shell on the login node: the sandbox's Slurm and site, a registry of its own,
    the status cache as a user has it (on), cwd a fresh directory."""
    for key, value in sandbox_cluster.client_env(sandbox.state_dir).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("CLUSTERJOB_STATUS_CACHE_SECONDS", raising=False)
    monkeypatch.delenv("CLUSTERJOB_HOST", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def test_a_function_result_arrives_from_its_marker_before_slurm_is_asked(here: Path) -> None:
    calls = Recorder()
    cluster = Cluster(poll_interval=AN_HOUR, exec=calls)

    def trivial(x: int) -> int:
        return x + 1

    job = cluster.submit_function(trivial, 41)
    assert job.result(timeout=120) == 42
    assert job.settled_by == "marker"
    assert calls.status_queries() == []  # not one squeue or sacct to get it
    # Slurm's word on how it ended is asked for only when wanted, past the status cache
    final = job.wait(timeout=120)
    assert (final.job_id, final.state, final.exit_code) == (job.id, "COMPLETED", 0)


def test_a_map_of_twenty_settles_from_markers_without_asking_slurm(here: Path) -> None:
    calls = Recorder()
    cluster = Cluster(poll_interval=AN_HOUR, exec=calls)

    def square(x: int) -> int:
        if x == 13:
            raise ValueError("unlucky")
        return x * x

    jobs = cluster.map(square, range(20))
    done, pending = concurrent.futures.wait(jobs, timeout=240)
    assert not pending
    assert [j.exception() is None for j in jobs] == [i != 13 for i in range(20)]
    assert [j.result() for j in jobs if j.exception() is None] == [
        i * i for i in range(20) if i != 13
    ]
    assert {j.settled_by for j in jobs} == {"marker"}
    assert calls.status_queries() == []
    assert cluster._poller.refreshes == 0


def test_stdout_and_stderr_of_a_function_job_are_apart_in_its_directory(here: Path) -> None:
    cluster = Cluster(poll_interval=AN_HOUR)

    def noisy() -> str:
        print("to stdout")
        print("to stderr", file=sys.stderr)
        raise KeyError("broken")

    job = cluster.submit_function(noisy)
    with pytest.raises(KeyError):
        job.result(timeout=120)
    out, err = job.stdout(), job.stderr()
    assert out is not None and err is not None
    assert "to stdout" in out and "to stderr" not in out
    assert "to stderr" in err and "to stdout" not in err
    # the traceback is in stderr by the time the result marks the end
    assert err.rstrip().endswith("KeyError: 'broken'")
    assert job.jobdir is not None
    assert sorted(p.name for p in Path(job.jobdir).glob(f"{job.id}.*")) == [
        f"{job.id}.err",
        f"{job.id}.out",
    ]


def test_wait_on_a_function_job_ends_with_it_not_at_the_next_look(here: Path) -> None:
    """`clusterjob wait ID --interval 3600`: the marker brings the look at Slurm forward.
    Without it the wait would end at its deadline (Slurm asked once more then): a trivial
    job ends within seconds, so half the deadline is a margin no load reaches."""
    cluster = Cluster(poll_interval=AN_HOUR)

    def trivial() -> int:
        return 1

    job = cluster.submit_function(trivial)
    started = time.monotonic()
    result = cluster.wait([job.id], interval=AN_HOUR, timeout=240)
    assert time.monotonic() - started < 120
    assert not result.timed_out
    assert [(r.job_id, r.state, r.exit_code) for r in result.rows] == [(job.id, "COMPLETED", 0)]
    env = {**os.environ, "PYTHONPATH": str(Path(clusterjob.__file__).resolve().parents[1])}
    mapped = cluster.map(lambda x: x, range(3))
    base = mapped[0].id.split("_")[0]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "clusterjob", "wait", base, "--interval", "3600", "--timeout",
         "240"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert time.monotonic() - started < 120
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{base} COMPLETED (exit 0)")


def test_the_submitit_driver_ported(here: Path) -> None:
    """examples/from_submitit.py as a user runs it, then its function job found again from
    another Python session by its id."""
    example = Path(clusterjob.__file__).resolve().parents[1] / "examples" / "from_submitit.py"
    done = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "command 0 hello"
    word, function_id, value = lines[1].split()
    assert (word, value) == ("function", "12") and function_id.isdigit()
    expected = [f"map {x} {x * x}" for x in range(20)]
    expected[13] = "map 13 raised unlucky 13 | ValueError: unlucky 13"
    assert lines[2:22] == expected
    assert lines[22:] == [f"again {function_id} 12"]
    later = subprocess.run(
        [sys.executable, "-c",
         f"import clusterjob; print(clusterjob.Cluster().job({function_id!r}).result())"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (later.returncode, later.stdout) == (0, "12\n"), later.stderr
