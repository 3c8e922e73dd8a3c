"""First come, first served: a ticket queue of waiting ``clusterjob run --wait`` processes.

Each waiter holds ``flock(LOCK_EX)`` on its own ticket file ``<number>@<uid>.ticket`` in the
lock dir (its own file: no other user can remove it). A file is a waiter only while it is a
regular file owned by the uid its name says, locked, and numbered no later than now: a number
is the time its ticket was taken, in microseconds, or one more than the last live ticket's, so
numbers grow while the queue is non-empty (ties go by name), and a number planted far in the
future, which would leave no room after it, is no ticket.

A ticket shows that a run came first, not that it still waits for GPUs: any user can lock a
file and never claim anything. So a run lets go first only the waiters that were ahead of it
when it first looked (a ticket planted later with a lower number does not push in), and only
while GPUs of this machine are claimed: waiters that take nothing while nothing is claimed for
``IDLE_WAITER_S`` wait for something clusterjob cannot see, or for nothing, and stop holding
others back. A waiter that dies, even by SIGKILL, loses its lock and so its place; its file is
then just litter, removed by whoever may remove it (the sticky bit keeps other users' files).

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
import re
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clusterjob.workstation.claims import Holder, ensure_shared_dir, lock_state, read_holder

TICKET_SUFFIX = ".ticket"
NUMBER_DIGITS = 16  # microseconds since 1970 fill 16 digits until the year 2286
IDLE_WAITER_S = 10.0  # a waiting run takes free GPUs within a poll or two, NVML read included
FUTURE_SLACK_US = 3600 * 10**6  # a clock set back by up to an hour keeps earlier tickets
_TICKET_NAME = re.compile(r"(\d{1,19})@(\d{1,10})", re.ASCII)


def queue_dir(lock_dir: Path) -> Path:
    """Tickets live in the lock dir itself: a subdirectory would belong to whoever made it."""
    return ensure_shared_dir(lock_dir)


def parse_ticket_name(name: str) -> tuple[int, int] | None:
    """``(number, uid)`` of ``<number>@<uid>.ticket``; None for any other name."""
    if not name.endswith(TICKET_SUFFIX):
        return None
    match = _TICKET_NAME.fullmatch(name[: -len(TICKET_SUFFIX)])
    return (int(match[1]), int(match[2])) if match else None


def _clock_number() -> int:
    return time.time_ns() // 1000


@dataclass(frozen=True)
class Waiter:
    """A ticket that counts: the owner's own locked file, numbered no later than now."""

    number: int
    path: Path
    identity: tuple[str, int, int]  # name, device, inode: a file put in its place is not it

    @property
    def place(self) -> tuple[int, str]:
        return (self.number, self.path.name)

    def holder(self) -> Holder | None:
        """Who waits: the file's owner, with the pid and command its text gives."""
        return read_holder(self.path)


def waiters(qdir: Path) -> list[Waiter]:
    """The live waiters, first in line first; dead tickets are cleared on the way."""
    try:
        names = os.listdir(qdir)
    except OSError:
        return []
    latest = _clock_number() + FUTURE_SLACK_US
    found = []
    for name in names:
        parsed = parse_ticket_name(name)
        if parsed is None:
            continue
        path = qdir / name
        state = lock_state(path)
        if state is None:  # not a regular file: nobody's ticket
            continue
        info, held = state
        if not held:
            with contextlib.suppress(OSError):  # another user's litter stays (sticky dir)
                path.unlink()
            continue
        number, uid = parsed
        if info.st_uid == uid and number <= latest:
            found.append(Waiter(number, path, (name, info.st_dev, info.st_ino)))
    return sorted(found, key=lambda w: w.place)


@dataclass
class QueueWatch:
    """The waiters one run lets go first: those ahead of it when it first looked, for as long
    as they may be waiting for GPUs that clusterjob runs hold."""

    ahead: set[tuple[str, int, int]]
    quiet_s: float = 0.0  # how long this run has seen nothing claimed with waiters ahead
    quiet_at: float | None = None  # when it last saw that (None: GPUs were claimed then)

    @classmethod
    def of(cls, ahead: Iterable[Waiter]) -> QueueWatch:
        return cls({w.identity for w in ahead})

    def still_ahead(
        self, present: Sequence[Waiter], gpus_claimed: Callable[[], bool], now: float
    ) -> list[Waiter]:
        """Those of ``present`` still ahead of us; ``gpus_claimed`` is asked only when any are.

        A waiter's place lasts while GPUs are claimed (it may wait for them to be released).
        Once nothing has been claimed for IDLE_WAITER_S in all, every waiter still ahead has
        let free GPUs go by: it waits for something else, or is no run at all, and is passed.
        """
        still = [w for w in present if w.identity in self.ahead]
        self.ahead = {w.identity for w in still}
        if not still:
            return []
        if gpus_claimed():
            self.quiet_at = None
            return still
        if self.quiet_at is not None:
            self.quiet_s += max(0.0, now - self.quiet_at)
        self.quiet_at = now
        if self.quiet_s >= IDLE_WAITER_S:
            self.ahead = set()
            return []
        return still

    @property
    def quiet(self) -> bool:
        """The last look found waiters ahead and no GPU claimed."""
        return self.quiet_at is not None and bool(self.ahead)


@dataclass
class Ticket:
    number: int
    path: Path
    fd: int
    watch: QueueWatch = field(default_factory=lambda: QueueWatch(set()))

    def waiters_ahead(self, gpus_claimed: Callable[[], bool], now: float) -> list[Waiter]:
        """Live waiters that were before this one when it was taken, and still count."""
        return self.watch.still_ahead(waiters(self.path.parent), gpus_claimed, now)

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
    present = waiters(qdir)
    number = max(_clock_number(), present[-1].number + 1 if present else 0)
    tmp = qdir / f".tmp-{os.getpid()}-{secrets.token_hex(4)}"
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o644)
    try:
        os.fchmod(fd, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        info = {"user": _user(), "pid": os.getpid(), "command": command[:300], "since": time.time()}
        os.write(fd, (json.dumps(info) + "\n").encode())
        while True:  # link, not rename: never replace a ticket someone took meanwhile
            path = qdir / f"{number:0{NUMBER_DIGITS}d}@{os.geteuid()}{TICKET_SUFFIX}"
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
    ahead = (w for w in present if w.place < (number, path.name))
    return Ticket(number=number, path=path, fd=fd, watch=QueueWatch.of(ahead))


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"
