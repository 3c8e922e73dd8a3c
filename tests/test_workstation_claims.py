"""GPU claim files in process: exclusivity, names, modes, holders, and what is not a claim.

tests/test_workstation_run.py and tests/test_security_workstation.py run the same code in
separate processes (and as other users); these reach it where a mutation test can see it.
flock belongs to an open file, so two HeldClaims in one process exclude each other as two
processes would.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import time
from pathlib import Path

import pytest

from clusterjob.errors import ClusterjobError
from clusterjob.workstation import claims
from clusterjob.workstation.claims import Claim, HeldClaims, Holder

OTHER_UID = 4242
UID = os.geteuid()
ME = pwd.getpwuid(UID).pw_name  # a holder is named by its file's owner, whatever the text says


@pytest.fixture
def lock_dir(tmp_path: Path) -> Path:
    return claims.ensure_shared_dir(tmp_path / "locks")


def test_a_claim_is_exclusive_until_released(lock_dir: Path) -> None:
    first, second = HeldClaims(), HeldClaims()
    assert claims.try_claim(lock_dir, "GPU-1", first)
    assert claims.try_claim(lock_dir, "GPU-1", first)  # already ours: still ours
    assert not claims.try_claim(lock_dir, "GPU-1", second)
    assert second.fds == {}
    assert claims.try_claim(lock_dir, "GPU-2", second)  # another GPU is free
    path = lock_dir / f"GPU-1@{UID}.claim"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert claims.is_held(path)
    first.release("GPU-1")
    first.release("GPU-1")  # twice: nothing left to release
    assert not claims.is_held(path)
    assert claims.try_claim(lock_dir, "GPU-1", second)
    second.release_all()
    assert second.fds == {} and claims.current_claims(lock_dir) == []


def test_another_users_held_claim_file_makes_the_gpu_busy(lock_dir: Path) -> None:
    theirs = claims.claim_path(lock_dir, "GPU-1", OTHER_UID)
    assert theirs.name == f"GPU-1@{OTHER_UID}.claim"
    theirs.write_text(json.dumps({"user": "bob", "pid": 7, "command": "train", "since": 0}))
    fd = os.open(theirs, os.O_RDONLY)
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)
        mine = HeldClaims()
        assert not claims.try_claim(lock_dir, "GPU-1", mine)
        assert mine.fds == {}
        holder = claims.holder_of(lock_dir, "GPU-1")
        assert holder == Holder(ME, 7, "train", 0.0)  # the file is ours; its text says bob
        [claim] = claims.current_claims(lock_dir)
        assert (claim.key, claim.path, claim.holder) == ("GPU-1", theirs, holder)
    finally:
        os.close(fd)
    assert claims.holder_of(lock_dir, "GPU-1") is None
    assert claims.try_claim(lock_dir, "GPU-1", mine)
    mine.release_all()


def test_holders_are_written_and_read_back(lock_dir: Path) -> None:
    held = HeldClaims()
    assert claims.try_claim(lock_dir, "GPU-1", held)
    claims.write_holder(held, "GPU-1", "python " + "y" * 400, pid=99)
    holder = claims.holder_of(lock_dir, "GPU-1")
    assert holder is not None
    assert (holder.pid, holder.command) == (99, ("python " + "y" * 400)[:300])
    assert time.time() - 60 < holder.since <= time.time()
    claims.write_holder(held, "GPU-1", "short")  # rewritten whole, not overlaid
    assert claims.holder_of(lock_dir, "GPU-1").command == "short"  # type: ignore[union-attr]
    assert claims.holder_of(lock_dir, "GPU-1").pid == os.getpid()  # type: ignore[union-attr]
    held.make_inheritable()
    assert all(os.get_inheritable(fd) for fd in held.fds.values())
    held.release_all()


def test_claims_are_listed_sorted_by_gpu(lock_dir: Path) -> None:
    held = HeldClaims()
    for key in ("GPU-b", "GPU-a"):
        assert claims.try_claim(lock_dir, key, held)
        claims.write_holder(held, key, f"run {key}")
    listed = claims.current_claims(lock_dir)
    assert [c.key for c in listed] == ["GPU-a", "GPU-b"]
    assert [c.holder.command for c in listed if c.holder] == ["run GPU-a", "run GPU-b"]
    held.release_all()
    assert claims.current_claims(lock_dir / "missing") == []


@pytest.mark.parametrize(
    ("text", "holder"),
    [
        ('{"user": "ana", "pid": 3, "command": "x", "since": 5}', Holder(ME, 3, "x", 5.0)),
        ('{"user": "ana", "pid": "3", "command": "x"}', Holder(ME, 3, "x", 0.0)),
        ('{"user": "ana", "pid": 3, "command": "x", "since": null}', Holder(ME, 3, "x", 0.0)),
        ('{"pid": 3, "command": "x", "since": 1e300}', Holder(ME, 3, "x", 0.0)),
        ('{"pid": 3, "command": "x", "since": -5}', Holder(ME, 3, "x", 0.0)),
        ('{"user": "ana", "command": "x"}', Holder(ME, None, "", 0.0)),
        ('{"user": "ana", "pid": "three", "command": "x"}', Holder(ME, None, "", 0.0)),
        ('{"user": "ana", "pid": 3, "command": "x", "since": "soon"}', Holder(ME, None, "", 0.0)),
        ('"text"', Holder(ME, None, "", 0.0)),
        ("[1, 2]", Holder(ME, None, "", 0.0)),
        ("", Holder(ME, None, "", 0.0)),
        ("not json", Holder(ME, None, "", 0.0)),
    ],
)
def test_read_holder(tmp_path: Path, text: str, holder: Holder) -> None:
    """The owner is always known; the rest comes from the text when it reads as a holder."""
    path = tmp_path / "GPU-1@0.claim"
    path.write_text(text)
    assert claims.read_holder(path) == holder


def test_what_is_not_a_regular_file_has_no_holder_and_is_not_held(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.claim")
    (tmp_path / "dir.claim").mkdir()
    (tmp_path / "link.claim").symlink_to(tmp_path / "dir.claim")
    for name in ("fifo.claim", "dir.claim", "link.claim", "missing.claim"):
        assert claims.read_holder(tmp_path / name) is None
        assert not claims.is_held(tmp_path / name)


def test_holder_text() -> None:
    assert str(Holder("ana", 3, "python t.py", 0)) == "ana (pid 3, since ?: python t.py)"
    since = time.mktime((2026, 1, 2, 13, 45, 0, 0, 0, -1))
    assert str(Holder("ana", 3, "x", since)) == "ana (pid 3, since 13:45: x)"
    assert "\x1b" not in str(Holder("ana\x1b[2J", 3, "x\x1b]0;", 0))
    assert str(Holder("ana", None, "", 0)) == "ana"  # text unreadable: only the owner
    assert (Holder("ana", 3, "x", 0).brief(), Holder("ana", None, "", 0).brief()) == (
        "ana pid 3",
        "ana",
    )
    claim = Claim("GPU-1", Path("/l/GPU-1@0.claim"), None)
    assert claim.holder_text() == "another clusterjob run (holder unknown)"
    assert Claim("GPU-1", claim.path, Holder("a", 1, "c", 0)).holder_text() == str(
        Holder("a", 1, "c", 0)
    )


def test_a_file_under_our_name_that_is_not_ours_alone_is_left_alone(lock_dir: Path) -> None:
    """A hard link to someone's file, or a file another user owns, planted under our claim
    name: we claim through a fresh file of our own and never truncate theirs."""
    victim = lock_dir.parent / "victim.txt"
    victim.write_text("precious\n")
    os.link(victim, claims.claim_path(lock_dir, "GPU-1"))
    owned = claims.claim_path(lock_dir, "GPU-2")
    owned.write_text("theirs\n")
    os.chown(owned, OTHER_UID, -1)
    held = HeldClaims()
    for key in ("GPU-1", "GPU-2"):
        assert claims.try_claim(lock_dir, key, held)
        claims.write_holder(held, key, "python t.py")
        assert claims.holder_of(lock_dir, key).command == "python t.py"  # type: ignore[union-attr]
    assert victim.read_text() == "precious\n" and owned.read_text() == "theirs\n"
    fresh = sorted(p.name for p in lock_dir.iterdir() if p.name.count("-") == 2)
    assert len(fresh) == 2 and all(n.endswith(".claim") for n in fresh), fresh
    assert all(n.startswith((f"GPU-1@{UID}-", f"GPU-2@{UID}-")) for n in fresh)
    for name in fresh:
        assert stat.S_IMODE((lock_dir / name).stat().st_mode) == 0o644
    held.release_all()


def test_foreign_files_are_named(lock_dir: Path) -> None:
    (lock_dir / f"GPU-1@{OTHER_UID}.claim").write_text("")  # root's file, another uid's name
    (lock_dir / f"GPU-2@{UID}.claim").write_text("")  # fine
    (lock_dir / f"GPU-3@{UID}-ab12.claim").write_text("")  # fine
    (lock_dir / "GPU-4.claim").write_text("")  # an old name without owner: fine
    (lock_dir / "GPU-5@0.claim").mkdir()
    (lock_dir / f"{1:012d}@{OTHER_UID}.ticket").write_text("")
    (lock_dir / f"{2:012d}.ticket").write_text("")  # fine
    os.mkfifo(lock_dir / f"{3:012d}@{UID}.ticket")
    (lock_dir / "notes.txt").mkdir()  # not claim-like: not ours to mention
    (lock_dir / ".hidden.claim").mkdir()
    assert claims.foreign_files(lock_dir) == [
        f"{1:012d}@{OTHER_UID}.ticket",
        f"{3:012d}@{UID}.ticket",
        f"GPU-1@{OTHER_UID}.claim",
        "GPU-5@0.claim",
    ]
    assert claims.foreign_files(lock_dir / "missing") == []


def test_the_lock_dir_is_made_shared_and_checked(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        made = claims.ensure_shared_dir(tmp_path / "new")
    finally:
        os.umask(old)
    assert stat.S_IMODE(made.stat().st_mode) == 0o1777
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o755)
    claims.ensure_shared_dir(ours)
    assert stat.S_IMODE(ours.stat().st_mode) == 0o1777  # ours: made shareable
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o1777)
    os.chown(theirs, OTHER_UID, -1)
    with pytest.raises(ClusterjobError) as info:
        claims.ensure_shared_dir(theirs)
    assert str(info.value) == (
        f"GPU lock dir {theirs} belongs to uid {OTHER_UID}, who could delete other users' "
        f"GPU claims in it: ask root to run 'install -d -m 1777 -o root {theirs}' (after "
        f"removing this one), or set CLUSTERJOB_LOCK_DIR to a directory of your own"
    )
    link = tmp_path / "link"
    link.symlink_to(ours)
    with pytest.raises(ClusterjobError) as info:
        claims.ensure_shared_dir(link)
    assert str(info.value) == f"GPU lock dir {link} is not a directory (a symlink or file?)"
    with pytest.raises(ClusterjobError) as info:
        claims.ensure_shared_dir(tmp_path / "no" / "such")
    assert str(info.value) == (
        f"cannot create GPU lock dir {tmp_path / 'no' / 'such'}: No such file or directory"
    )


def test_default_lock_dir_from_the_environment_then_the_machine() -> None:
    assert claims.default_lock_dir({"CLUSTERJOB_LOCK_DIR": "/x/y"}) == Path("/x/y")
    empty = claims.default_lock_dir({"CLUSTERJOB_LOCK_DIR": ""})
    assert empty == claims.default_lock_dir({})
    var_lock = Path("/var/lock")
    shared = var_lock.is_dir() and var_lock.stat().st_mode & 0o1002 == 0o1002
    if claims.SYSTEM_LOCK_DIR.is_dir() or shared:
        assert empty == claims.SYSTEM_LOCK_DIR
    else:
        assert empty == claims.FALLBACK_LOCK_DIR


def test_the_selection_lock_file(lock_dir: Path) -> None:
    path = lock_dir / claims.SELECTION_LOCK
    old = os.umask(0o077)
    try:
        fd = claims.open_shared_file(path)
    finally:
        os.umask(old)
    assert fd is not None
    os.close(fd)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666  # the next user can open it too
    path.unlink()
    path.mkdir()
    assert claims.open_shared_file(path) is None
    path.rmdir()
    os.mkfifo(path)
    assert claims.open_shared_file(path) is None
    with claims.selection_lock(lock_dir, wait=0.1):  # unusable lock file: go on without
        pass


def test_the_selection_lock_gives_up_waiting(lock_dir: Path) -> None:
    import fcntl

    fd = claims.open_shared_file(lock_dir / claims.SELECTION_LOCK)
    assert fd is not None
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        start = time.monotonic()
        with claims.selection_lock(lock_dir, wait=0.3):
            waited = time.monotonic() - start
        assert 0.25 < waited < 1.0  # it polls: gives up soon after the wait, not seconds later
        other = claims.open_shared_file(lock_dir / claims.SELECTION_LOCK)
        assert other is not None
        assert claims._flock_within(other, 0) is False
        os.close(other)
    finally:
        os.close(fd)
    free = claims.open_shared_file(lock_dir / claims.SELECTION_LOCK)
    assert free is not None and claims._flock_within(free, 0) is True
    os.close(free)


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("GPU-1@0.claim", "GPU-1"),
        ("GPU-1@0-ab12.claim", "GPU-1"),
        ("GPU-1@0@x.claim", "GPU-1"),
        ("GPU-1.claim", "GPU-1"),  # before claims had an owner in their name
        (".selection.claim", None),
        ("GPU-1@0.txt", None),
    ],
)
def test_claim_file_names_to_gpu_keys(name: str, key: str | None) -> None:
    assert claims._key_of(name) == key


def test_gpu_keys_become_safe_file_names(lock_dir: Path) -> None:
    assert claims.claim_path(lock_dir, "GPU-a/b c:0.1", 7).name == "GPU-a_b_c:0.1@7.claim"


def test_more_foreign_names(lock_dir: Path) -> None:
    (lock_dir / f"GPU-1@{OTHER_UID}-a-b.claim").write_text("")  # the owner is before the first -
    (lock_dir / f"GPU.2@{OTHER_UID}.claim").write_text("")  # a key with a dot
    (lock_dir / f"GPU.3@{UID}.claim").write_text("")  # fine
    assert claims.foreign_files(lock_dir) == [
        f"GPU-1@{OTHER_UID}-a-b.claim",
        f"GPU.2@{OTHER_UID}.claim",
    ]


def test_holder_text_that_is_not_utf8_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "GPU-1@0.claim"
    path.write_bytes(b'{"user": "x", "pid": 1, "command": "an\xffa"}')
    assert claims.read_holder(path) == Holder(ME, 1, "an\ufffda", 0.0)


def test_holder_of_names_only_that_gpus_holder(lock_dir: Path) -> None:
    held = HeldClaims()
    assert claims.try_claim(lock_dir, "GPU-2", held)
    claims.write_holder(held, "GPU-2", "python two.py")
    try:
        assert claims.holder_of(lock_dir, "GPU-1") is None
        assert claims.holder_of(lock_dir, "GPU-2").command == "python two.py"  # type: ignore[union-attr]
    finally:
        held.release_all()


def test_the_lock_dir_from_the_process_environment(
    lock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLUSTERJOB_LOCK_DIR", str(lock_dir))
    assert claims.default_lock_dir() == lock_dir
    held = HeldClaims()
    assert claims.try_claim(lock_dir, "GPU-1", held)
    try:
        assert [c.key for c in claims.current_claims()] == ["GPU-1"]
    finally:
        held.release_all()
