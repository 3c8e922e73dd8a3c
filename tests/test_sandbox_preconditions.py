"""`sandbox up` checks what it needs before it starts anything, and a failed `up` takes back
what it did: its /etc/hosts line and the daemons it started (it used to leave munged, MariaDB,
slurmdbd and slurmctld running after slurmd failed)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from trusted_tree import trusted_tmp_dir

from clusterjob.errors import ClusterjobError, UsageError
from clusterjob.sandbox import cluster, host
from clusterjob.sandbox.config import Layout


@pytest.fixture
def trusted() -> Iterator[Path]:
    yield from trusted_tmp_dir()


def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("sandbox up runs as root")


def test_a_state_dir_the_daemons_cannot_reach_is_refused_before_anything_starts(
    trusted: Path,
) -> None:
    _needs_root()
    private = trusted / "home"
    private.mkdir(mode=0o700)
    state = private / "sbx"
    with pytest.raises(UsageError) as caught:
        cluster.up(state)
    assert str(caught.value) == (
        f"sandbox state dir {state}: {private} is mode 0700, so the munge and mysql daemons "
        "and other users' jobs cannot reach it; use a directory they can (the default is "
        "/var/lib/clusterjob-sandbox)"
    )
    assert not state.exists()
    assert not host.has_hosts_entry(cluster._hosts_marker(Layout(state)))


@pytest.mark.slurm
def test_a_failed_up_stops_what_it_started_and_takes_back_its_hosts_line(
    trusted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """munged and MariaDB start for real; slurmdbd 'fails'."""
    _needs_root()
    state = trusted / "sbx"

    def slurmdbd_fails(layout: Layout, deadline: float, say: object) -> None:
        raise ClusterjobError("slurmdbd exited while starting: fatal: as this test wants")

    monkeypatch.setattr(cluster, "_ensure_slurmdbd", slurmdbd_fails)
    said: list[str] = []
    try:
        with pytest.raises(ClusterjobError, match="as this test wants"):
            cluster.up(state, say=said.append)
        layout = Layout(state)
        assert [r.name for r in host.list_pids(layout.pid_dir) if r.alive()] == []
        assert "stopping munged (this start failed)" in said
        assert "stopping mariadb (this start failed)" in said
        assert not host.has_hosts_entry(cluster._hosts_marker(layout))
        assert not (state / "ports").exists()  # its block of ports is free again
        assert str(state) not in {c.read_text().split()[0] for c in _claims()}
    finally:
        cluster.down(state)


def _claims() -> list[Path]:
    return list(cluster.PORT_CLAIMS.glob("[0-9]*"))


def test_a_state_dir_below_one_others_can_change_is_refused_before_anything_starts(
    trusted: Path,
) -> None:
    _needs_root()
    shared = trusted / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)  # as /var/tmp: the Prolog would refuse the site file below it
    state = shared / "sbx"
    with pytest.raises(UsageError) as caught:
        cluster.up(state)
    assert str(caught.value) == (
        f"sandbox state dir {state}: {shared} is mode 1777, and the Prolog trusts no site "
        "file below a directory others can change; use a directory of root's (the default "
        "is /var/lib/clusterjob-sandbox)"
    )
    assert not state.exists()


def test_a_state_dir_on_a_full_disk_is_refused_before_anything_starts(
    trusted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _needs_root()
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=100 << 20))
    state = trusted / "sbx"
    with pytest.raises(UsageError, match=r"100 MiB free on .*; the sandbox needs 512 MiB"):
        cluster.up(state)
    assert not state.exists()


def test_a_release_that_needs_cgroups_without_them_is_refused_naming_the_fix(
    tmp_path: Path,
) -> None:
    with pytest.raises(UsageError) as caught:
        cluster._check_cgroups("22.05", tmp_path)  # a directory, no file system mounted there
    assert str(caught.value) == (
        f"Slurm 22.05's slurmd needs a cgroup file system and none is mounted on {tmp_path}: "
        f"mount one (mount -t cgroup2 none {tmp_path}) or run a release that can do without "
        "(sandbox up --slurm 24.11)"
    )
    cluster._check_cgroups("24.11", tmp_path)  # told CgroupPlugin=disabled
    cluster._check_cgroups("22.05", Path("/proc"))  # a mounted file system: let slurmd judge
