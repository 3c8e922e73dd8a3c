"""The Python API and the ssh transport without a cluster: host specs and profiles, how
ssh's failures are read, the command lines given to ssh and rsync, option names, and the
README's example being the file the end-to-end test runs."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterjob.api.cluster import JOB_OPTIONS, Cluster
from clusterjob.api.remote import load_profiles
from clusterjob.errors import SshError, UsageError
from clusterjob.slurm import parse, ssh
from clusterjob.slurm.commands import SlurmClient
from clusterjob.slurm.runner import Runner, SshTransport, is_transient

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="cj-"))  # short: a socket path has at most 107 bytes
    runtime = base / "rt"
    monkeypatch.setenv(ssh.RUNTIME_DIR_ENV, str(runtime))
    monkeypatch.delenv(ssh.SSH_CONFIG_ENV, raising=False)
    yield runtime
    shutil.rmtree(base)


@pytest.mark.parametrize(
    ("spec", "user", "host", "port"),
    [
        ("login1", None, "login1", None),
        ("ada@login1.hpc.example.edu", "ada", "login1.hpc.example.edu", None),
        ("ada@127.0.0.1:2222", "ada", "127.0.0.1", 2222),
        ("[::1]:22", None, "::1", 22),
    ],
)
def test_a_host_spec_is_user_host_and_port(
    spec: str, user: str | None, host: str, port: int | None
) -> None:
    target = ssh.parse_target(spec)
    assert (target.user, target.host, target.port, target.label) == (user, host, port, spec)


@pytest.mark.parametrize("spec", ["ada@", "login1:0", "login1:99999", "-oProxyCommand=x", "a b"])
def test_a_bad_host_spec_is_one_line(spec: str) -> None:
    with pytest.raises(UsageError) as info:
        ssh.parse_target(spec)
    assert str(info.value) == (
        f"--host {spec!r}: expected [USER@]HOST[:PORT] or the name of a host profile"
    )


def test_the_ssh_command_line_shares_one_connection_and_quotes_every_word(
    _runtime: Path,
) -> None:
    target = ssh.parse_target("ada@login1:2222")
    nasty = "--comment=a b; touch /tmp/x $(id)"
    argv = ssh.ssh_argv(target, ["sbatch", nasty, "it's"])
    options = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert argv[0] == "ssh"
    assert "ControlMaster=auto" in argv and f"ControlPath={_runtime}/cm-%C" in argv
    assert "BatchMode=yes" in argv  # not on a terminal: nothing may prompt
    assert (options["-p"], options["-l"]) == ("2222", "ada")
    assert argv[-3:-1] == ["--", "login1"]
    # the remote shell gets one string that splits back into exactly the words given
    assert shlex.split(argv[-1]) == ["env", "LC_ALL=C", "sbatch", nasty, "it's"]
    assert (_runtime.stat().st_mode & 0o777) == 0o700


def test_a_control_socket_directory_must_be_private_and_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv(ssh.RUNTIME_DIR_ENV, str(shared))
    with pytest.raises(UsageError, match=r"must belong to you with mode 0700"):
        ssh.control_path()
    long = tmp_path / ("d" * 90)
    monkeypatch.setenv(ssh.RUNTIME_DIR_ENV, str(long))
    with pytest.raises(UsageError, match=r"too long a directory for ssh's control socket"):
        ssh.control_path()


@pytest.mark.parametrize(
    ("stderr", "kind"),
    [
        ("@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n", "hostkey"),
        ("Host key verification failed.\n", "hostkey"),
        ("ada@login1: Permission denied (publickey).\n", "auth"),
        ("ssh: Could not resolve hostname nowhere: Name or service not known\n", "name"),
        ("Connection to login1 closed by remote host.\n", "lost"),
        ("ssh: connect to host login1 port 22: Connection timed out\n", "lost"),
        ("client_loop: send disconnect: Broken pipe\n", "lost"),
        ("mux_client_request_session: read from master failed: Broken pipe\n", "lost"),
        ("", "lost"),
        ("sbatch: error: Batch job submission failed: Invalid account\n", "own"),
    ],
)
def test_how_an_ssh_failure_is_read(stderr: str, kind: str) -> None:
    target = ssh.parse_target("ada@login1")
    if kind in ("hostkey", "auth", "name"):
        with pytest.raises(SshError) as info:
            ssh.ssh_failure(target, 255, stderr)
        assert len(str(info.value).splitlines()) == 1
        assert str(info.value).startswith("ssh ada@login1: ")
        words = {"hostkey": "host key verification failed", "auth": "authentication failed"}
        assert words.get(kind, "Could not resolve hostname") in str(info.value)
        return
    lost = ssh.ssh_failure(target, 255, stderr)
    if kind == "own":
        assert lost is None  # the command's own exit 255, its own words
        return
    assert lost is not None and is_transient(lost)
    assert ssh.ssh_failure(target, 1, stderr) is None  # not ssh's: ssh exits 255


def test_a_lost_connection_makes_sbatch_look_its_token_up_not_submit_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fake `ssh` (first on PATH) runs the remote command here; its first sbatch loses the
    connection after the job was made. The second command is the token look-up (squeue),
    which finds the job: no second sbatch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "remote.log"
    fields = ["4242", "sb", "PENDING", "0", "None", "gpu", "", "0:00", "5:00", "N/A",
              "2026-12-01T10:00:00", "N/A", "N/A", "N/A", "ada", "/remote/work",
              "/remote/work/slurm-4242.out", "/remote/work/slurm-4242.out", "clusterjob:tok1",
              "cj"]  # fmt: skip
    row = parse.DELIMITER.join(fields)
    (bin_dir / "ssh").write_text(
        "#!/bin/sh\n"
        "for last; do :; done\n"
        f'echo "$last" >> {log}\n'
        'case "$last" in\n'
        "  *sbatch*) echo 'Connection to login1 closed by remote host.' >&2; exit 255 ;;\n"
        f"  *squeue*) printf '%s\\n' {shlex.quote(row)} ;;\n"
        "esac\n"
    )
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    transport = SshTransport(ssh.parse_target("ada@login1"))
    client = SlurmClient(Runner(transport=transport, sleep=lambda s: None))
    found = client.sbatch(
        "/here/job.sh", token="tok1", workdir="/remote/work", script="#!/bin/sh\n"
    )
    assert found.job_id == "4242"
    ran = [shlex.split(line)[2] for line in log.read_text().splitlines()]
    assert ran == ["sbatch", "squeue"]  # looked up, not submitted again
    first = shlex.split(log.read_text().splitlines()[0])
    # the script goes by stdin: the file is on this machine, not on the login node
    assert first == ["env", "LC_ALL=C", "sbatch", "--parsable", "--chdir=/remote/work"]


def test_rsync_goes_through_the_same_connection(_runtime: Path, tmp_path: Path) -> None:
    target = ssh.parse_target("ada@login1:2222")
    argv = ssh.rsync_argv(target, tmp_path, "/home/ada/work", ["data/"])
    assert argv[0] == "rsync" and "--filter=:- .gitignore" in argv
    e = shlex.split(argv[argv.index("-e") + 1])
    assert e[0] == "ssh" and f"ControlPath={_runtime}/cm-%C" in e and "2222" in e
    assert "--exclude=.git/" in argv and "--exclude=data/" in argv
    assert "--exclude=.clusterjob/" in argv  # function jobs' files there are never touched
    assert "--delete" not in argv
    assert argv[-2:] == [f"{tmp_path}/", "ada@login1:/home/ada/work/"]


def test_host_profiles(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    assert load_profiles(path) == {}
    path.write_text(
        "hosts:\n  hpc:\n    host: login.hpc.example.edu\n    user: ada\n    port: 2222\n"
        "    identity: ~/.ssh/id_ed25519\n    remote_dir: ~/work/p\n    sync: false\n"
        "    exclude: [data/]\n    python: /opt/py/bin/python\n"
    )
    (hpc,) = load_profiles(path).values()
    assert hpc.target.label == "hpc" and hpc.target.host == "login.hpc.example.edu"
    assert (hpc.target.user, hpc.target.port, hpc.target.identity) == (
        "ada", 2222, "~/.ssh/id_ed25519"
    )  # fmt: skip
    assert (hpc.remote_dir, hpc.sync, hpc.exclude, hpc.python) == (
        "~/work/p", False, ("data/",), "/opt/py/bin/python"
    )  # fmt: skip
    for body, message in (
        ("hosts:\n  hpc:\n    user: ada\n", "hosts.hpc.host: missing"),
        ("hosts:\n  hpc:\n    host: h\n    prot: 22\n", "hosts.hpc.prot: unknown key"),
        ("hosts:\n  hpc:\n    host: h\n    port: ssh\n", "hosts.hpc.port: expected a port"),
        ("hosts:\n  hpc:\n    host: h\n    sync: maybe\n", "hosts.hpc.sync: expected true"),
        ("hosts: [a]\n", "hosts: expected a mapping"),
    ):
        path.write_text(body)
        with pytest.raises(UsageError) as info:
            load_profiles(path)
        assert str(info.value).startswith(f"{path}: {message}"), str(info.value)


def test_job_options_are_the_submit_options() -> None:
    """Every keyword of Cluster.submit is an option of `clusterjob submit` (and back)."""
    from typer.main import get_command

    from clusterjob.cli import app as cli

    cli._register_commands("submit")
    command = get_command(cli.app).commands["submit"]  # type: ignore[attr-defined]
    options = {p.name for p in command.params if p.param_type_name == "option"}
    renamed = {"sbatch_arg": "sbatch_args", "launcher_arg": "launcher_args", "module": "modules"}
    cli_only = {"site", "dry_run", "test_only", "mkdir", "as_json", "parsable"}
    assert {renamed.get(o, o) for o in options} - cli_only == set(JOB_OPTIONS)
    with pytest.raises(UsageError, match=r"^unknown job option 'gpu' "):
        Cluster(host="").options(gpu=1)


def test_import_clusterjob_stays_cheap() -> None:
    """The Prolog imports the package: the API (and Slurm, YAML, Jinja2) load on first use."""
    code = "import sys, clusterjob; print(sorted(m for m in sys.modules if 'clusterjob' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['clusterjob']"
    code = "import clusterjob; print(clusterjob.Cluster.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "clusterjob.api.cluster"


def test_the_readme_python_example_is_the_one_tested() -> None:
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", readme, re.M | re.S)
    assert blocks == [(REPO / "examples" / "api_tour.py").read_text()]


def test_a_large_tree_is_synced_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from clusterjob.api import remote

    work = tmp_path / "work"
    (work / ".git").mkdir(parents=True)
    (work / ".git" / "pack").write_bytes(b"x" * 5000)  # never sent: not counted
    (work / "data").mkdir()
    (work / "data" / "big.bin").write_bytes(b"x" * 3000)
    (work / "train.py").write_text("print(1)\n")
    assert ssh.tree_size(work) == 3000 + 9
    assert ssh.tree_size(work, ["data"]) == 9
    ran: list[list[str]] = []
    monkeypatch.setattr(ssh, "run_rsync", lambda argv, target: ran.append(list(argv)))
    monkeypatch.setattr(ssh, "SIZE_WARNING_BYTES", 1000)
    profile = remote.HostProfile(ssh.parse_target("ada@login1"))
    remote.sync(profile, work, "/home/ada/work")
    assert "warning: syncing 0 MiB from" in capsys.readouterr().err
    assert len(ran) == 1 and ran[0][-1] == "ada@login1:/home/ada/work/"
    remote.sync(remote.HostProfile(profile.target, exclude=("data",)), work, "/home/ada/work")
    assert capsys.readouterr().err == ""  # under the limit once data/ is excluded


def test_a_job_found_again_by_its_id_knows_a_function_jobs_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Cluster().job(ID)`` in another process: the registry's record says a job is a
    function job, so ``result()`` is the function's value (or raises its exception), as for
    the ``Job`` that submit_function returned; a command job's is its final status."""
    from slurm_fake import FakeSlurm

    from clusterjob.jobs.status import JobStatus

    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CLUSTERJOB_STATUS_CACHE_SECONDS", "0")
    monkeypatch.chdir(tmp_path)
    site = str(REPO / "tests" / "fixtures" / "slurm" / "sandbox_site.yaml")
    slurm = FakeSlurm("sandbox")
    submitter = Cluster(site, host="", exec=slurm, poll_interval=3600)

    def triple(x: int) -> dict[str, int]:
        return {"value": 3 * x}

    def fail(x: int) -> int:
        raise KeyError(f"no {x}")

    ok = submitter.submit_function(triple, 5)
    bad = submitter.submit_function(fail, 6)
    mapped = submitter.map(triple, [1, 2])
    command = submitter.submit(["true"])
    # the node's part: each job's worker runs, as the job script starts it
    for job, task in ((ok, 0), (bad, 0), (mapped[1], 1)):
        assert job.jobdir is not None
        env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(task)}
        worker = [sys.executable, "-u", f"{job.jobdir}/clusterjob_worker.py", job.jobdir]
        subprocess.run(worker, env=env, capture_output=True, check=False)
    for job_id in (ok.id, bad.id, command.id):
        slurm.jobs[job_id].update(state="COMPLETED", reason="None")
    slurm.jobs[bad.id].update(state="FAILED", exit_code="1:0")
    base = mapped[1].id.split("_")[0]
    slurm.jobs.pop(f"{base}_[0-1]")
    slurm.jobs[mapped[1].id] = {**slurm._fields(mapped[1].id, "COMPLETED", "None"),
                                "comment": f"clusterjob:{submitter.registry().get(base).token}"}  # type: ignore[union-attr]  # fmt: skip

    later = Cluster(site, host="", exec=slurm, poll_interval=0.05)  # another process, later
    assert later.job(ok.id).result(timeout=30) == {"value": 15}
    with pytest.raises(KeyError, match="no 6"):
        later.job(bad.id).result(timeout=30)
    assert later.job(mapped[1].id).result(timeout=30) == {"value": 6}
    with pytest.raises(UsageError, match=rf"^job {base} is a map\(\).*job\('{base}_0'\)"):
        later.job(base)
    final = later.job(command.id).result(timeout=30)
    assert isinstance(final, JobStatus) and (final.job_id, final.state) == (command.id, "COMPLETED")


def test_a_job_that_will_never_start_fails_its_future(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_fake import FakeSlurm

    from clusterjob.errors import JobFailed

    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CLUSTERJOB_STATUS_CACHE_SECONDS", "0")
    monkeypatch.chdir(tmp_path)
    slurm = FakeSlurm("sandbox")
    site = str(REPO / "tests" / "fixtures" / "slurm" / "sandbox_site.yaml")
    cluster = Cluster(site, host="", exec=slurm, poll_interval=0.05)
    first = slurm.add_job(state="FAILED", reason="NonZeroExitCode")
    job = cluster.submit(["true"], dependency=f"afterok:{first}")
    slurm.jobs[job.id].update(reason="DependencyNeverSatisfied")
    with pytest.raises(JobFailed, match=rf"^job {job.id} will never start \(Dependency"):
        job.result(timeout=30)
    assert cluster.wait([job.id], interval=0.05, timeout=30).exit_code == 125
