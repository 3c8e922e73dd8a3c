"""End to end on the real local Slurm cluster: a command handed to the command server does
what the same command does in its own process. The job a served submit makes sees the
client's environment, directory, umask and limits; Ctrl-C ends a served `status --watch` as
it ends one run alone; a terminal stays a terminal. (The shapes of command lines, the
server's loading, staleness and security: tests/test_command_server.py.)
"""

from __future__ import annotations

import os
import pty
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from server_helpers import normalized, runtime_dir, served, server_pids, start

from clusterjob.sandbox import cluster

from .conftest import Cli, Sandbox
from .test_end_to_end import finished, submit, wait_status

pytestmark = pytest.mark.slurm

PROBE = """\
#!/bin/bash
# what a job inherited from the command that submitted it
{ echo "FOO=$FOO"; pwd; umask; ulimit -Sn; } > "facts-$1.txt"
"""
CLI = [sys.executable, "-m", "clusterjob"]
NOFILE = 777  # a soft limit of open files no default has


def _as_at_a_terminal() -> None:
    """Ctrl-C and Ctrl-Z as a shell at a terminal leaves them: a test run in the background of
    a non-interactive shell (CI's) inherits SIGINT and SIGQUIT ignored, and so would the
    command, which would then rightly not end on Ctrl-C, served or not."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP):
        signal.signal(sig, signal.SIG_DFL)


def _limited() -> None:
    """The submitting shell's state: a umask and a soft limit of its own."""
    os.umask(0o027)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, hard))


def _env(sandbox: Sandbox, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, **cluster.client_env(sandbox.state_dir))
    env["CLUSTERJOB_DATA_DIR"] = str(tmp_path / "data")
    env["CLUSTERJOB_STATUS_CACHE_SECONDS"] = "0"
    env["FOO"] = "seen by the job"
    return {**env, **extra}


def _served(sandbox: Sandbox, tmp_path: Path, rt: Path) -> dict[str, str]:
    """The environment of commands handed to a server in ``rt``, that server started."""
    env = _env(sandbox, tmp_path, CLUSTERJOB_SERVER="1", CLUSTERJOB_RUNTIME_DIR=str(rt))
    start(env, rt, tmp_path, CLI)
    return env


@pytest.fixture
def sleeping_job(cj: Cli, sandbox: Sandbox) -> Iterator[str]:
    """A job that runs for half a minute, for `status --watch` to watch; cancelled after."""
    job = submit(cj, sandbox, "--gpus", "1", "--model", "A100", "--", "sleep", "30")
    yield job
    cj("cancel", job)


@contextmanager
def _watching(
    job: str, env: dict[str, str], cwd: Path, interval: str, stdout: int
) -> Iterator[subprocess.Popen[str]]:
    """`status --watch` of ``job``, started as a shell starts a job at a terminal: Ctrl-C and
    Ctrl-Z as the shell leaves them (a test run in the background of a non-interactive shell,
    CI's, inherits SIGINT ignored), and a process group of its own whose parent (this test)
    is in another group of the same session (the kernel discards a stop signal sent to an
    orphaned group, CI's). Killed at the end, should the test fail before it ended."""
    with subprocess.Popen(
        [*CLI, "status", "--watch", "--interval", interval, job], env=env, cwd=cwd,
        stdout=stdout, stderr=subprocess.PIPE, text=True, preexec_fn=_as_at_a_terminal,
        process_group=0,
    ) as watch:  # fmt: skip
        try:
            yield watch
        finally:
            watch.kill()  # ended already, unless the test failed


def test_the_job_of_a_served_submit_has_what_its_client_had(
    cj: Cli, sandbox: Sandbox, tmp_path: Path
) -> None:
    (tmp_path / "probe.sh").write_text(PROBE)
    with runtime_dir() as rt:
        served_env = _served(sandbox, tmp_path, rt)
        jobs = {}
        for label, env in (("alone", _env(sandbox, tmp_path)), ("served", served_env)):
            done = subprocess.run(
                [sys.executable, "-m", "clusterjob", "submit", "--site", str(sandbox.site_path),
                 "--gpus", "1", "--model", "A100", "--", "bash", "probe.sh", label],
                env=env, cwd=tmp_path, preexec_fn=_limited, capture_output=True, text=True,
                timeout=120, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            jobs[label] = re.search(r"Submitted job (\d+)", done.stdout).group(1)  # type: ignore[union-attr]
        assert served(rt, 1) == ["submit, exit 0"]
    for job in jobs.values():
        row = wait_status(cj, job, finished)
        assert row["state"] == "COMPLETED", row
    alone = (tmp_path / "facts-alone.txt").read_text().splitlines()
    assert alone == ["FOO=seen by the job", str(tmp_path), "0027", str(NOFILE)]
    assert (tmp_path / "facts-served.txt").read_text().splitlines() == alone


def test_ctrl_c_ends_a_served_status_watch_as_it_ends_one_alone(
    sleeping_job: str, sandbox: Sandbox, tmp_path: Path
) -> None:
    with runtime_dir() as rt:
        served_env = _served(sandbox, tmp_path, rt)
        ends = []
        for env in (_env(sandbox, tmp_path), served_env):
            with _watching(sleeping_job, env, tmp_path, "0.5", subprocess.PIPE) as watch:
                time.sleep(3)
                assert watch.poll() is None, watch.communicate()
                watch.send_signal(signal.SIGINT)
                out, err = watch.communicate(timeout=30)
            ends.append((watch.returncode, normalized(err)))
            assert sleeping_job in out
        assert ends[1] == ends[0]
        assert served(rt, 1) == [f"status, exit {ends[0][0]}"]


def test_a_served_command_on_a_terminal_prints_what_it_prints_alone(
    cj: Cli, sandbox: Sandbox, tmp_path: Path
) -> None:
    job = submit(cj, sandbox, "--gpus", "1", "--model", "A100", "--", "true")
    wait_status(cj, job, finished)  # a job whose state cannot change between the two runs
    with runtime_dir() as rt:
        served_env = _served(sandbox, tmp_path, rt)
        seen = []
        for env in (_env(sandbox, tmp_path, COLUMNS="120"), dict(served_env, COLUMNS="120")):
            seen.append(
                _on_a_terminal(
                    [sys.executable, "-m", "clusterjob", "status", "--all"], env, tmp_path
                )
            )
        assert served(rt, 1) == ["status, exit 0"]
    assert seen[1] == seen[0]
    assert seen[0].strip()


def _on_a_terminal(argv: list[str], env: dict[str, str], cwd: Path) -> str:
    main, side = pty.openpty()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=side, stdout=side, stderr=side)
    os.close(side)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the terminal's last writer has gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=60)
    os.close(main)
    return normalized(b"".join(chunks).decode())


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as fh:
                    parent = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent == pid:
                found.append(int(entry))
    return found


def _until(what: str, check, timeout: float = 10) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_ctrl_z_stops_the_worker_with_its_client_and_fg_goes_on(
    sleeping_job: str, sandbox: Sandbox, tmp_path: Path
) -> None:
    with runtime_dir() as rt:
        served_env = _served(sandbox, tmp_path, rt)
        (server_pid,) = server_pids(rt)
        with _watching(sleeping_job, served_env, tmp_path, "0.3", subprocess.DEVNULL) as watch:
            _until("no worker", lambda: _children(server_pid))
            (worker,) = _children(server_pid)
            time.sleep(1)
            watch.send_signal(signal.SIGTSTP)
            _until("the client did not stop", lambda: _state(watch.pid) == "T")
            _until("the worker did not stop with it", lambda: _state(worker) == "T")
            watch.send_signal(signal.SIGCONT)
            _until("the worker did not go on", lambda: _state(worker) in "RS")
            watch.send_signal(signal.SIGINT)
            watch.communicate(timeout=30)
        assert watch.returncode == 130
