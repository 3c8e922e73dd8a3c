"""A copy of the job's code taken at submit, so that a queued or requeued job runs the code
as it was when it was submitted, not the user's later edits (``--snapshot``).

What is copied, from the submitting directory (``root``): in a git work tree, the files git
lists there (tracked, and untracked ones that ``.gitignore`` does not exclude: a new module not
yet added is still imported); elsewhere, the ``*.py`` files under it, skipping virtual
environments, caches, VCS and hidden directories. The job's own program file is always
copied. A file over ``MAX_FILE_BYTES`` is left out (data, not code); more than ``MAX_FILES``
files or ``MAX_BYTES`` in all is refused with a one-line error (a home directory is not a
project).

The copy lives in the user's data dir, ``snapshots/NAME`` (a random name of its own, which
the job's recorded request names), owner only like the job scripts (0700 directories, 0600
files, 0700 for an executable one). It is built under a temporary name and renamed into
place whole. Over ssh it is made here, shipped to ``.clusterjob/snapshots/NAME`` in the job's
directory on the cluster, and the copy here removed.

A snapshot is removed once no job needs it (``prune``): every registry record naming it has
ended more than ``KEEP_ENDED_SECONDS`` ago (``resubmit`` reruns the same code until then), or
no record names it and it is older than ``UNCLAIMED_SECONDS`` (a submission in progress has
not recorded its job yet; a registry moved aside by ``status --repair`` names none).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

from clusterjob.errors import UsageError
from clusterjob.jobs.private_files import data_dir, ensure_private_dir
from clusterjob.jobs.registry import JobRecord
from clusterjob.slurm.parse import is_final

SNAPSHOTS = "snapshots"
MAX_FILES = 5000
MAX_BYTES = 200 * 2**20
MAX_FILE_BYTES = 10 * 2**20
KEEP_ENDED_SECONDS = 7 * 86400
UNCLAIMED_SECONDS = 86400
# Directories never walked into outside git (inside git, .gitignore says).
SKIPPED_DIRS = frozenset(
    {"__pycache__", "venv", "env", "site-packages", "node_modules", "build", "dist", "wandb"}
)


def snapshots_dir() -> Path:
    return data_dir() / SNAPSHOTS


def snapshot_path(name: str) -> Path:
    """Where the snapshot ``name`` is (or will be) kept here."""
    return snapshots_dir() / name


def _git_files(root: Path) -> list[str] | None:
    """The files git lists under ``root`` (relative to it), or None outside a work tree."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
             "--exclude-standard", "--", "."],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    names = done.stdout.decode("utf-8", "surrogateescape").split("\0")
    return sorted({n for n in names if n})


def _walked_files(root: Path) -> list[str]:
    """The ``*.py`` files under ``root`` outside skipped, hidden and symlinked directories
    (and clusterjob's own data dir, should it be there)."""
    found: list[str] = []
    own = os.path.realpath(data_dir())
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d for d in dirs
            if d not in SKIPPED_DIRS and not d.startswith(".") and not d.endswith(".egg-info")
            and os.path.realpath(os.path.join(directory, d)) != own
        )  # fmt: skip
        rel = os.path.relpath(directory, root)
        found += [
            os.path.normpath(os.path.join(rel, f)) for f in sorted(files) if f.endswith(".py")
        ]
        if len(found) > MAX_FILES:
            break
    return found


def code_files(root: Path, extra: Iterable[str] = ()) -> tuple[list[tuple[str, int]], bool]:
    """The files a snapshot of ``root`` copies, each (relative path, size), and whether git
    chose them. ``extra``: files (relative to ``root``) copied whatever the rules say."""
    listed = _git_files(root)
    in_git = listed is not None
    if listed is not None:  # clusterjob's own data dir, should it be there and not ignored
        own = os.path.relpath(os.path.realpath(data_dir()), os.path.realpath(root))
        listed = [n for n in listed if n != own and not n.startswith(f"{own}/")]
    names = list(dict.fromkeys([*(listed if listed is not None else _walked_files(root)), *extra]))
    chosen: list[tuple[str, int]] = []
    total = 0
    for name in names:
        path = root / name
        try:
            st = path.stat()  # a symlinked file: what it points to, as the job would read
        except OSError:
            continue  # deleted but still tracked, a dangling link
        if not stat.S_ISREG(st.st_mode) or (st.st_size > MAX_FILE_BYTES and name not in extra):
            continue
        chosen.append((name, st.st_size))
        total += st.st_size
        if len(chosen) > MAX_FILES or total > MAX_BYTES:
            what = "git lists" if in_git else "*.py files are"
            raise UsageError(
                f"--snapshot: {root} is too big to copy for each job (more than {MAX_FILES} "
                f"files or {MAX_BYTES // 2**20} MiB: {what} there); submit from the project's "
                "own directory, add the data to .gitignore, or pass --no-snapshot"
            )
    return chosen, in_git


def take(root: Path, name: str, extra: Sequence[str] = ()) -> Path:
    """Copy the code under ``root`` (``code_files``) to ``snapshot_path(name)``, owner only;
    the snapshot directory."""
    target = snapshot_path(name)
    ensure_private_dir(target.parent)
    building = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    files, _ = code_files(root, extra)
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(0o700)
    try:
        for name, _size in files:
            _copy(root / name, building / name, building)
        os.replace(building, target)
    except OSError as exc:
        shutil.rmtree(building, ignore_errors=True)
        raise UsageError(f"--snapshot: cannot copy {root} to {target}: {exc}") from None
    return target


def _copy(source: Path, dest: Path, top: Path) -> None:
    missing = []
    for directory in dest.parents:
        if directory == top or directory.is_dir():
            break
        missing.append(directory)
    for directory in reversed(missing):
        directory.mkdir(0o700)
    mode = 0o700 if os.access(source, os.X_OK) else 0o600
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        src = source.open("rb")
    except FileNotFoundError:
        return  # gone since it was listed (an editor's temporary file)
    with src, os.fdopen(os.open(dest, flags, mode), "wb") as out:
        shutil.copyfileobj(src, out)


def discard(path: Path) -> None:
    """Remove a snapshot whose job was never submitted."""
    shutil.rmtree(path, ignore_errors=True)


def _named(record: JobRecord) -> str | None:
    """The snapshot (its directory's name) the record's job runs from, if any."""
    try:
        request = json.loads(record.request or "{}")
    except ValueError:
        return None
    snapshot = request.get("snapshot") if isinstance(request, dict) else None
    return PurePosixPath(snapshot).name if isinstance(snapshot, str) and snapshot else None


def stale(
    found: Iterable[tuple[str, float]], records: Iterable[JobRecord], now: float
) -> list[str]:
    """Which snapshots (name, time made) no job needs any more, given the registry's
    ``records``: a name some record names whose job has not ended (or ended within
    ``KEEP_ENDED_SECONDS``) is kept; one no record names is kept ``UNCLAIMED_SECONDS``."""
    needed_until: dict[str, float] = {}
    for record in records:
        name = _named(record)
        if name is None:
            continue
        if not record.job_id or not is_final(record.state):
            until = float("inf")
        else:
            until = (record.state_checked_at or record.submitted_at) + KEEP_ENDED_SECONDS
        needed_until[name] = max(needed_until.get(name, 0.0), until)
    gone = []
    for name, made in found:
        if name.startswith("."):
            continue  # one being built
        until = needed_until.get(name, made + UNCLAIMED_SECONDS)
        if now > until:
            gone.append(name)
    return sorted(gone)


def prune(records: Iterable[JobRecord], now: float | None = None) -> list[str]:
    """Remove this machine's snapshots that no job needs (``stale``); their names."""
    directory = snapshots_dir()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    found = []
    for entry in entries:
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                found.append((entry.name, entry.stat(follow_symlinks=False).st_mtime))
    gone = stale(found, records, time.time() if now is None else now)
    for name in gone:
        shutil.rmtree(directory / name, ignore_errors=True)
    return gone
