"""Files only their owner may read: the registry and saved job scripts hold whole command
lines (``--api-key=...`` included), so another user must not read them, not even for a moment.

New files and directories are created with owner-only modes (0600/0700), so they are private
from the first byte; an older registry or directory left readable is narrowed when it is next
opened. The process umask is never changed: it is process-wide, and a thread (the Python
API's poller) changing it would change the mode of whatever other threads create meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

__all__ = ["create_private_file", "ensure_private_dir", "narrow_to_owner", "write_private"]


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
