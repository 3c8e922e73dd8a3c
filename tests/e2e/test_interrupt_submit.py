"""Ctrl-C during `clusterjob submit` on the real cluster: never a job clusterjob does not know.

SIGINT goes to the command's whole process group, as a terminal sends it, at each point of a
submission: before sbatch, while sbatch runs (before and after the real sbatch created the
job), twice while it runs, and after sbatch answered, while the job is being recorded. An
`sbatch` first on PATH wraps the real one and waits for the test at each point (files in
tmp_path), so every point is hit exactly. Afterwards every job Slurm holds with the test's
name is in the registry, and `show` and `status` know it. Jobs are submitted held
(`--sbatch-arg=--hold`) and cancelled after.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterjob.jobs.registry import REGISTRY_FILE
from clusterjob.sandbox import cluster

from .conftest import Sandbox
from .test_faults import TINY, TRAIN, fake_sbatch, job_name, registry, slurm_jobs

__all__ = ["job_name"]  # the fixture, shared with test_faults

pytestmark = pytest.mark.slurm

# sbatch that stops at two points, each until the test lets it go on: before the real sbatch
# runs, and after it created the job but before its answer (the job id) is printed.
WAITING_SBATCH = """
touch "{d}/started"
while [ ! -e "{d}/go-sbatch" ]; do sleep 0.05; done
out=$("$REAL_SBATCH" "$@") || exit $?
echo "$out" > "{d}/created"
while [ ! -e "{d}/go-answer" ]; do sleep 0.05; done
touch "{d}/answered"
echo "$out"
"""

# squeue, asked before sbatch whether the job a --dependency names exists, waits to be
# interrupted
WAITING_SQUEUE = """#!/bin/sh
touch "{d}/squeue-started"
sleep 30
"""


def _env(sandbox: Sandbox, tmp_path: Path, path_env: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ, **cluster.client_env(sandbox.state_dir))
    env.update(CLUSTERJOB_DATA_DIR=str(tmp_path / "data"), CLUSTERJOB_STATUS_CACHE_SECONDS="0")
    return {**env, **path_env}


def _start(env: dict[str, str], cwd: Path, *args: str) -> subprocess.Popen[str]:
    """`clusterjob ARGS` in a process group of its own (a terminal's foreground job)."""
    return subprocess.Popen(
        [sys.executable, "-m", "clusterjob", *args],
        env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=_sigint_default,
    )  # fmt: skip


def _sigint_default() -> None:
    """SIGINT as a terminal's foreground job has it: a test run started in the background (a
    CI script's `&`) passes SIGINT on ignored, and Python then installs no handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def _ctrl_c(proc: subprocess.Popen[str], times: int = 1) -> None:
    for _ in range(times):
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)


def _every_job_is_known(
    sandbox: Sandbox, env: dict[str, str], cwd: Path, tmp_path: Path, name: str
) -> list[str]:
    """Each job Slurm holds with ``name`` is in the registry; `show` and `status` know it."""
    in_slurm = sorted(slurm_jobs(sandbox, name))
    run = [sys.executable, "-m", "clusterjob"]
    for job in in_slurm:
        shown = subprocess.run([*run, "show", job], env=env, cwd=cwd, capture_output=True,
                               text=True, timeout=120)  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        state = subprocess.run([*run, "status", job, "--json"], env=env, cwd=cwd,
                               capture_output=True, text=True, timeout=120)  # fmt: skip
        assert state.returncode == 0 and f'"job_id": "{job}"' in state.stdout, state.stderr
    recorded = sorted(r.job_id for r in registry(tmp_path).all())
    assert recorded == in_slurm, (recorded, in_slurm)
    return in_slurm


def _submit(
    env: dict[str, str], cwd: Path, sandbox: Sandbox, name: str, *more: str
) -> subprocess.Popen[str]:
    return _start(env, cwd, "submit", TRAIN, "--site", str(sandbox.site_path), *TINY,
                  "--job-name", name, *more)  # fmt: skip


def test_ctrl_c_before_sbatch_submits_nothing(
    sandbox: Sandbox, tmp_path: Path, job_name: str
) -> None:
    path_env, calls = fake_sbatch(tmp_path, WAITING_SBATCH.format(d=tmp_path))
    squeue = Path(path_env["PATH"].split(":", 1)[0]) / "squeue"
    squeue.write_text(WAITING_SQUEUE.format(d=tmp_path))
    squeue.chmod(0o755)
    env = _env(sandbox, tmp_path, path_env)
    (tmp_path / "go-sbatch").touch()
    (tmp_path / "go-answer").touch()
    proc = _submit(env, tmp_path, sandbox, job_name, "--dependency", "afterany:1")
    _wait_for(tmp_path / "squeue-started", proc)
    _ctrl_c(proc)
    out, err = proc.communicate(timeout=120)
    squeue.unlink()  # the real one for what follows
    assert proc.returncode == 130, err
    assert not calls.exists()  # sbatch never ran
    assert _every_job_is_known(sandbox, env, tmp_path, tmp_path, job_name) == []
    assert registry(tmp_path).pending() == []


@pytest.mark.parametrize("point", ["started", "created"])
def test_ctrl_c_while_sbatch_runs_records_the_job_and_names_it(
    sandbox: Sandbox, tmp_path: Path, job_name: str, point: str
) -> None:
    """Before and after the real sbatch created the job: clusterjob waits for sbatch's answer,
    records the job, then says which it is and how to cancel it."""
    path_env, _ = fake_sbatch(tmp_path, WAITING_SBATCH.format(d=tmp_path))
    env = _env(sandbox, tmp_path, path_env)
    if point == "created":
        (tmp_path / "go-sbatch").touch()
    proc = _submit(env, tmp_path, sandbox, job_name)
    _wait_for(tmp_path / point, proc)
    _ctrl_c(proc)
    (tmp_path / "go-sbatch").touch()
    (tmp_path / "go-answer").touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    (job,) = _every_job_is_known(sandbox, env, tmp_path, tmp_path, job_name)
    assert out == ""
    assert err.splitlines()[-1] == (
        f"clusterjob: interrupted: job {job} was submitted and is recorded; cancel it with "
        f"`clusterjob cancel {job}`"
    )


def test_a_second_ctrl_c_stops_at_once_and_status_finds_the_job(
    sandbox: Sandbox, tmp_path: Path, job_name: str
) -> None:
    """Twice after the real sbatch created the job: sbatch is killed before it answers; the
    record made before sbatch ran lets `status` and `show` find the job by its token."""
    path_env, _ = fake_sbatch(tmp_path, WAITING_SBATCH.format(d=tmp_path))
    env = _env(sandbox, tmp_path, path_env)
    (tmp_path / "go-sbatch").touch()
    proc = _submit(env, tmp_path, sandbox, job_name)
    _wait_for(tmp_path / "created", proc)
    _ctrl_c(proc, times=2)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert not (tmp_path / "answered").exists()
    (pending,) = registry(tmp_path).pending()
    assert err.splitlines()[-1] == (
        "clusterjob: interrupted while sbatch ran: the job may or may not exist; "
        f"`clusterjob status` looks for it (its comment is clusterjob:{pending.token}) and "
        "records it"
    )
    (job,) = _every_job_is_known(sandbox, env, tmp_path, tmp_path, job_name)
    assert (tmp_path / "created").read_text().split(";")[0].strip() == job


def test_ctrl_c_after_sbatch_answered_while_the_job_is_recorded(
    sandbox: Sandbox, tmp_path: Path, job_name: str
) -> None:
    """sbatch has answered and clusterjob is writing the record (held up here by a write
    lock on the registry, as another clusterjob may hold it): the job is recorded all the
    same, and named."""
    path_env, _ = fake_sbatch(tmp_path, WAITING_SBATCH.format(d=tmp_path))
    env = _env(sandbox, tmp_path, path_env)
    proc = _submit(env, tmp_path, sandbox, job_name)
    _wait_for(tmp_path / "started", proc)
    lock = sqlite3.connect(tmp_path / "data" / REGISTRY_FILE, isolation_level=None, timeout=60)
    try:
        lock.execute("BEGIN IMMEDIATE")
        (tmp_path / "go-sbatch").touch()
        (tmp_path / "go-answer").touch()
        _wait_for(tmp_path / "answered", proc)
        time.sleep(1)  # sbatch has exited; clusterjob waits for the lock to record the job
        _ctrl_c(proc)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    (job,) = _every_job_is_known(sandbox, env, tmp_path, tmp_path, job_name)
    assert err.splitlines()[-1] == (
        f"clusterjob: interrupted: job {job} was submitted and is recorded; cancel it with "
        f"`clusterjob cancel {job}`"
    )
