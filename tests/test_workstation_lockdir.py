"""The shared GPU lock dir and its files, in this process: which directory every user arrives
at, what is refused in it, and what counts as foreign.

The second-user cases of test_security_workstation.py run in their own processes; here the
effective uid is switched for one call (root only), so that the checks run in this process.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from trusted_tree import trusted_tmp_dir

from clusterjob.errors import ClusterjobError
from clusterjob.workstation import claims

NOBODY = 65534

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switches the effective uid")


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A root-owned 0755 directory every user can look into (pytest's own are 0700)."""
    yield from trusted_tmp_dir()


@contextmanager
def effective_uid(uid: int) -> Iterator[None]:
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.mark.parametrize(
    ("parent_mode", "exists", "chosen"),
    [
        (0o1777, False, "system"),  # /var/lock shared and sticky (Debian, Fedora)
        (0o1775, False, "fallback"),  # sticky but not writable by others
        (0o0777, False, "fallback"),  # writable by others but not sticky
        (0o0755, False, "fallback"),
        (0o0755, True, "system"),  # made by the admin: used whatever its parent
    ],
)
def test_the_default_lock_dir_depends_only_on_the_machine(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent_mode: int,
    exists: bool,
    chosen: str,
) -> None:
    parent = tmp_path / "var-lock"
    parent.mkdir()
    parent.chmod(parent_mode)
    system = parent / "clusterjob"
    if exists:
        system.mkdir()
    fallback = tmp_path / "fallback"
    monkeypatch.setattr(claims, "SYSTEM_LOCK_DIR", system)
    monkeypatch.setattr(claims, "FALLBACK_LOCK_DIR", fallback)
    expected = system if chosen == "system" else fallback
    assert claims.default_lock_dir({}) == expected
    assert claims.default_lock_dir({claims.LOCK_DIR_ENV: ""}) == expected
    assert claims.default_lock_dir({claims.LOCK_DIR_ENV: "/x/y"}) == Path("/x/y")


def test_the_default_lock_dir_when_its_parent_is_missing_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fallback = tmp_path / "fallback"
    monkeypatch.setattr(claims, "FALLBACK_LOCK_DIR", fallback)
    monkeypatch.setattr(claims, "SYSTEM_LOCK_DIR", tmp_path / "missing" / "clusterjob")
    assert claims.default_lock_dir({}) == fallback
    (tmp_path / "file").write_text("")
    (tmp_path / "file").chmod(0o1777)
    monkeypatch.setattr(claims, "SYSTEM_LOCK_DIR", tmp_path / "file" / "clusterjob")
    assert claims.default_lock_dir({}) == fallback


@needs_root
@pytest.mark.parametrize("mode", [0o0755, 0o0777, 0o1755])
def test_a_root_dir_other_users_cannot_share_is_refused_for_them(open_dir: Path, mode: int) -> None:
    shared = open_dir / "locks"
    shared.mkdir()
    shared.chmod(mode)
    with effective_uid(NOBODY), pytest.raises(ClusterjobError) as info:
        claims.ensure_shared_dir(shared)
    assert str(info.value) == (
        f"GPU lock dir {shared} is mode {mode:04o} (owner root); other users cannot claim "
        f"GPUs in it: run 'chmod 1777 {shared}' as its owner or root"
    )
    assert stat.S_IMODE(shared.stat().st_mode) == mode


@needs_root
def test_a_shared_root_dir_is_taken_as_it_is_by_others(open_dir: Path) -> None:
    shared = open_dir / "locks"
    shared.mkdir()
    shared.chmod(0o3777)  # setgid too: not 1777 exactly, but others can share it
    with effective_uid(NOBODY):
        assert claims.ensure_shared_dir(shared) == shared
    assert stat.S_IMODE(shared.stat().st_mode) == 0o3777


def test_our_own_dir_is_made_shared(tmp_path: Path) -> None:
    made = claims.ensure_shared_dir(tmp_path / "new")
    assert stat.S_IMODE(made.stat().st_mode) == 0o1777
    (tmp_path / "old").mkdir(mode=0o700)
    assert stat.S_IMODE(claims.ensure_shared_dir(tmp_path / "old").stat().st_mode) == 0o1777


def test_a_lock_dir_that_cannot_be_made(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "locks"
    with pytest.raises(ClusterjobError) as info:
        claims.ensure_shared_dir(path)
    assert str(info.value) == f"cannot create GPU lock dir {path}: No such file or directory"


@needs_root
def test_a_lock_dir_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "locks"
    shared.mkdir(mode=0o1777)
    os.chown(shared, NOBODY, -1)
    with pytest.raises(ClusterjobError) as info:
        claims.ensure_shared_dir(shared)
    assert str(info.value).startswith(f"GPU lock dir {shared} belongs to ")
    assert "who could delete other users' GPU claims in it" in str(info.value)


@needs_root
def test_a_shared_file_of_another_user_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "select.lock"
    path.write_text("")
    path.chmod(0o644)
    os.chown(path, NOBODY, -1)
    fd = claims.open_shared_file(path)
    assert fd is not None
    os.close(fd)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    ours = tmp_path / "ours.lock"
    ours.write_text("")
    ours.chmod(0o600)
    fd = claims.open_shared_file(ours)
    assert fd is not None
    os.close(fd)
    assert stat.S_IMODE(ours.stat().st_mode) == 0o666


def test_a_shared_file_that_is_not_a_file_is_none(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.lock")
    assert claims.open_shared_file(tmp_path / "fifo.lock") is None
    (tmp_path / "dir.lock").mkdir()
    assert claims.open_shared_file(tmp_path / "dir.lock") is None


@needs_root
def test_foreign_files_after_names_that_are_not_claims(tmp_path: Path) -> None:
    (tmp_path / "0-notes.txt").write_text("")  # sorted first, not a claim: skipped
    (tmp_path / ".hidden.claim").write_text("")
    (tmp_path / "GPU-a@0.claim").mkdir()  # a directory in a claim's name
    (tmp_path / "GPU-b@1000-ab12.claim").write_text("")  # owned by root, named for uid 1000
    (tmp_path / "GPU-c@0.claim").write_text("")  # root's own: fine
    (tmp_path / "GPU-d.claim").write_text("")  # an old name without an owner: fine
    (tmp_path / "000000000001@0.ticket").write_text("")
    (tmp_path / "000000000002@7.ticket").write_text("")
    assert claims.foreign_files(tmp_path) == [
        "000000000002@7.ticket",
        "GPU-a@0.claim",
        "GPU-b@1000-ab12.claim",
    ]
    assert claims.foreign_files(tmp_path / "missing") == []
