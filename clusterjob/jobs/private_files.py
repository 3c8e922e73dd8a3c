"""Files only their owner may read: the registry and saved job scripts hold whole command
lines (``--api-key=...`` included), so another user must not read them, not even for a moment.

New files and directories are created with owner-only modes (0600/0700), so they are private
from the first byte; an older registry or directory left readable is narrowed when it is next
opened. The process umask is never changed: it is process-wide, and a thread (the Python
API's poller) changing it would change the mode of whatever other threads create meanwhile.

A file clusterjob unpickles (a function job's result) is read only if no one else could have
written it: it and the directories above it are the user's, none group- or world-writable,
none a symlink (``read_own_file``; ``check_own`` is the rule, also for a login node's files).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from clusterjob import envvars
from clusterjob.errors import ClusterjobError

__all__ = [
    "check_own",
    "create_private_file",
    "data_dir",
    "ensure_private_dir",
    "narrow_to_owner",
    "read_own_file",
    "write_private",
]


def data_dir() -> Path:
    """Where clusterjob keeps its registry, job scripts and status cache."""
    override = os.environ.get(envvars.DATA_DIR)
    if override:
        return Path(override)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "clusterjob"


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def create_private_file(path: Path) -> None:
    """Create ``path`` as an empty 0600 file unless it exists (an existing one is left as is)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))


def narrow_to_owner(paths: Iterable[Path]) -> None:
    """Take group and other bits off each of ``paths`` that we own (missing ones are skipped)."""
    for path in paths:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or not st.st_mode & 0o077:
            continue
        with contextlib.suppress(OSError):
            os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)


def ensure_private_dir(path: Path) -> Path:
    """``path`` as a directory only we can enter: made 0700 (parents too), narrowed if older."""
    missing = []
    for directory in (path, *path.parents):
        if directory.is_dir():
            break
        missing.append(directory)
    for directory in reversed(missing):  # outermost first, each 0700 as it is made
        try:
            directory.mkdir(0o700)
        except FileExistsError:  # made meanwhile by another process, or a file in the way
            if not directory.is_dir():
                raise
    narrow_to_owner([path])
    return path


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write ``path`` atomically, created with ``mode`` (owner bits only) before any byte."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode & 0o700)
    try:
        os.fchmod(fd, mode & 0o700)  # an old leftover of the same name had its own mode
        with os.fdopen(fd, "w", encoding="utf-8", closefd=False) as fh:
            fh.write(text)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def check_own(where: str, st_mode: int, owner: int, me: int, *, directory: bool) -> None:
    """Refuse ``where`` (its ``stat`` mode and owner) unless it is a directory (else a regular
    file) of user ``me``'s that no one else may write."""
    if directory and not stat.S_ISDIR(st_mode):
        raise ClusterjobError(f"refusing {where}: not a directory")
    if not directory and not stat.S_ISREG(st_mode):
        raise ClusterjobError(f"refusing {where}: not a regular file")
    if owner != me:
        raise ClusterjobError(f"refusing {where}: owned by uid {owner}, not by you (uid {me})")
    if st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ClusterjobError(
            f"refusing {where}: group/world-writable (mode {stat.S_IMODE(st_mode):04o})"
        )


def read_own_file(path: Path, levels: int) -> bytes | None:
    """``path``'s bytes if only this user could have written it: the file and the ``levels``
    directories above it pass ``check_own``, each checked on the descriptor then used (no
    name is looked up twice, no symlink followed below the first directory, whose own
    parent is not looked at either). None when one does not exist (yet)."""
    chain = [path.parents[i] for i in reversed(range(levels))] + [path]
    fd: int | None = None
    try:
        for step in chain:
            directory = step != path
            flags = _DIR_FLAGS if directory else _FILE_FLAGS
            if fd is None:
                flags &= ~os.O_NOFOLLOW
            try:
                new = os.open(step if fd is None else step.name, flags, dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    exc = OSError(exc.errno, "a symbolic link, or not a directory")
                raise ClusterjobError(f"refusing {step}: {exc.strerror or exc}") from None
            if fd is not None:
                os.close(fd)
            fd = new
            st = os.fstat(fd)
            check_own(str(step), st.st_mode, st.st_uid, os.geteuid(), directory=directory)
        assert fd is not None
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read()
    finally:
        if fd is not None:
            os.close(fd)
