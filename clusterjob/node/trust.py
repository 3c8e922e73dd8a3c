"""Whether the root Prolog may believe a file: only if root could have been its only writer.

The Prolog's config comes only from the command line (the admin's wrapper in slurm.conf) or
the root-owned default, never from the environment, and is checked here first (like sshd's
StrictModes). Checking a path and then opening it by name can be raced (a symlink swapped in
between), so nothing here checks a name: the path is walked from ``/`` one component at a
time with ``openat``-style calls that never follow a symlink, every directory is checked on
its open descriptor before anything is looked up in it, and the file is checked with
``fstat`` on the descriptor the caller then reads. A symlink is followed by reading it inside
a directory already found trusted (only root can have put it there), and its target is walked
the same way.

Trusted means: owned by root and not writable by group or others, for the file and for every
directory up to ``/``. A world-writable sticky directory such as /tmp is refused too, as sshd
does: anyone may create names there, so a path through it is not root's alone.

The same rule judges what the hooks' interpreter imports (``node.wrappers``): each import
path entry, existing or not (``check_trusted_path``), and the package, all of it
(``check_trusted_tree``).
"""

from __future__ import annotations

import errno
import os
import stat
from collections import deque
from pathlib import Path

from clusterjob.errors import UntrustedConfig
from clusterjob.record import Record

__all__ = [
    "TrustedFile",
    "UntrustedConfig",
    "check_trusted",
    "check_trusted_path",
    "check_trusted_tree",
    "open_trusted",
    "open_trusted_append",
    "open_trusted_dir",
]

MAX_SYMLINKS = 40  # as the kernel's own limit for one path lookup
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class TrustedFile(Record):
    """An open, checked file: read it through ``fd`` (the caller closes it), never by name."""

    __slots__ = ("path", "realpath", "fd", "st")

    path: Path  # as given
    realpath: str  # the path actually walked (symlinks resolved)
    fd: int
    st: os.stat_result

    def __init__(self, path: Path, realpath: str, fd: int, st: os.stat_result) -> None:
        self._fill(path, realpath, fd, st)


def _kind(st: os.stat_result) -> str:
    return "directory" if stat.S_ISDIR(st.st_mode) else "file"


def _check(given: Path, shown: str, st: os.stat_result) -> None:
    if st.st_uid != 0:
        raise UntrustedConfig(
            f"refusing {given}: {_kind(st)} {shown} is owned by uid {st.st_uid}, not root"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedConfig(
            f"refusing {given}: {_kind(st)} {shown} is group/world-writable "
            f"(mode {stat.S_IMODE(st.st_mode):04o})"
        )


def _cannot(given: Path, exc: OSError) -> UntrustedConfig:
    return UntrustedConfig(f"{given}: cannot read: {exc.strerror or exc}")


class _Walk:
    """Open directories from ``/`` down, each checked on its descriptor before use."""

    def __init__(self, given: Path) -> None:
        self.given = given
        self.stack: list[tuple[int, str]] = []  # (fd, its path), "/" first

    def __enter__(self) -> _Walk:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd, _ in self.stack:
            os.close(fd)
        self.stack.clear()

    def _push_root(self) -> None:
        for fd, _ in self.stack:
            os.close(fd)
        self.stack.clear()
        fd = os.open("/", _DIR_FLAGS)
        self.stack.append((fd, "/"))
        _check(self.given, "/", os.fstat(fd))

    def _join(self, name: str) -> str:
        top = self.stack[-1][1]
        return f"{top.rstrip('/')}/{name}"

    def walk(self, path: str, *, last_is_dir: bool, create: bool) -> str:
        """Walk to the parent of the last component; return the last component's name.

        With ``last_is_dir`` the last component is opened as a directory too (and the name
        returned is ""). With ``create``, missing directories are made mode 0755 (whatever the
        umask) and checked like any other.
        """
        if not path.startswith("/"):
            path = os.getcwd().rstrip("/") + "/" + path
        pending = deque(path.split("/"))
        self._push_root()
        links = 0
        while pending:
            name = pending.popleft()
            if name in ("", "."):
                continue
            if name == "..":
                if len(self.stack) > 1:
                    os.close(self.stack.pop()[0])
                continue
            is_last = not any(p not in ("", ".") for p in pending)
            parent = self.stack[-1][0]
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                if not create or (is_last and not last_is_dir):
                    if is_last and not last_is_dir:
                        return name
                    raise
                os.mkdir(name, 0o755, dir_fd=parent)
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
                    os.fchmod(fd, 0o755)  # the umask may have cut (or widened) the mode
                    os.close(fd)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
                # The link sits in a directory already found trusted: only root placed it.
                target = os.readlink(name, dir_fd=parent)
                if target.startswith("/"):
                    self._push_root()
                pending.extendleft(reversed(target.split("/")))
                continue
            if is_last and not last_is_dir:
                return name
            if create and not stat.S_ISDIR(st.st_mode):
                raise OSError(errno.EEXIST, os.strerror(errno.EEXIST))  # as mkdir -p says
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
            self.stack.append((fd, self._join(name)))
            _check(self.given, self.stack[-1][1], os.fstat(fd))
        return ""

    def take_top(self) -> tuple[int, str]:
        """The innermost directory's descriptor, now the caller's to close."""
        return self.stack.pop()


def open_trusted(path: Path) -> TrustedFile:
    """Open ``path`` for reading if root could have been its only writer; else UntrustedConfig.

    The file must be a regular file; a FIFO or device is refused without blocking.
    """
    given = Path(path)
    try:
        with _Walk(given) as walk:
            name = walk.walk(str(given), last_is_dir=False, create=False)
            if not name:
                raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
            parent, parent_path = walk.stack[-1]
            fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
            shown = f"{parent_path.rstrip('/')}/{name}"
    except OSError as exc:
        raise _cannot(given, exc) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise _cannot(given, OSError(errno.EISDIR, os.strerror(errno.EISDIR)))
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedConfig(f"refusing {given}: {shown} is not a regular file")
        _check(given, shown, st)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return TrustedFile(given, shown, fd, st)


def open_trusted_dir(path: Path, *, create: bool = False) -> tuple[int, str]:
    """A descriptor on directory ``path`` (and its walked path) if only root can write it.

    With ``create``, missing directories are made 0755 and then checked as if found.
    """
    given = Path(path)
    try:
        with _Walk(given) as walk:
            walk.walk(str(given), last_is_dir=True, create=create)
            return walk.take_top()
    except OSError as exc:
        raise _cannot(given, exc) from None


def open_trusted_append(path: Path, mode: int = 0o640) -> int:
    """Open ``path`` to append (creating it and its directories) for root alone; OSError if not.

    Never blocks (a FIFO is refused), never follows a symlink, and refuses anything but a
    regular root-owned file with one link that only root may write.
    """
    given = Path(path)
    try:
        with _Walk(given) as walk:
            name = walk.walk(str(given), last_is_dir=False, create=True)
            if not name:
                raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
            parent = walk.stack[-1][0]
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
            fd = os.open(name, flags | os.O_CLOEXEC, mode, dir_fd=parent)
    except UntrustedConfig as exc:
        raise OSError(errno.EPERM, str(exc).removeprefix(f"refusing {given}: ")) from None
    st = os.fstat(fd)
    problem = ""
    if not stat.S_ISREG(st.st_mode):
        problem = "not a regular file"
    elif st.st_nlink != 1:
        problem = f"has {st.st_nlink} hard links"
    elif st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"owned by uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}"
    if problem:
        os.close(fd)
        raise OSError(errno.EPERM, f"refusing it: {problem}")
    return fd


def check_trusted(path: Path) -> None:
    """Refuse ``path`` unless root could have been the only one to write it (see module doc)."""
    os.close(open_trusted(path).fd)


def check_trusted_path(path: Path) -> None:
    """Refuse ``path`` unless only root could have written what is there, file or directory,
    or, where nothing is, the nearest directory above that is (only who may write there could
    put something in its place): the entries of an import path, some of which need not exist."""
    given = Path(path)
    walked = given
    while True:
        try:
            with _Walk(given) as walk:
                name = walk.walk(str(walked), last_is_dir=False, create=False)
                if name:
                    _check_entry(given, walk.stack[-1], name)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR) or walked == walked.parent:
                raise _cannot(given, exc) from None
            walked = walked.parent  # a missing directory: who could create it?


def _check_entry(given: Path, parent: tuple[int, str], name: str) -> None:
    """``name`` in the checked directory ``parent`` (not a symlink: the walk followed those)."""
    parent_fd, parent_path = parent
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return  # nothing there, and only root may write the directory it would be in
    shown = f"{parent_path.rstrip('/')}/{name}"
    if stat.S_ISDIR(st.st_mode):
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        try:
            _check(given, shown, os.fstat(fd))
        finally:
            os.close(fd)
    else:
        _check(given, shown, st)


def check_trusted_tree(path: Path) -> None:
    """Refuse directory ``path`` unless it and everything below it are root's alone (a Python
    package a root hook imports: a module someone else may rewrite runs as root). Each
    directory is checked on its descriptor before it is listed; a symlink's target is walked
    from ``/`` like any path (and, a directory, checked below too)."""
    given = Path(path)
    fd, walked = open_trusted_dir(given)
    try:
        _check_below(given, fd, walked, set())
    except OSError as exc:
        raise _cannot(given, exc) from None
    finally:
        os.close(fd)


def _check_below(given: Path, dir_fd: int, dir_path: str, seen: set[tuple[int, int]]) -> None:
    st = os.fstat(dir_fd)
    if (st.st_dev, st.st_ino) in seen:
        return  # a symlink loop, or a directory reached twice
    seen.add((st.st_dev, st.st_ino))
    with os.scandir(dir_fd) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        shown = f"{dir_path.rstrip('/')}/{name}"
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # gone meanwhile (only root can have removed it)
        if stat.S_ISLNK(st.st_mode):
            # Placed by root (the directory is checked); where it points is walked anew.
            if os.path.isdir(shown):
                sub_fd, sub_path = open_trusted_dir(Path(shown))
            else:
                check_trusted_path(Path(shown))
                continue
        elif stat.S_ISDIR(st.st_mode):
            sub_fd, sub_path = os.open(name, _DIR_FLAGS, dir_fd=dir_fd), shown
            try:
                _check(given, shown, os.fstat(sub_fd))
            except BaseException:
                os.close(sub_fd)
                raise
        else:
            _check(given, shown, st)
            continue
        try:
            _check_below(given, sub_fd, sub_path, seen)
        finally:
            os.close(sub_fd)
