"""``clusterjob --host``: a real OpenSSH server (Debian's ``sshd``) on a loopback port, with
key authentication, fronts the local cluster as a login node would; clusterjob runs on the
"laptop" side from a separate working directory whose environment has no Slurm at all
(``SLURM_CONF`` names no file), so every Slurm command must go over ssh.

The server is started here with its own config, host key and client key in a temporary
directory, and stopped afterwards. Its sessions get the sandbox's ``SLURM_CONF`` and site
(``SetEnv``), and a ``PATH`` whose ``sbatch`` can be made slow once, to cut the connection
in the middle of a submission.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from clusterjob.jobs.registry import Registry
from clusterjob.sandbox import cluster as sandbox_cluster

from .conftest import Sandbox

pytestmark = pytest.mark.slurm

SSHD = Path("/usr/sbin/sshd")

# sbatch on the login node's PATH: the real one, but when the test asks (a flag file), it
# answers only after the job exists and the test has cut the connection.
SLOW_SBATCH = """#!/bin/sh
flag={dir}/slow-sbatch
if [ -e "$flag" ]; then
    rm -f "$flag"
    out=$(/usr/bin/sbatch "$@") || exit $?
    echo "$out" > {dir}/sbatch-done
    sleep 20
    echo "$out"
    exit 0
fi
exec /usr/bin/sbatch "$@"
"""


@dataclass
class Login:
    """The ssh login node in front of the sandbox, and a laptop's environment to reach it."""

    dir: Path
    port: int
    process: subprocess.Popen[bytes]
    env: dict[str, str]  # the laptop's: no Slurm, its own registry, cache and ssh config

    @property
    def host(self) -> str:
        return f"root@127.0.0.1:{self.port}"

    def connections(self) -> list[int]:
        """The server's per-connection processes (the listener's descendants)."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
        found, todo = [], [self.process.pid]
        while todo:
            for child in children.get(todo.pop(), []):
                found.append(child)
                todo.append(child)
        return found

    def drop_connections(self) -> int:
        """Kill every connection the server holds (as a network failure would end them)."""
        killed = 0
        for pid in self.connections():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        return killed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "clusterjob-test", "-f", str(path)],
        check=True,
    )
    return path.with_suffix(".pub").read_text().strip()


@pytest.fixture(scope="module")
def login(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Login]:
    if not SSHD.exists() or shutil.which("rsync") is None or shutil.which("ssh") is None:
        pytest.skip("needs Debian's openssh-server, openssh-client and rsync (scripts/test.sh)")
    d = tmp_path_factory.mktemp("login")
    host_pub = _keygen(d / "host_key")
    (d / "authorized_keys").write_text(_keygen(d / "client_key") + "\n")
    bin_dir = d / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(SLOW_SBATCH.format(dir=d))
    (bin_dir / "sbatch").chmod(0o755)
    port = _free_port()
    client_env = sandbox_cluster.client_env(sandbox.state_dir)
    path = f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    setenv = " ".join(f'"{k}={v}"' for k, v in {**client_env, "PATH": path}.items())
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\n"
        f"PidFile {d}/sshd.pid\nAuthorizedKeysFile {d}/authorized_keys\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nUsePAM no\n"
        f"StrictModes no\nLogLevel ERROR\nSetEnv {setenv}\n"
    )
    privsep = Path("/run/sshd")  # sshd refuses to start without it; removed again if made here
    made_privsep = not privsep.exists()
    privsep.mkdir(mode=0o755, exist_ok=True)
    with (d / "sshd.log").open("wb") as log:
        process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(d / "sshd_config")],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    deadline = time.monotonic() + 20
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            break
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"sshd did not start: {(d / 'sshd.log').read_text()}")
        time.sleep(0.1)
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub}\n")
    (d / "ssh_config").write_text(
        f"Host *\n  IdentityFile {d}/client_key\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {d}/known_hosts\n  StrictHostKeyChecking yes\n"
    )
    runtime = d / "rt"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CLUSTERJOB_"))}
    env.update(
        SLURM_CONF=str(d / "no-slurm-here.conf"),  # any local Slurm call fails at once
        CLUSTERJOB_SSH_CONFIG=str(d / "ssh_config"),
        CLUSTERJOB_RUNTIME_DIR=str(runtime),
        CLUSTERJOB_STATUS_CACHE_SECONDS="0",
        XDG_CACHE_HOME=str(d / "cache"),
        XDG_CONFIG_HOME=str(d / "config"),
    )
    try:
        yield Login(d, port, process, env)
    finally:
        with contextlib.suppress(OSError):
            subprocess.run(  # the laptop's shared connection, if still open
                ["ssh", "-F", str(d / "ssh_config"), "-o", f"ControlPath={runtime}/cm-%C",
                 "-p", str(port), "-O", "exit", "root@127.0.0.1"],
                capture_output=True, timeout=10, check=False,
            )  # fmt: skip
        process.terminate()
        process.wait(timeout=10)
        if made_privsep:
            with contextlib.suppress(OSError):
                privsep.rmdir()


@pytest.fixture
def laptop(login: Login, tmp_path: Path) -> Path:
    """A project directory on the laptop, with code, data and things never to send."""
    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text(
        "import os, pathlib\n"
        "print('trained on', pathlib.Path('data.txt').read_text().strip(), "
        "'in', os.getcwd(), 'job', os.environ['SLURM_JOB_ID'])\n"
    )
    (work / "data.txt").write_text("the laptop's data\n")
    (work / ".gitignore").write_text("scratch/\n")
    (work / "scratch").mkdir()
    (work / "scratch" / "big.bin").write_bytes(b"x" * 1000)
    (work / "__pycache__").mkdir()
    (work / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    return work


def cj(login: Login, cwd: Path, data: Path, *args: str, timeout: float = 180):  # type: ignore[no-untyped-def]
    """`clusterjob ARGS` on the laptop: its own process, the laptop's environment."""
    env = {**login.env, "CLUSTERJOB_DATA_DIR": str(data)}
    return subprocess.run(
        [sys.executable, "-m", "clusterjob", *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_submit_from_a_laptop_runs_the_synced_code(
    login: Login, laptop: Path, tmp_path: Path, sandbox: Sandbox
) -> None:
    data, remote = tmp_path / "data", tmp_path / "remote"
    host = ["--host", login.host, "--remote-dir", str(remote)]
    done = cj(login, laptop, data, *host, "submit", "train.py", "--json")
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)["job_id"]
    # the code arrived; .gitignore'd and cache files did not
    assert (remote / "train.py").read_text() == (laptop / "train.py").read_text()
    assert (remote / "data.txt").is_file()
    assert not (remote / "scratch").exists() and not (remote / "__pycache__").exists()
    waited = cj(login, laptop, data, *host, "wait", job, "--interval", "1")
    assert (waited.returncode, waited.stdout.strip()) == (0, f"{job} COMPLETED (exit 0)"), (
        waited.stderr
    )
    shown = cj(login, laptop, data, *host, "status", job, "--json")
    assert shown.returncode == 0, shown.stderr
    (row,) = json.loads(shown.stdout)
    assert (row["job_id"], row["state"], row["site"]) == (job, "COMPLETED", "sandbox")
    logs = cj(login, laptop, data, *host, "logs", job)
    assert logs.returncode == 0, logs.stderr
    assert f"trained on the laptop's data in {remote} job {job}" in logs.stdout
    # every command went over one shared connection, still open for the next one
    assert list(Path(login.env["CLUSTERJOB_RUNTIME_DIR"]).glob("cm-*"))
    # the registry is the laptop's, and says which host
    (record,) = Registry(data / "jobs.sqlite", host=login.host).all()
    assert (record.job_id, record.work_dir) == (job, str(remote))
    assert Registry(data / "jobs.sqlite").all() == []  # not a job of this machine
    # $CLUSTERJOB_HOST works as --host does; `last` is this host's newest job
    env_host = {**login.env, "CLUSTERJOB_HOST": login.host, "CLUSTERJOB_DATA_DIR": str(data)}
    again = subprocess.run(
        [sys.executable, "-m", "clusterjob", "status", "last", "--json"],
        env=env_host, cwd=laptop, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 0 and json.loads(again.stdout)[0]["job_id"] == job, again.stderr
    # the recorded script again, byte for byte but for its token, in the same remote dir
    redo = cj(login, laptop, data, *host, "resubmit", job, "--same-script", "--parsable")
    assert redo.returncode == 0, redo.stderr
    second = redo.stdout.strip()
    waited = cj(login, laptop, data, *host, "wait", second, "--interval", "1")
    assert waited.stdout.strip() == f"{second} COMPLETED (exit 0)", waited.stderr
    shown = cj(login, laptop, data, *host, "show", second, "--json")
    assert json.loads(shown.stdout)["resubmit_of"] == job


def test_logs_follow_and_cancel_over_ssh(login: Login, laptop: Path, tmp_path: Path) -> None:
    data, remote = tmp_path / "data", tmp_path / "remote"
    host = ["--host", login.host, "--remote-dir", str(remote)]
    started = cj(
        login, laptop, data, *host, "submit", "--parsable", "--",
        "bash", "-c", "echo started; sleep 300",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    job = started.stdout.strip()
    follow = subprocess.Popen(
        [sys.executable, "-m", "clusterjob", *host, "logs", job, "-f"],
        env={**login.env, "CLUSTERJOB_DATA_DIR": str(data)}, cwd=laptop,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert follow.stdout is not None
        assert follow.stdout.readline() == "started\n"  # followed as it is written
        cancelled = cj(login, laptop, data, *host, "cancel", job)
        assert (cancelled.returncode, cancelled.stdout) == (0, f"cancel requested for {job}\n")
        out, err = follow.communicate(timeout=60)  # -f ends once the job has ended
        assert follow.returncode == 0, err
    finally:
        if follow.poll() is None:
            follow.kill()
    waited = cj(login, laptop, data, *host, "wait", job, "--interval", "1")
    assert waited.stdout.startswith(f"{job} CANCELLED"), waited.stderr


def test_a_dropped_connection_during_submit_leaves_exactly_one_job(
    login: Login, laptop: Path, tmp_path: Path, sandbox: Sandbox
) -> None:
    data, remote = tmp_path / "data", tmp_path / "remote"
    (login.dir / "sbatch-done").unlink(missing_ok=True)
    (login.dir / "slow-sbatch").write_text("")
    submit = subprocess.Popen(
        [sys.executable, "-m", "clusterjob", "--host", login.host, "--remote-dir", str(remote),
         "submit", "train.py", "--json"],
        env={**login.env, "CLUSTERJOB_DATA_DIR": str(data)}, cwd=laptop,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (login.dir / "sbatch-done").exists():  # the job exists; sbatch has not answered
            assert submit.poll() is None, submit.communicate()
            assert time.monotonic() < deadline, "sbatch was never reached"
            time.sleep(0.1)
        created = (login.dir / "sbatch-done").read_text().strip().split(";")[0]
        assert login.drop_connections() > 0
        out, err = submit.communicate(timeout=180)
    finally:
        if submit.poll() is None:
            submit.kill()
    assert submit.returncode == 0, err
    job = json.loads(out)["job_id"]
    assert job == created  # found again by its token, not submitted twice
    (record,) = Registry(data / "jobs.sqlite", host=login.host).all()
    mine = sandbox.run("squeue", "--noheader", "--states=all", "--me", "--Format=JobID,Comment:80")
    assert [line.split()[0] for line in mine.splitlines() if record.token in line] == [job]


def test_function_jobs_through_a_host_profile(
    login: Login, laptop: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile of hosts.yaml names the login node, the key, the remote dir and the jobs'
    Python there; a Python function runs on the cluster and its result comes back."""
    from clusterjob.api.cluster import Cluster

    remote = tmp_path / "remote"
    config = Path(login.env["XDG_CONFIG_HOME"]) / "clusterjob"
    config.mkdir(parents=True, exist_ok=True)
    (config / "hosts.yaml").write_text(
        "hosts:\n  sandbox-login:\n    host: 127.0.0.1\n    user: root\n"
        f"    port: {login.port}\n    identity: {login.dir}/client_key\n"
        f"    remote_dir: {remote}\n    python: {sys.executable}\n"
    )
    for key, value in {**login.env, "CLUSTERJOB_DATA_DIR": str(tmp_path / "data")}.items():
        monkeypatch.setenv(key, value)
    for key in [k for k in os.environ if k.startswith("SLURM_") and k != "SLURM_CONF"]:
        monkeypatch.delenv(key)
    monkeypatch.delenv("CLUSTERJOB_SITE", raising=False)
    cluster = Cluster(host="sandbox-login", workdir=laptop, poll_interval=1)
    assert cluster.host == "sandbox-login"

    def where(x: int) -> tuple[int, str]:
        return x + 1, os.getcwd()

    job = cluster.submit_function(where, 41)
    assert job.result(timeout=180) == (42, str(remote))
    jobs = cluster.map(where, [1, 2, 3])
    assert [j.result(timeout=180)[0] for j in jobs] == [2, 3, 4]


def test_host_key_mismatch_and_refused_key_are_one_line(
    login: Login, laptop: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    wrong = tmp_path / "known_hosts"
    other = _keygen(tmp_path / "other_host_key")
    wrong.write_text(f"[127.0.0.1]:{login.port} {other}\n")
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host *\n  IdentityFile {login.dir}/client_key\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {wrong}\n  StrictHostKeyChecking yes\n"
    )
    runtime = Path(tempfile.mkdtemp(prefix="cj-"))  # short: a socket path has 107 bytes
    env = {
        **login.env,
        "CLUSTERJOB_SSH_CONFIG": str(config),
        "CLUSTERJOB_RUNTIME_DIR": str(runtime),
        "CLUSTERJOB_DATA_DIR": str(data),
    }
    done = subprocess.run(
        [sys.executable, "-m", "clusterjob", "--host", login.host, "cancel", "1"],
        env=env, cwd=laptop, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 4
    assert done.stderr.startswith(
        f"clusterjob: error: ssh {login.host}: host key verification failed"
    )
    assert len(done.stderr.splitlines()) == 1
    config.write_text(
        f"Host *\n  IdentityFile {tmp_path}/other_host_key\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {login.dir}/known_hosts\n  StrictHostKeyChecking yes\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "clusterjob", "--host", login.host, "cancel", "1"],
        env=env, cwd=laptop, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 4
    assert done.stderr.startswith(f"clusterjob: error: ssh {login.host}: authentication failed")
    assert len(done.stderr.splitlines()) == 1
    shutil.rmtree(runtime, ignore_errors=True)


def test_node_side_commands_refuse_host(login: Login, laptop: Path, tmp_path: Path) -> None:
    done = cj(login, laptop, tmp_path / "data", "--host", login.host, "preflight")
    assert done.returncode == 2
    assert done.stderr == (
        "clusterjob: error: --host: `preflight` runs on this machine; run it on the cluster "
        "(--host works with: cancel, logs, nodes, resubmit, shell, show, status, submit, wait)\n"
    )


def test_shell_over_ssh(login: Login, laptop: Path, tmp_path: Path, sandbox: Sandbox) -> None:
    """`shell` runs srun --pty on the login node through `ssh -t`, with the cluster's own
    site path for the preflight (here a terminal is given with script(1))."""
    data = tmp_path / "data"
    dry = cj(login, laptop, data, "--host", login.host, "shell", "--dry-run", "--", "hostname")
    assert dry.returncode == 0, dry.stderr
    site = sandbox.site_path
    assert f"CLUSTERJOB_SITE={site} srun --pty" in dry.stdout  # the path on the cluster
    if shutil.which("script") is None:
        pytest.skip("script(1) gives the session a terminal")
    line = shlex.join(
        [sys.executable, "-m", "clusterjob", "--host", login.host, "shell", "--", "echo",
         "on-the-node"]
    )  # fmt: skip
    done = subprocess.run(
        ["script", "-qec", line, "/dev/null"],
        env={**login.env, "CLUSTERJOB_DATA_DIR": str(data)}, cwd=laptop,
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "on-the-node" in done.stdout


def test_function_results_over_ssh_come_from_their_markers(
    login: Login, laptop: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over ssh, with an hour between looks at Slurm: the results still come, each read
    from its result file once one round trip (which waits on the login node) saw it; no
    squeue or sacct was run for them. stdout and stderr are read from the job's directory."""
    from clusterjob.api.cluster import Cluster
    from clusterjob.slurm.runner import SlurmResult

    for key, value in {**login.env, "CLUSTERJOB_DATA_DIR": str(tmp_path / "data")}.items():
        monkeypatch.setenv(key, value)
    for key in [k for k in os.environ if k.startswith("SLURM_") and k != "SLURM_CONF"]:
        monkeypatch.delenv(key)
    monkeypatch.delenv("CLUSTERJOB_SITE", raising=False)
    slurm: list[str] = []

    def counted(cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        slurm.append(cmd[0])
        return cluster.transport.exec(cmd, timeout, input)

    cluster = Cluster(host=login.host, workdir=laptop, remote_dir=str(tmp_path / "remote"),
                      python=sys.executable, poll_interval=3600, exec=counted)  # fmt: skip

    def shout(x: int) -> int:
        print(f"out {x}")
        print(f"err {x}", file=sys.stderr)
        return -x

    job = cluster.submit_function(shout, 7)
    jobs = cluster.map(shout, [1, 2, 3])
    assert job.result(timeout=180) == -7
    assert [j.result(timeout=180) for j in jobs] == [-1, -2, -3]
    assert {j.settled_by for j in (job, *jobs)} == {"marker"}
    assert [c for c in slurm if c in ("squeue", "sacct")] == []
    assert (job.stdout(), job.stderr()) == ("out 7\n", "err 7\n")
    assert jobs[2].stderr() == "err 3\n"
