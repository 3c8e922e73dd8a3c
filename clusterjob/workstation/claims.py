"""GPU claims shared by every user of a machine: flock'ed files in one lock dir.

A claim is *held* exactly while some process holds ``flock(LOCK_EX)`` on a claim file of
that GPU; the file's text (pid, command) is only for display, under the name of the file's
owner (never a name the text gives). The kernel drops a flock when the last descriptor of
its open file goes away, so a claim ends when its command exits or is killed (SIGKILL
included) and a left-over file without a holder is simply free.
``clusterjob run`` keeps the descriptors open across ``exec``: the command itself holds its
GPUs.

Each user claims through files of their own (``<gpu>@<uid>.claim``, mode 0644): in the lock
dir (mode 1777, owned by root or by the only user) nobody can delete or rewrite another
user's claim. To claim a GPU a run locks its own file first, then looks for any other held
claim file of that GPU and backs off if there is one; two runs racing may both back off,
never both win. Whatever else lies in the dir (a FIFO, a directory, a symlink, a file that
is not readable, someone else's file under our name) is never opened in a way that blocks,
and never counts as a claim.

A lock dir owned by another ordinary user is refused: its owner could delete everyone's
claims. On a shared machine root creates it (``install -d -m 1777 /var/lock/clusterjob``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import secrets
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from clusterjob import envvars
from clusterjob.errors import ClusterjobError, printable

LOCK_DIR_ENV = envvars.LOCK_DIR
SYSTEM_LOCK_DIR = Path("/var/lock/clusterjob")
FALLBACK_LOCK_DIR = Path("/tmp/clusterjob-gpu-locks")
SELECTION_LOCK = ".selection.lock"
CLAIM_SUFFIX = ".claim"
SHARED_DIR_MODE = 0o1777
CLAIM_FILE_MODE = 0o644  # readable by all (who holds it), written by its owner only
SELECTION_WAIT_S = 5.0  # the selection lock only spares runs a useless race: never wait long
_LAST_SINCE = 2.0**40  # seconds since 1970: any "since" beyond is garbage
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


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
    """Create ``path`` mode 1777 if missing; refuse one that is not safe or not shareable.

    Safe: a real directory owned by root or by us (its owner may delete any claim in it).
    """
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
    if info.st_uid not in (0, os.geteuid()):
        raise ClusterjobError(
            f"GPU lock dir {path} belongs to {_user_name(info.st_uid)}, who could delete other "
            f"users' GPU claims in it: ask root to run 'install -d -m 1777 -o root {path}' "
            f"(after removing this one), or set {LOCK_DIR_ENV} to a directory of your own"
        )
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
    """Who holds a claim or waits with a ticket: the file's owner, which nobody can forge, and
    what its text says (pid, command, since; ``pid`` None when the text is unreadable)."""

    user: str
    pid: int | None
    command: str
    since: float  # time.time()

    def __str__(self) -> str:
        if self.pid is None:
            return printable(self.user)
        since = time.strftime("%H:%M", time.localtime(self.since)) if self.since else "?"
        # the holder wrote this text: whoever reads it must not get their terminal driven
        return printable(f"{self.user} (pid {self.pid}, since {since}: {self.command})")

    def brief(self) -> str:
        """``user pid N``, for a status line."""
        return printable(self.user if self.pid is None else f"{self.user} pid {self.pid}")


@dataclass(frozen=True)
class Claim:
    """A GPU claim seen in the lock dir; ``holder`` is None when the file went meanwhile."""

    key: str  # GPU UUID (or bus ID when NVML gives no UUID)
    path: Path
    holder: Holder | None

    def holder_text(self) -> str:
        return str(self.holder) if self.holder else "another clusterjob run (holder unknown)"


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.:" else "_" for c in key)


def claim_path(lock_dir: Path, key: str, uid: int | None = None) -> Path:
    """The claim file of ``key`` that belongs to ``uid`` (default: us)."""
    return lock_dir / f"{_safe(key)}@{os.geteuid() if uid is None else uid}{CLAIM_SUFFIX}"


def _key_of(name: str) -> str | None:
    """The GPU key of a claim file name (``<key>@<uid>[-n].claim``, or an old ``<key>.claim``)."""
    if not name.endswith(CLAIM_SUFFIX) or name.startswith("."):
        return None
    stem = name[: -len(CLAIM_SUFFIX)]
    return stem.split("@", 1)[0] if "@" in stem else stem


def _claim_files(lock_dir: Path, key: str | None = None) -> list[Path]:
    try:
        names = os.listdir(lock_dir)
    except OSError:
        return []
    safe = None if key is None else _safe(key)
    return sorted(
        lock_dir / n for n in names if (k := _key_of(n)) is not None and safe in (None, k)
    )


def _open_regular(path: Path) -> int | None:
    """``path`` opened read-only without blocking or following a link; None unless a regular
    file (a FIFO, device, directory, symlink or unreadable file is nobody's claim)."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def open_shared_file(path: Path) -> int | None:
    """A lock file several users flock (the selection lock), opened without blocking; None
    when it is not a regular file we can open (then nobody can use it, us included)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o666)
    except PermissionError:  # another user's file (0644, or protected_regular): lock it r/o
        return _open_regular(path)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            return None
        if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != 0o666:
            os.fchmod(fd, 0o666)  # ours, just made: let the next user open it too
    except OSError:
        os.close(fd)
        return None
    return fd


def _flock_within(fd: int, seconds: float) -> bool:
    """``flock(LOCK_EX)`` on ``fd``, waiting at most ``seconds``; False when not obtained."""
    end = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= end:
                return False
            time.sleep(0.02)
        except OSError:
            return False


@contextlib.contextmanager
def selection_lock(lock_dir: Path, wait: float = SELECTION_WAIT_S) -> Iterator[None]:
    """Serialise look-and-claim across runs, so two seldom split a set of GPUs between them.

    Only an optimisation: claims stay exclusive without it. Whoever holds it longer than
    ``wait`` (or a lock file that is not a regular file) does not stop us, we go on without.
    """
    fd = open_shared_file(lock_dir / SELECTION_LOCK)
    try:
        if fd is not None:
            _flock_within(fd, wait)
        yield
    finally:
        if fd is not None:
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


def _is_own_claim_file(fd: int) -> bool:
    """Ours alone: a regular file we own with one link (never truncate anything else)."""
    try:
        info = os.fstat(fd)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_nlink == 1


def _open_own_claim(lock_dir: Path, key: str) -> int:
    """Our claim file for ``key``: ``<key>@<uid>.claim``, or a fresh ``<key>@<uid>-N.claim``
    when someone planted something else under our name."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    path = claim_path(lock_dir, key)
    try:
        fd = os.open(path, flags | os.O_CREAT, CLAIM_FILE_MODE)
        if _is_own_claim_file(fd):
            os.fchmod(fd, CLAIM_FILE_MODE)
            return fd
        os.close(fd)
    except OSError:
        pass
    for _ in range(100):
        other = path.with_name(f"{path.name[: -len(CLAIM_SUFFIX)]}-{secrets.token_hex(4)}")
        try:
            fd = os.open(
                other.with_name(other.name + CLAIM_SUFFIX),
                flags | os.O_CREAT | os.O_EXCL,
                CLAIM_FILE_MODE,
            )
        except FileExistsError:
            continue
        except OSError as exc:
            raise ClusterjobError(
                f"cannot create a GPU claim in {lock_dir}: {exc.strerror}"
            ) from exc
        os.fchmod(fd, CLAIM_FILE_MODE)
        return fd
    raise ClusterjobError(f"cannot create a GPU claim in {lock_dir}")


def try_claim(lock_dir: Path, key: str, held: HeldClaims) -> bool:
    """Take the claim on ``key`` if nobody holds it; True when it is now ours."""
    if key in held.fds:
        return True
    fd = _open_own_claim(lock_dir, key)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by another run of ours
        os.close(fd)
        return False
    mine = os.fstat(fd)
    for path in _claim_files(lock_dir, key):  # anyone else's: we hold ours, so no one slips by
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) != (mine.st_dev, mine.st_ino) and is_held(path):
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
    if not _is_own_claim_file(fd):
        return  # never truncate what is not ours alone (a hard link to someone's file)
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, (text + "\n").encode(), 0)


def read_holder(path: Path) -> Holder | None:
    """Who holds ``path``: its owner by name, with the pid, command and time its text gives
    (the text says "root" as easily as anything else); None unless a regular file."""
    fd = _open_regular(path)
    if fd is None:
        return None
    try:
        owner = _user_name(os.fstat(fd).st_uid)
        raw = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        data = json.loads(raw.decode("utf-8", "replace") or "null")
        since = float(data.get("since") or 0)
        return Holder(
            user=owner,
            pid=int(data["pid"]),
            command=str(data["command"]),
            since=since if 0 < since < _LAST_SINCE else 0.0,  # no time.localtime overflow
        )
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
        return Holder(user=owner, pid=None, command="", since=0.0)


def holder_of(lock_dir: Path, key: str) -> Holder | None:
    """Who holds ``key`` now (None: nobody)."""
    for path in _claim_files(lock_dir, key):
        if is_held(path):
            return read_holder(path)
    return None


def lock_state(path: Path) -> tuple[os.stat_result, bool] | None:
    """The file's status and whether some process holds its lock (probed with a shared
    try-lock); None unless ``path`` is a regular file we can open."""
    fd = _open_regular(path)
    if fd is None:
        return None
    try:
        info = os.fstat(fd)
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return info, True
    except OSError:
        return None
    finally:
        os.close(fd)
    return info, False


def is_held(path: Path) -> bool:
    """True when some process holds the claim file's lock (probed with a shared try-lock)."""
    state = lock_state(path)
    return state is not None and state[1]


def foreign_files(lock_dir: Path) -> list[str]:
    """Names in the lock dir that look like claims or tickets but are not one: not a regular
    file, or not owned by the user their name says. Ignored; worth telling someone about."""
    try:
        names = sorted(os.listdir(lock_dir))
    except OSError:
        return []
    found = []
    for name in names:
        if _key_of(name) is None and not name.endswith(".ticket"):
            continue
        try:
            info = os.lstat(lock_dir / name)
        except OSError:
            continue
        owner = name.rsplit(".", 1)[0].partition("@")[2].split("-", 1)[0]
        if not stat.S_ISREG(info.st_mode) or (owner.isdigit() and int(owner) != info.st_uid):
            found.append(name)
    return found


def current_claims(lock_dir: Path | None = None, wait: float = SELECTION_WAIT_S) -> list[Claim]:
    """Every GPU claim held right now on this machine, sorted by key (for ``clusterjob gpus``).

    Probed under the selection lock, so a probe never makes a concurrent run think a free GPU
    is taken. A lock dir that does not exist yet means no claims.
    """
    lock_dir = default_lock_dir() if lock_dir is None else lock_dir
    if not lock_dir.is_dir():
        return []
    with selection_lock(lock_dir, wait):
        return held_claims(lock_dir)


def held_claims(lock_dir: Path) -> list[Claim]:
    """``current_claims`` for a caller that holds the selection lock already."""
    claims: dict[str, Claim] = {}
    for path in _claim_files(lock_dir):
        key = _key_of(path.name)
        if key is not None and key not in claims and is_held(path):
            claims[key] = Claim(key=key, path=path, holder=read_holder(path))
    return [claims[k] for k in sorted(claims)]


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
