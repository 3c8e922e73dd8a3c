"""Sandboxes of several Slurm releases: which release, which ports, which cgroup.conf, and
how a command is run inside a release's root. Runs without a cluster; the releases' own
recordings (tests/fixtures/slurm/<release>/) say what each slurmd -V prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterjob.errors import UsageError
from clusterjob.sandbox import cluster, config, releases
from clusterjob.sandbox.config import Ports

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
RELEASES = tuple(config.RELEASE_SUITES)


@pytest.mark.parametrize("release", RELEASES)
def test_release_of_reads_what_that_release_printed(release: str) -> None:
    printed = (FIXTURES / release / "slurmd_version.txt").read_text()
    assert config.release_of(printed) == release


def test_release_of_refuses_text_without_a_version() -> None:
    assert config.release_of("slurmd: command not found") is None


def test_the_host_release_keeps_its_ports_and_the_others_get_blocks_of_their_own() -> None:
    assert config.port_range("22.05") == range(26800, 27000, 20)  # first block as before
    assert config.port_range(None) == config.port_range("22.05")
    used: set[int] = set()
    for release in RELEASES:
        ports = {p for base in config.port_range(release) for p in Ports.from_base(base).all()}
        assert not ports & used, release
        assert max(ports) < 32768  # below the ephemeral range
        used |= ports


def test_cgroup_conf_only_from_24_05() -> None:
    assert config.cgroup_conf("22.05") is None  # 22.05 refuses CgroupPlugin=disabled
    assert config.cgroup_conf(None) is None
    for release in ("24.05", "24.11", "26.05"):
        text = config.cgroup_conf(release)
        assert text is not None and "CgroupPlugin=disabled" in text.splitlines()


def test_an_unknown_release_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(UsageError, match=r"--slurm 23\.02: .*22\.05, 24\.11, 26\.05"):
        releases.release("23.02")


def test_each_release_has_its_own_state_dir_and_suite() -> None:
    dirs = {releases.release(r).state_dir for r in RELEASES}
    assert len(dirs) == len(RELEASES)
    assert config.DEFAULT_STATE_DIR not in dirs  # the host's sandbox is never touched
    assert releases.release("24.11").suite == "trixie"
    assert releases.release("26.05").suite == "sid"


def _fake_root(tmp_path: Path) -> releases.Release:
    rel = releases.Release("24.11", "trixie", tmp_path, tmp_path / "state")
    (rel.root / "root").mkdir(parents=True)
    return rel


def test_a_command_runs_in_the_callers_directory_when_it_exists_inside(tmp_path: Path) -> None:
    rel = _fake_root(tmp_path)
    here = Path("/srv/project")
    rel.inside(here).mkdir(parents=True)
    argv = releases.chroot_argv(rel, ["sinfo", "-V"], here)
    assert argv[:2] == ["chroot", str(rel.root)]
    assert argv[-3:] == [str(here), "sinfo", "-V"]
    # elsewhere: root's home inside, never a directory of the host that is not there
    assert releases.chroot_argv(rel, ["true"], Path("/elsewhere"))[-2] == "/root"


def test_the_chroot_shell_runs_the_command_in_that_directory_with_its_arguments(
    tmp_path: Path,
) -> None:
    """The shell line of chroot_argv, run as is (without chroot): cd, then exec argv intact."""
    rel = _fake_root(tmp_path)
    argv = releases.chroot_argv(rel, ["sh", "-c", 'pwd; printf "%s|" "$@"', "x", "a b", "c"])
    shell_part = argv[2:]
    shell_part[3] = str(tmp_path)  # the directory, as seen without the chroot
    out = subprocess.run(shell_part, capture_output=True, text=True, check=True).stdout
    assert out == f"{tmp_path}\na b|c|"


def test_the_environment_inside_points_at_the_release_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rel = releases.Release("26.05", "sid", tmp_path, tmp_path / "state-26.05")
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", "/data")
    monkeypatch.setenv("CLUSTERJOB_SANDBOX_SLURM", "26.05")
    monkeypatch.setenv("SLURM_CONF", "/host/slurm.conf")
    monkeypatch.setenv("PYTHONPATH", "/host/lib")
    env = releases.inside_env(rel)
    assert env["SLURM_CONF"] == str(rel.state_dir / "slurm.conf")
    assert env["CLUSTERJOB_SITE"] == str(rel.state_dir / "site.yaml")
    assert env["CLUSTERJOB_SANDBOX_DIR"] == str(rel.state_dir)
    assert env["CLUSTERJOB_DATA_DIR"] == "/data"  # the caller's CLUSTERJOB_* come along
    assert "CLUSTERJOB_SANDBOX_SLURM" not in env  # inside, the release is the host's own
    assert "PYTHONPATH" not in env  # nothing of the host's Python
    assert env["PATH"].split(":")[0] == f"{releases.VENV}/bin"


def test_processes_are_found_by_their_root_directory(tmp_path: Path) -> None:
    """What runs chrooted into a root counts, nothing else: this test runs in /."""
    assert os.getpid() in releases.processes_in(Path("/"))
    assert releases.processes_in(tmp_path) == []


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clusterjob", "sandbox", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def test_exec_without_a_command_is_a_one_line_error() -> None:
    proc = _cli("exec", "--slurm", "24.11")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "clusterjob: error: sandbox exec: name a command, e.g. sandbox exec -- sinfo -V"
    ]


def test_an_unknown_release_on_the_command_line_is_a_one_line_error() -> None:
    proc = _cli("status", "--slurm", "21.08")
    assert proc.returncode == 2
    assert "not a release the sandbox knows (known: 22.05, 24.11, 26.05)" in proc.stderr
    assert "Traceback" not in proc.stderr


def _host_sandbox_up() -> Path:
    state = cluster.resolve_state_dir()
    if not cluster.controller_running(state):
        pytest.skip("needs the host's sandbox up (`clusterjob sandbox up`)")
    return state


@pytest.mark.slurm
def test_exec_on_the_hosts_sandbox_sets_its_client_environment_and_passes_the_status() -> None:
    state = _host_sandbox_up()
    proc = _cli("exec", "--state-dir", str(state), "--", "sh", "-c",
                'echo "$SLURM_CONF $CLUSTERJOB_SITE"; exit 3')  # fmt: skip
    assert proc.returncode == 3
    assert proc.stdout.split() == [str(state / "slurm.conf"), str(state / "site.yaml")]


@pytest.mark.slurm
def test_exec_of_a_missing_command_is_a_one_line_error() -> None:
    proc = _cli("exec", "--state-dir", str(_host_sandbox_up()), "--", "no-such-command-here")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "clusterjob: error: sandbox exec: no-such-command-here: command not found"
    ]


@pytest.mark.parametrize("named_by", ["--state-dir", "CLUSTERJOB_SANDBOX_DIR"])
def test_exec_runs_nothing_when_the_sandbox_it_names_is_not_up(
    tmp_path: Path, named_by: str
) -> None:
    """It used to run the command on the host, against whatever cluster the host has."""
    marker, state = tmp_path / "ran", tmp_path / "state"
    named = ["--state-dir", str(state)] if named_by == "--state-dir" else []
    env = {**os.environ, "CLUSTERJOB_SANDBOX_DIR": str(state)} if not named else None
    proc = _cli("exec", *named, "--", "touch", str(marker), env=env)
    assert proc.returncode == 2 and not marker.exists()
    assert proc.stderr.strip().splitlines() == [
        f"clusterjob: error: sandbox: the host's Slurm, state in {state} ({named_by}) is not "
        f"up: start it with `clusterjob sandbox up --state-dir {state}`"
    ]


def test_exec_into_a_release_that_is_not_up_says_how_to_start_it(tmp_path: Path) -> None:
    other = next(r for r in RELEASES if r != cluster.slurm_release())  # not the host's own
    env = dict(os.environ, CLUSTERJOB_SANDBOX_ROOTS=str(tmp_path))
    state = tmp_path / "s"
    proc = _cli("exec", "--slurm", other, "--state-dir", str(state), "--", "true",
                env=env)  # fmt: skip
    assert proc.returncode == 2
    suite = config.RELEASE_SUITES[other]
    assert proc.stderr.strip().splitlines() == [
        f"clusterjob: error: sandbox: Slurm {other} in the {suite} root, state in {state} "
        f"(--slurm {other}, state dir: --state-dir) is not up: start it with "
        f"`clusterjob sandbox up --slurm {other} --state-dir {state}`"
    ]


@pytest.mark.parametrize("command", [["env"], ["env", "--site-path"], ["status"]])
def test_the_state_dir_variable_means_the_same_for_every_release_and_command(
    tmp_path: Path, command: list[str]
) -> None:
    """`up --slurm R` used to ignore CLUSTERJOB_SANDBOX_DIR while `exec` honoured it."""
    other = next(r for r in RELEASES if r != cluster.slurm_release())
    state = tmp_path / "mine"
    env = dict(
        os.environ, CLUSTERJOB_SANDBOX_DIR=str(state), CLUSTERJOB_SANDBOX_ROOTS=str(tmp_path)
    )
    proc = _cli(*command, "--slurm", other, env=env)
    assert str(state) in proc.stdout, proc.stdout + proc.stderr
    assert f"clusterjob-sandbox-{other}" not in proc.stdout
    if command == ["status"]:  # the rule, said first
        assert proc.stdout.splitlines()[0] == (
            f"sandbox: Slurm {other} in the {config.RELEASE_SUITES[other]} root, state in "
            f"{state} (--slurm {other}, state dir: CLUSTERJOB_SANDBOX_DIR)"
        )
        assert proc.returncode == 1


def test_how_the_host_reaches_the_registries_is_passed_on_where_it_exists_inside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rel = _fake_root(tmp_path)
    bundle = rel.inside(Path("/etc/ssl/certs/bundle.crt"))
    bundle.parent.mkdir(parents=True)
    bundle.write_text("")
    monkeypatch.setenv("SSL_CERT_FILE", "/etc/ssl/certs/bundle.crt")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/host/only/bundle.crt")  # not inside: left out
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    env = releases.inside_env(rel)
    assert env["SSL_CERT_FILE"] == "/etc/ssl/certs/bundle.crt"
    assert "REQUESTS_CA_BUNDLE" not in env
    assert env["https_proxy"] == "http://proxy.example:3128"


def test_a_state_dir_kept_across_a_rebuilt_root_is_given_back_to_its_daemons(
    tmp_path: Path,
) -> None:
    """A rebuilt root may give mysql and munge other ids; their files in the kept state
    directory follow (MariaDB refused to start on its own data files otherwise)."""
    import pwd

    from clusterjob.sandbox.config import Layout

    layout = Layout(tmp_path / "state")
    data = layout.mariadb_dir / "ibdata1"
    data.parent.mkdir(parents=True)
    data.write_text("")
    os.chown(data, 54321, 54321)  # the ids of an earlier root (the folder already given back)
    cluster._make_dirs(layout)
    mysql = pwd.getpwnam(cluster.MYSQL_USER)
    assert (data.stat().st_uid, data.stat().st_gid) == (mysql.pw_uid, mysql.pw_gid)
    assert layout.mariadb_dir.stat().st_uid == mysql.pw_uid


@pytest.mark.skipif(os.geteuid() != 0, reason="sandbox down runs as root")
def test_down_ends_and_unmounts_when_the_roots_own_down_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen: a root whose clusterjob was installed from another checkout (no longer mounted)
    could not run its own `sandbox down`; the host's down stopped there and left the root's
    mounts. It now ends what runs inside and unmounts all the same."""
    from clusterjob.errors import ClusterjobError

    rel = _fake_root(tmp_path)
    (rel.state_dir / "pids").mkdir(parents=True)
    done: list[str] = []

    def inner_down_fails(rel_: releases.Release, argv: list[str], **_: object) -> None:
        done.append(" ".join(argv[:3]))
        raise ClusterjobError("clusterjob sandbox down failed (exit 1): ModuleNotFoundError")

    monkeypatch.setattr(releases, "is_mounted", lambda rel_: True)
    monkeypatch.setattr(releases, "run_inside", inner_down_fails)
    monkeypatch.setattr(releases, "end_processes", lambda rel_: done.append("ended") or [4242])
    monkeypatch.setattr(releases, "processes_in", lambda root: [])
    monkeypatch.setattr(releases, "unmount", lambda rel_: done.append("unmounted"))
    said: list[str] = []
    assert releases.down(rel, say=said.append) == []
    assert done == ["clusterjob sandbox down", "ended", "unmounted"]
    assert said == [
        "the trixie root's own `sandbox down` failed (clusterjob sandbox down failed (exit 1): "
        "ModuleNotFoundError); ending its processes",
        "ended 1 process(es) left in the trixie root",
    ]
