"""GPU claims shared by every user of a machine: one flock'ed file per GPU in a lock dir.

A claim is *held* exactly while some process holds ``flock(LOCK_EX)`` on the GPU's file; the
file's text (user, pid, command) is only for display. The kernel drops a flock when the last
descriptor of its open file goes away, so a claim ends when its command exits or is killed
(SIGKILL included) and a left-over file without a holder is simply free. ``clusterjob run``
keeps the descriptors open across ``exec``: the command itself holds its GPUs.

The lock dir is world-writable with the sticky bit (mode 1777), like /tmp: anyone may create
a claim file, nobody may delete another user's. Files are created mode 0666 so that the next
user can open (and lock and rewrite) them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from clusterjob.errors import ClusterjobError

LOCK_DIR_ENV = "CLUSTERJOB_LOCK_DIR"
SYSTEM_LOCK_DIR = Path("/var/lock/clusterjob")
FALLBACK_LOCK_DIR = Path("/tmp/clusterjob-gpu-locks")
SELECTION_LOCK = ".selection.lock"
CLAIM_SUFFIX = ".claim"
SHARED_DIR_MODE = 0o1777


def default_lock_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$CLUSTERJOB_LOCK_DIR``, else /var/lock/clusterjob, else /tmp/clusterjob-gpu-locks.

    Every user must arrive at the same directory or claims do not exclude each other, so the
    choice depends only on the machine, never on who asks: /var/lock/clusterjob when it
    exists or /var/lock is itself a shared sticky directory (Debian, Ubuntu, Fedora), else the
    /tmp one.
    """
    environ = os.environ if environ is None else environ
    if environ.get(LOCK_DIR_ENV):
        return Path(environ[LOCK_DIR_ENV])
    if SYSTEM_LOCK_DIR.is_dir():
        return SYSTEM_LOCK_DIR
    try:
        parent = os.stat(SYSTEM_LOCK_DIR.parent)
    except OSError:
        return FALLBACK_LOCK_DIR
    if stat.S_ISDIR(parent.st_mode) and parent.st_mode & 0o1002 == 0o1002:
        return SYSTEM_LOCK_DIR
    return FALLBACK_LOCK_DIR


def ensure_shared_dir(path: Path) -> Path:
    """Create ``path`` mode 1777 if missing; refuse one that other users could not share."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ClusterjobError(f"cannot create GPU lock dir {path}: {exc.strerror}") from exc
    else:
        os.chmod(path, SHARED_DIR_MODE)  # after mkdir: the umask would have cut it
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise ClusterjobError(f"GPU lock dir {path} is not a directory (a symlink or file?)")
    if stat.S_IMODE(info.st_mode) != SHARED_DIR_MODE:
        if info.st_uid == os.geteuid():
            os.chmod(path, SHARED_DIR_MODE)
        elif info.st_mode & 0o1002 != 0o1002:
            raise ClusterjobError(
                f"GPU lock dir {path} is mode {stat.S_IMODE(info.st_mode):04o} (owner "
                f"{_user_name(info.st_uid)}); other users cannot claim GPUs in it: run "
                f"'chmod 1777 {path}' as its owner or root"
            )
    return path


@dataclass(frozen=True)
class Holder:
    """Who holds a claim, as its holder wrote it."""

    user: str
    pid: int
    command: str
    since: float  # time.time()

    def __str__(self) -> str:
        since = time.strftime("%H:%M", time.localtime(self.since)) if self.since else "?"
        return f"{self.user} (pid {self.pid}, since {since}: {self.command})"


@dataclass(frozen=True)
class Claim:
    """A GPU claim seen in the lock dir; ``holder`` is None when its text is unreadable."""

    key: str  # GPU UUID (or bus ID when NVML gives no UUID)
    path: Path
    holder: Holder | None

    def holder_text(self) -> str:
        return str(self.holder) if self.holder else "another clusterjob run (holder unknown)"


def claim_path(lock_dir: Path, key: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_.:" else "_" for c in key)
    return lock_dir / (safe + CLAIM_SUFFIX)


def open_shared_file(path: Path) -> int:
    """Open (creating mode 0666) a file that several users lock; close-on-exec until claimed.

    An existing file is opened without O_CREAT: with fs.protected_regular, O_CREAT on another
    user's file in a sticky directory fails even though the file is mode 0666. A file that is
    not writable for us (made 0600 by its creator) is still lockable read-only.
    """
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        try:
            return os.open(path, flags)
        except FileNotFoundError:
            pass
        except PermissionError:
            return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise ClusterjobError(f"cannot open GPU lock file {path}: {exc.strerror}") from exc
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue  # someone else created it between our two opens
        os.fchmod(fd, 0o666)
        return fd


@contextlib.contextmanager
def selection_lock(lock_dir: Path) -> Iterator[None]:
    """Serialise look-and-claim across all runs, so two never split a set of GPUs between them."""
    fd = open_shared_file(lock_dir / SELECTION_LOCK)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class HeldClaims:
    """Claims this process holds: open descriptors with LOCK_EX; closing them releases."""

    def __init__(self) -> None:
        self.fds: dict[str, int] = {}

    def release(self, key: str) -> None:
        fd = self.fds.pop(key, None)
        if fd is not None:
            os.close(fd)

    def release_all(self) -> None:
        for key in list(self.fds):
            self.release(key)

    def make_inheritable(self) -> None:
        """Keep the claims open across exec: the command then holds its GPUs until it ends."""
        for fd in self.fds.values():
            os.set_inheritable(fd, True)


def try_claim(lock_dir: Path, key: str, held: HeldClaims) -> bool:
    """Take the claim on ``key`` if nobody holds it; True when it is now ours."""
    if key in held.fds:
        return True
    fd = open_shared_file(claim_path(lock_dir, key))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    held.fds[key] = fd
    return True


def write_holder(held: HeldClaims, key: str, command: str, pid: int | None = None) -> None:
    """Write who holds ``key`` into its file (display only; the flock is the claim)."""
    text = json.dumps(
        {
            "user": _user_name(os.getuid()),
            "pid": os.getpid() if pid is None else pid,
            "command": command[:300],
            "since": time.time(),
        }
    )
    fd = held.fds[key]
    with contextlib.suppress(OSError):  # opened read-only: the lock still holds, text is stale
        os.ftruncate(fd, 0)
        os.pwrite(fd, (text + "\n").encode(), 0)


def read_holder(path: Path) -> Holder | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            data = json.loads(f.read(4096) or "null")
        return Holder(
            user=str(data["user"]),
            pid=int(data["pid"]),
            command=str(data["command"]),
            since=float(data.get("since") or 0),
        )
    except (OSError, ValueError, TypeError, KeyError):
        return None


def is_held(path: Path) -> bool:
    """True when some process holds the claim file's lock (probed with a shared try-lock)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def current_claims(lock_dir: Path | None = None) -> list[Claim]:
    """Every GPU claim held right now on this machine, sorted by key (for ``clusterjob gpus``).

    Probed under the selection lock, so a probe never makes a concurrent run think a free GPU
    is taken. A lock dir that does not exist yet means no claims.
    """
    lock_dir = default_lock_dir() if lock_dir is None else lock_dir
    if not lock_dir.is_dir():
        return []
    claims = []
    with selection_lock(lock_dir):
        for path in sorted(lock_dir.glob("*" + CLAIM_SUFFIX)):
            if is_held(path):
                key = path.name[: -len(CLAIM_SUFFIX)]
                claims.append(Claim(key=key, path=path, holder=read_holder(path)))
    return claims


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
