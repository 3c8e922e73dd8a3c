"""A login node that cannot be reached is one line naming it, exit 4, whatever the cause; and
every command a message tells you to type next reaches the same cluster (``--host``).

The failures are OpenSSH's own: its messages as it prints them, and the real ``ssh`` client
against a closed loopback port, an unknown host name, and a mistyped hosts.yaml profile.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from slurm_fake import FakeSlurm

from clusterjob import resources
from clusterjob.api.remote import host_profile
from clusterjob.errors import ExitCode, SshError, exit_code
from clusterjob.jobs.logs import output_path
from clusterjob.jobs.registry import Registry
from clusterjob.jobs.submit import Submitted, submit
from clusterjob.jobscript.render import render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site.loader import load_site
from clusterjob.slurm import ssh
from clusterjob.slurm.commands import SlurmClient
from clusterjob.slurm.runner import Runner, SlurmResult, SshTransport, is_transient

TRAIN = str(Path(__file__).resolve().parents[1] / "examples" / "train.py")
HOSTS = "hosts:\n  hpc:\n    host: 127.0.0.1\n    port: 1\n"


@pytest.fixture(autouse=True)
def _runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="cj-"))  # short: a socket path has at most 107 bytes
    monkeypatch.setenv(ssh.RUNTIME_DIR_ENV, str(base / "rt"))
    monkeypatch.delenv(ssh.SSH_CONFIG_ENV, raising=False)
    yield base
    shutil.rmtree(base)


# OpenSSH's words, as it prints them (ssh exits 255)
UNREACHABLE = [
    ("ssh: connect to host login1 port 22: Connection refused\r\n", "connection refused"),
    ("ssh: Could not resolve hostname login1: Name or service not known\r\n", "unknown host"),
    ("ssh: Could not resolve hostname login1: Temporary failure in name resolution\r\n",
     "unknown host"),
    ("ada@login1: Permission denied (publickey).\r\n", "authentication failed"),
    ("ada@login1: Permission denied (publickey,gssapi-keyex,gssapi-with-mic).\r\n",
     "authentication failed"),
    ("Received disconnect from 10.0.0.1 port 22:2: Too many authentication failures\r\n"
     "Disconnected from 10.0.0.1 port 22\r\n", "authentication failed"),
    ("Host key verification failed.\r\n", "host key verification failed"),
]  # fmt: skip


@pytest.mark.parametrize(("stderr", "words"), UNREACHABLE)
def test_a_login_node_out_of_reach_is_one_line_naming_it_and_exit_4(
    stderr: str, words: str
) -> None:
    target = ssh.parse_target("ada@login1")
    with pytest.raises(SshError) as info:
        ssh.ssh_failure(target, 255, stderr)
    message = str(info.value)
    assert message.startswith(f"ssh ada@login1: {words}")
    assert len(message.splitlines()) == 1
    assert exit_code(info.value) == ExitCode.SLURM_UNAVAILABLE


@pytest.mark.parametrize(
    "stderr",
    [
        "ssh: connect to host login1 port 22: Connection timed out\r\n",
        "Connection to login1 closed by remote host.\r\n",
        "client_loop: send disconnect: Broken pipe\r\n",
    ],
)
def test_a_connection_that_timed_out_or_was_lost_is_tried_again(stderr: str) -> None:
    lost = ssh.ssh_failure(ssh.parse_target("login1"), 255, stderr)
    assert lost is not None and is_transient(lost) and "(login1)" in lost


def _cli(
    tmp_path: Path, runtime: Path, *args: str, hosts: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`clusterjob ARGS` as its own process, with this test's config, data and no Slurm."""
    config = tmp_path / "config"
    (config / "clusterjob").mkdir(parents=True, exist_ok=True)
    if hosts is not None:
        (config / "clusterjob" / "hosts.yaml").write_text(hosts)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CLUSTERJOB_"))}
    env.update(
        XDG_CONFIG_HOME=str(config),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        CLUSTERJOB_DATA_DIR=str(tmp_path / "data"),
        CLUSTERJOB_RUNTIME_DIR=str(runtime / "rt"),
        CLUSTERJOB_SLURM_DEADLINE="20",  # a transient failure would be retried this long
    )
    return subprocess.run(
        [sys.executable, "-m", "clusterjob", *args],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


needs_ssh = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh client")


@needs_ssh
@pytest.mark.parametrize(
    "command",
    [("submit", TRAIN, "--gpus", "1"), ("status",), ("status", "12"), ("cancel", "12")],
    ids=" ".join,
)
@pytest.mark.parametrize(
    ("host", "words"),
    [
        ("127.0.0.1:1", "ssh 127.0.0.1:1: connection refused"),
        ("nosuchhost.invalid", "ssh nosuchhost.invalid: unknown host name"),
        # a profile's name mistyped is taken for a host name; the message says which it meant
        ("hcp", "ssh hcp: unknown host name"),
    ],
)
def test_every_command_says_the_same_for_the_same_unreachable_host(
    tmp_path: Path, _runtime: Path, command: tuple[str, ...], host: str, words: str
) -> None:
    done = _cli(tmp_path, _runtime, "--host", host, *command, hosts=HOSTS)
    assert done.returncode == ExitCode.SLURM_UNAVAILABLE, done.stderr
    assert done.stderr.startswith(f"clusterjob: error: {words}"), done.stderr
    assert len(done.stderr.splitlines()) == 1
    if host == "hcp":
        assert done.stderr.rstrip().endswith(
            f"hcp is not a profile of {tmp_path}/config/clusterjob/hosts.yaml (did you mean "
            "hpc?); its profiles: hpc"
        )


@needs_ssh
def test_a_profile_that_points_at_a_closed_port_is_named_by_its_profile(
    tmp_path: Path, _runtime: Path
) -> None:
    done = _cli(tmp_path, _runtime, "--host", "hpc", "status", hosts=HOSTS)
    assert done.returncode == ExitCode.SLURM_UNAVAILABLE, done.stderr
    assert done.stderr == (
        "clusterjob: error: ssh hpc: connection refused (ssh: connect to host 127.0.0.1 port 1: "
        "Connection refused): no ssh server listens there; check the host and port\n"
    )


def test_a_host_that_is_no_profile_says_which_profile_is_closest(tmp_path: Path) -> None:
    config = tmp_path / "clusterjob"
    config.mkdir()
    (config / "hosts.yaml").write_text(HOSTS)
    environ = {"XDG_CONFIG_HOME": str(tmp_path)}
    assert host_profile("hpc", environ).target.note == ""
    assert host_profile("login.example.org", environ).target.note == (
        f"login.example.org is not a profile of {config}/hosts.yaml; its profiles: hpc"
    )
    assert "(did you mean hpc?)" in host_profile("hpcc", environ).target.note
    assert host_profile("hpcc", {"XDG_CONFIG_HOME": str(tmp_path / "none")}).target.note == ""


# --- the commands printed to type next --------------------------------------------------------


class RemoteSlurm(FakeSlurm):
    """The fake Slurm behind a login node: sbatch reads the script from stdin there."""

    def __call__(self, cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        if cmd[0] == "sbatch" and input is not None and "--test-only" not in cmd:
            script = Path(tempfile.mkdtemp()) / "job.sh"
            script.write_text(input)
            cmd = [*cmd, str(script)]
        return super().__call__(cmd, timeout, input)


def _remote_client(slurm: FakeSlurm, host: str) -> SlurmClient:
    transport = SshTransport(ssh.parse_target(host))
    return SlurmClient(Runner(slurm, transport=transport, sleep=slurm.sleep, clock=slurm.clock))


@pytest.mark.parametrize("host", ["hpc", "ada@login1:2222"])
def test_the_follow_up_of_a_remote_submission_names_its_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    site = load_site(resources.site_configs_dir() / "mllab.yaml")
    resolved = resolve(site, JobRequest(script=TRAIN, model="a100"))
    client = _remote_client(RemoteSlurm(), host)
    result = submit(site, resolved, render(site, resolved), client=client, workdir="/remote/w")
    assert isinstance(result, Submitted) and result.host == host
    follow = str(result).splitlines()[-1]
    assert follow == (
        f"Follow it with: clusterjob --host {host} status 100; clusterjob --host {host} logs 100 -f"
    )
    for command in follow.removeprefix("Follow it with: ").split("; "):
        assert shlex.split(command)[1:3] == ["--host", host]  # typed as printed: same host


def test_a_local_submission_prints_no_host() -> None:
    assert str(Submitted("42", "", "lab", "/d/s.sh")).splitlines()[-1] == (
        "Follow it with: clusterjob status 42; clusterjob logs 42 -f"
    )


def test_the_logs_of_a_remote_array_name_a_task_with_its_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    site = load_site(resources.site_configs_dir() / "mllab.yaml")
    resolved = resolve(site, JobRequest(script=TRAIN, model="a100", array="0-3"))
    slurm = RemoteSlurm()
    client = _remote_client(slurm, "hpc")
    submit(site, resolved, render(site, resolved), client=client, workdir="/remote/w")
    with pytest.raises(Exception, match="name one") as info:
        output_path("100", client=client, registry=Registry(host="hpc"))
    assert "clusterjob --host hpc logs 100_0 (or --task 0)" in str(info.value)
    assert "`clusterjob --host hpc status 100 --tasks` lists them" in str(info.value)
