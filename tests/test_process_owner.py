"""Who runs a process on a GPU (gpu-busy names the user): the owner of /proc/PID."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from clusterjob.gpu.nvml import process_owner


def test_a_live_process_is_named_by_its_owner() -> None:
    assert process_owner(os.getpid()) == pwd.getpwuid(os.getuid()).pw_name


def test_a_gone_process_has_no_owner(tmp_path: Path) -> None:
    assert process_owner(424242, str(tmp_path)) is None


def test_an_owner_without_a_name_is_its_uid(tmp_path: Path) -> None:
    uid = next(u for u in range(54321, 64000) if not _named(u))
    (tmp_path / "77").mkdir()
    os.chown(tmp_path / "77", uid, -1)
    assert process_owner(77, str(tmp_path)) == str(uid)


def test_a_link_is_not_followed(tmp_path: Path) -> None:
    """/proc/PID is a directory; a symlink in its place names the link's owner, not its target's."""
    target = tmp_path / "target"
    target.mkdir()
    uid = next(u for u in range(54321, 64000) if not _named(u))
    os.chown(target, uid, -1)
    (tmp_path / "88").symlink_to(target)
    assert process_owner(88, str(tmp_path)) == pwd.getpwuid(os.getuid()).pw_name


def _named(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True
