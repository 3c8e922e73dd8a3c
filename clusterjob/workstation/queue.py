"""First come, first served: a ticket queue of waiting ``clusterjob run --wait`` processes.

Each waiter holds ``flock(LOCK_EX)`` on its own ticket file ``<number>@<uid>.ticket`` in the
lock dir (its own file: no other user can remove it); numbers only grow while the queue is
non-empty, ties go by name. The waiter whose ticket is the
lowest *live* one (still locked) is the head: only it tries to claim GPUs. A waiter that
dies, even by SIGKILL, loses its lock and so its place; its file is then just litter, removed
by whoever may remove it (the sticky bit keeps other users' files).

A ticket file appears already locked (written and locked under a temporary name, then
linked in place, which never replaces another ticket), so nobody ever sees a fresh ticket as
dead. Anything else with a ticket's name (a FIFO, a directory, a file that is not readable)
is opened without blocking and is no waiter.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from clusterjob.workstation.claims import Holder, ensure_shared_dir, is_held, read_holder

TICKET_SUFFIX = ".ticket"


def queue_dir(lock_dir: Path) -> Path:
    """Tickets live in the lock dir itself: a subdirectory would belong to whoever made it."""
    return ensure_shared_dir(lock_dir)


def _number(path: Path) -> int | None:
    stem = path.name[: -len(TICKET_SUFFIX)].split("@", 1)[0]
    return int(stem) if stem.isdigit() and len(stem) <= 18 else None


def _tickets(qdir: Path) -> list[tuple[int, Path]]:
    found = []
    try:
        names = os.listdir(qdir)
    except OSError:
        return []
    for name in names:
        if name.endswith(TICKET_SUFFIX):
            path = qdir / name
            n = _number(path)
            if n is not None:
                found.append((n, path))
    return sorted(found)


@dataclass
class Ticket:
    number: int
    path: Path
    fd: int

    def waiters_ahead(self) -> list[Holder | None]:
        """Live waiters before this one, oldest first; dead tickets are cleared on the way."""
        ahead: list[Holder | None] = []
        for n, path in _tickets(self.path.parent):
            if (n, path) >= (self.number, self.path):
                break
            if is_held(path):
                ahead.append(read_holder(path))
            else:
                with contextlib.suppress(OSError):  # another user's litter stays (sticky dir)
                    path.unlink()
        return ahead

    def leave(self) -> None:
        """Give up this place in the queue (done waiting, gave up, or interrupted)."""
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self.fd)
        self.fd = -1


def take_ticket(qdir: Path, command: str) -> Ticket:
    """Join the queue at its end. Call under the selection lock: numbers must not collide."""
    existing = _tickets(qdir)
    number = existing[-1][0] + 1 if existing else 1
    tmp = qdir / f".tmp-{os.getpid()}-{secrets.token_hex(4)}"
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o644)
    try:
        os.fchmod(fd, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        info = {"user": _user(), "pid": os.getpid(), "command": command[:300], "since": time.time()}
        os.write(fd, (json.dumps(info) + "\n").encode())
        while True:  # link, not rename: never replace a ticket someone took meanwhile
            path = qdir / f"{number:012d}@{os.geteuid()}{TICKET_SUFFIX}"
            try:
                os.link(tmp, path)
                break
            except FileExistsError:
                number += 1
    except BaseException:
        os.close(fd)
        raise
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return Ticket(number=number, path=path, fd=fd)


def live_waiters(qdir: Path) -> int:
    """How many waiters hold a ticket right now."""
    return sum(1 for _, path in _tickets(qdir) if is_held(path))


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"
