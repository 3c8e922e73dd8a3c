"""The local job registry: what clusterjob submitted, from where, with which script.

One SQLite file in the user's data dir (``$CLUSTERJOB_DATA_DIR`` or
``$XDG_DATA_HOME/clusterjob``). WAL mode and a generous busy timeout let many submissions
write at once (a sweep launched from a shell loop) without "database is locked". A file
that is not a readable registry raises ``RegistryCorrupt`` saying how to move it aside;
``repair()`` does exactly that.

A submission is recorded before sbatch runs, with its token and no job id (``pending()``),
and completed with the id once sbatch answers: a job never exists without its record, even
when clusterjob is interrupted or killed in between (``status`` then finds it by its token).
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

from clusterjob import lifetime
from clusterjob.errors import RegistryCorrupt, RegistryError, UsageError
from clusterjob.jobs.private_files import (
    create_private_file,
    data_dir,
    ensure_private_dir,
    narrow_to_owner,
)

REGISTRY_FILE = "jobs.sqlite"
SCHEMA_VERSION = 5  # 2: request, tasks; 3: host; 4: restarts; 5: scheduler (added in place)
BUSY_TIMEOUT_MS = 60_000
_IDS_PER_QUERY = 500  # under SQLite's oldest limit on a statement's parameters (999)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    cluster TEXT NOT NULL DEFAULT '',
    site TEXT NOT NULL DEFAULT '',
    token TEXT NOT NULL UNIQUE,
    job_name TEXT NOT NULL DEFAULT '',
    script TEXT NOT NULL,
    script_path TEXT NOT NULL DEFAULT '',
    command_line TEXT NOT NULL DEFAULT '',
    work_dir TEXT NOT NULL DEFAULT '',
    git_commit TEXT,
    submitted_at REAL NOT NULL,
    resubmit_of TEXT,
    state TEXT NOT NULL DEFAULT 'SUBMITTED',
    reason TEXT,
    exit_code INTEGER,
    nodes TEXT,
    stdout_path TEXT,
    stderr_path TEXT,
    state_checked_at REAL,
    gpus TEXT,
    elapsed TEXT,
    request TEXT,
    tasks TEXT,
    host TEXT NOT NULL DEFAULT '',
    restarts INTEGER,
    scheduler TEXT
);
CREATE INDEX IF NOT EXISTS jobs_job_id ON jobs (job_id, cluster);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state);
CREATE INDEX IF NOT EXISTS jobs_submitted ON jobs (submitted_at);
"""


@dataclass(frozen=True)
class JobRecord:
    """One submission as the registry remembers it (state fields are a cache of Slurm's)."""

    job_id: str
    cluster: str
    site: str
    token: str
    job_name: str
    script: str
    script_path: str
    command_line: str
    work_dir: str
    git_commit: str | None
    submitted_at: float
    resubmit_of: str | None = None
    state: str = "SUBMITTED"
    reason: str | None = None
    exit_code: int | None = None
    nodes: str | None = None
    stdout_path: str | None = None
    stderr_path: str | None = None
    state_checked_at: float | None = None
    gpus: str | None = None  # the GPUs Slurm gave, as TRES: gres/gpu:a100=2
    elapsed: str | None = None  # run time as Slurm reports it, e.g. 00:01:02
    request: str | None = None  # the JobRequest as JSON (resubmit re-renders it; sweep params)
    tasks: str | None = None  # an ended array's tasks as JSON (status --tasks without Slurm)
    # The login node it was submitted through over ssh (`--host`, as typed or the profile's
    # name); "" for a job submitted on this machine. Job ids are per host.
    host: str = ""
    restarts: int | None = None  # how often Slurm requeued it, the most seen (None: unknown)
    # The scheduler it was submitted to, as a site's ``scheduler:`` names it; None: an older
    # record, submitted to Slurm (``clusterjob.jobscript.backends.backend_named``).
    scheduler: str | None = None

    @property
    def submitted(self) -> datetime:
        return datetime.fromtimestamp(self.submitted_at)


_COLUMNS = tuple(f.name for f in fields(JobRecord))


class StateUpdate(NamedTuple):
    """What a status query learned about the job submitted with ``token``."""

    token: str
    cluster: str
    state: str
    reason: str | None = None
    exit_code: int | None = None
    nodes: str | None = None
    stdout_path: str | None = None
    stderr_path: str | None = None
    gpus: str | None = None
    elapsed: str | None = None
    tasks: str | None = None
    restarts: int | None = None


def _outside(column: str, values: Sequence[str]) -> tuple[str, list[str]]:
    """``column NOT IN (values)`` as the ranges between them (``column < v1 OR v1 < column <
    v2 ... OR column > vN``): the same rows, but each range a search of the column's index,
    where NOT IN reads the whole index (1 ms for 10,000 jobs, every ``status``)."""
    bounds = sorted(set(values))
    if not bounds:
        return "1", []  # NOT IN (): every row
    ranges = [f"{column} < ?"]
    ranges += [f"({column} > ? AND {column} < ?)" for _ in bounds[1:]]
    ranges.append(f"{column} > ?")
    params = [bounds[0]]
    params += [value for pair in itertools.pairwise(bounds) for value in pair]
    params.append(bounds[-1])
    return " OR ".join(ranges), params


class Registry:
    """The job registry at ``path`` (default: ``data_dir()/jobs.sqlite``)."""

    def __init__(self, path: Path | None = None, *, host: str = "") -> None:
        self.path = path or data_dir() / REGISTRY_FILE
        self.host = host  # reads see only this host's jobs ("" : this machine's)
        self._ready = False
        self._held: tuple[int, sqlite3.Connection] | None = None  # (thread, its connection)

    # --- connection -----------------------------------------------------------------------

    def _corrupt(self, exc: BaseException) -> RegistryCorrupt:
        return RegistryCorrupt(
            f"job registry {self.path} is unreadable ({exc}); move it aside and start a new "
            f"one with `clusterjob status --repair` (it is kept as "
            f"{self.path.name}.corrupt-<time>; submitted jobs keep running)"
        )

    @contextmanager
    def held(self) -> Iterator[None]:
        """One connection for this thread's calls inside (a submission's check, record and
        completion), where each would otherwise open its own: the last connection's close
        checkpoints the WAL, a few milliseconds a submit paid three times. Each write is its
        own transaction all the same, committed before the call returns."""
        if self._held is not None:
            yield
            return
        with self._connect(write=False) as conn:
            self._held = (threading.get_ident(), conn)
            try:
                yield
            finally:
                self._held = None

    @contextmanager
    def _connect(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        held = self._held
        conn = held[1] if held is not None and held[0] == threading.get_ident() else None
        opened = conn is None
        done = False
        try:
            if conn is None:
                conn = self._open()
            if write:
                conn.execute("BEGIN IMMEDIATE")
            yield conn
            if write:
                conn.execute("COMMIT")
            done = True
        except sqlite3.DatabaseError as exc:
            if conn is not None and conn.in_transaction:
                conn.rollback()
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise RegistryError(
                    f"job registry {self.path} stayed locked for {BUSY_TIMEOUT_MS // 1000}s "
                    "by another clusterjob; try again"
                ) from None
            if isinstance(exc, sqlite3.OperationalError) and "unable to open" in str(exc):
                raise RegistryError(f"cannot open job registry {self.path}: {exc}") from None
            raise self._corrupt(exc) from None
        finally:
            if conn is not None and opened:
                if done:  # a served command's answer need not wait for it (lifetime.py)
                    lifetime.after_answer(conn.close)
                else:  # a failed use closes at once: its transaction ends with it, and
                    conn.close()  # `repair` may move the file next

    def _open(self) -> sqlite3.Connection:
        """A new connection, the registry's file and directory made private first and its
        schema brought up to date."""
        try:  # the registry holds whole command lines: owner only, from the first byte
            ensure_private_dir(self.path.parent)
        except OSError as exc:
            raise RegistryError(f"cannot create {self.path.parent}: {exc.strerror}") from None
        try:  # 0600 before SQLite opens it (its -wal/-shm files copy its mode)
            create_private_file(self.path)
        except OSError as exc:
            raise RegistryError(f"cannot create {self.path}: {exc.strerror}") from None
        if not self._ready:
            narrow_to_owner(Path(f"{self.path}{suffix}") for suffix in ("", "-wal", "-shm"))
        # timeout: SQLite's busy timeout (sqlite3_busy_timeout, what PRAGMA busy_timeout sets)
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous = NORMAL")  # per connection; safe with WAL
            if not self._ready:
                self._prepare(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """WAL mode and the schema. Switching to WAL takes a lock the busy handler does not
        always wait for, so that one statement is retried by hand. A registry already in WAL
        mode at this schema (every one after its first use) is only read: the write
        transaction below cost each new process a few milliseconds."""
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() == "wal":
                self._ready = True
                return
        for attempt in range(200):
            try:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or attempt == 199:
                    raise
                time.sleep(0.05)
        if str(mode).lower() != "wal":  # e.g. a filesystem without shared memory
            conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("BEGIN IMMEDIATE")
        for statement in filter(str.strip, _SCHEMA.split(";")):
            conn.execute(statement)
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version < SCHEMA_VERSION:
            # an older registry gains the new columns in place; its records stay as they are
            have = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
            for column in _COLUMNS:
                if column not in have:
                    kind = "INTEGER" if column == "restarts" else "TEXT"
                    conn.execute(f"ALTER TABLE jobs ADD COLUMN {column} {kind}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version > SCHEMA_VERSION:
            conn.execute("ROLLBACK")
            raise RegistryError(
                f"job registry {self.path} was written by a newer clusterjob "
                f"(schema {version} > {SCHEMA_VERSION}); upgrade clusterjob"
            )
        conn.execute("COMMIT")
        self._ready = True

    def check(self) -> None:
        """Open the registry (creating it) so a corrupt file is reported before submitting."""
        with self._connect(write=False) as conn:
            conn.execute("SELECT count(*) FROM jobs").fetchone()

    # --- writes ---------------------------------------------------------------------------

    def add(self, *records: JobRecord) -> None:
        """Record submissions (several in one transaction)."""
        rows = [[getattr(r, c) for c in _COLUMNS] for r in records]
        placeholders = ", ".join("?" for _ in _COLUMNS)
        with self._connect(write=True) as conn:
            conn.executemany(
                f"INSERT INTO jobs ({', '.join(_COLUMNS)}) VALUES ({placeholders})", rows
            )

    def complete(
        self, token: str, job_id: str, cluster: str, *, git_commit: str | None = None
    ) -> None:
        """Give the submission recorded with ``token`` before sbatch ran its job id (and the
        commit git found meanwhile)."""
        with self._connect(write=True) as conn:
            conn.execute(
                "UPDATE jobs SET job_id = ?, cluster = CASE ? WHEN '' THEN cluster ELSE ? END, "
                "git_commit = COALESCE(?, git_commit) WHERE token = ?",
                (job_id, cluster, cluster, git_commit, token),
            )

    def discard(self, token: str) -> None:
        """Forget a submission recorded before sbatch ran, once sure no job was created."""
        with self._connect(write=True) as conn:
            conn.execute("DELETE FROM jobs WHERE token = ? AND job_id = ''", (token,))

    def update_states(self, updates: Sequence[StateUpdate], *, checked_at: float) -> None:
        if not updates:
            return
        with self._connect(write=True) as conn:
            conn.executemany(
                "UPDATE jobs SET cluster = CASE cluster WHEN '' THEN ? ELSE cluster END, "
                "state = ?, reason = ?, exit_code = COALESCE(?, exit_code), "
                "nodes = COALESCE(?, nodes), stdout_path = COALESCE(?, stdout_path), "
                "stderr_path = COALESCE(?, stderr_path), gpus = COALESCE(?, gpus), "
                "elapsed = COALESCE(?, elapsed), tasks = COALESCE(?, tasks), "
                "restarts = COALESCE(MAX(?, restarts), ?, restarts), "
                "state_checked_at = ? WHERE token = ?",
                [
                    (
                        u.cluster,
                        u.state,
                        u.reason,
                        u.exit_code,
                        u.nodes,
                        u.stdout_path,
                        u.stderr_path,
                        u.gpus,
                        u.elapsed,
                        u.tasks,
                        u.restarts,
                        u.restarts,
                        checked_at,
                        u.token,
                    )
                    for u in updates
                ],
            )

    # --- reads ----------------------------------------------------------------------------

    def _select(
        self, where: str = "", params: Sequence[object] = (), tail: str = "", *, sent: bool = True
    ) -> list[JobRecord]:
        """Rows of this registry's host only (job ids are per cluster, and so per host); with
        a job id (``sent``), else only the submissions still waiting for theirs."""
        mine = f"COALESCE(host, '') = ? AND job_id {'!=' if sent else '='} ''"
        where = f"{where} AND {mine}" if where else f"WHERE {mine}"
        with self._connect(write=False) as conn:
            rows = conn.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM jobs {where} {tail}", [*params, self.host]
            ).fetchall()
        return [_with_host(JobRecord(*row)) for row in rows]

    def all(self) -> list[JobRecord]:
        """Every record, oldest first."""
        return self._select(tail="ORDER BY seq")

    # The two reads of every `status`: the rows are picked in an index (state, submitted_at)
    # and only those read. A plain WHERE made SQLite read every row, whole scripts included:
    # ~15 ms per query at 10,000 jobs, for the few still running or of the last day.

    def with_states(self, states: Sequence[str], *, exclude: bool = False) -> list[JobRecord]:
        if exclude:  # the live jobs, among thousands ended: read through the index
            where, params = _outside("state", states)
        else:
            where, params = f"state IN ({', '.join('?' for _ in states)})", list(states)
        picked = f"SELECT seq FROM jobs WHERE {where}"
        return self._select(f"WHERE seq IN ({picked})", params, "ORDER BY seq")

    def since(self, when: float) -> list[JobRecord]:
        picked = "SELECT seq FROM jobs WHERE submitted_at >= ?"
        return self._select(f"WHERE seq IN ({picked})", [when], "ORDER BY seq")

    def newest(self) -> JobRecord | None:
        rows = self._select(tail="ORDER BY submitted_at DESC, seq DESC LIMIT 1")
        return rows[0] if rows else None

    def get(self, job_id: str, cluster: str | None = None) -> JobRecord | None:
        """The record for ``job_id`` (``last``: the newest). Newest wins on id reuse."""
        if job_id == "last":
            return self.newest()
        if cluster is None:
            rows = self._select("WHERE job_id = ?", [job_id], "ORDER BY seq DESC LIMIT 1")
        else:
            rows = self._select(
                "WHERE job_id = ? AND cluster = ?", [job_id, cluster], "ORDER BY seq DESC LIMIT 1"
            )
        return rows[0] if rows else None

    def get_many(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        """The records of ``job_ids`` (newest wins on id reuse, as ``get``), in one read: the
        API's poller asks about a thousand futures at once, and a connection per id cost
        ~0.7 ms each (0.8 s of CPU per refresh)."""
        wanted = sorted(set(job_ids))
        found: dict[str, JobRecord] = {}
        if not wanted:
            return found
        mine = "COALESCE(host, '') = ? AND job_id != ''"
        with self._connect(write=False) as conn:
            for start in range(0, len(wanted), _IDS_PER_QUERY):
                chunk = wanted[start : start + _IDS_PER_QUERY]
                marks = ", ".join("?" for _ in chunk)
                rows = conn.execute(
                    f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE job_id IN ({marks}) "
                    f"AND {mine} ORDER BY seq",
                    [*chunk, self.host],
                ).fetchall()
                for row in rows:
                    record = _with_host(JobRecord(*row))
                    found[record.job_id] = record
        return found

    def by_token(self, token: str) -> JobRecord | None:
        rows = self._select("WHERE token = ?", [token])
        return rows[0] if rows else None

    def pending(self) -> list[JobRecord]:
        """Submissions recorded before sbatch ran that never got their job id (the process
        was interrupted or killed meanwhile): the job may exist, with the record's token."""
        return self._select(tail="ORDER BY seq", sent=False)

    def resolve_id(self, spec: str) -> str:
        """A job id as typed: digits (or ``123_4``), ``last`` for the newest submission,
        ``last~N`` for the one N submissions before it."""
        spec = spec.strip()
        back = _last_offset(spec)
        if back is not None:
            rows = self._select(tail=f"ORDER BY submitted_at DESC, seq DESC LIMIT 1 OFFSET {back}")
            if not rows:
                if back == 0:
                    raise UsageError("`last`: clusterjob has not submitted any job yet")
                raise UsageError(f"`{spec}`: clusterjob has not submitted {back + 1} jobs yet")
            return rows[0].job_id
        if not spec or not all(part.isdigit() for part in spec.split("_", 1)):
            raise UsageError(f"not a job id: {spec!r} (expected digits such as 12345, or last)")
        return spec


def _with_host(record: JobRecord) -> JobRecord:
    """A record of an older registry (host NULL) was submitted on this machine."""
    return record if record.host is not None else replace(record, host="")


def _last_offset(spec: str) -> int | None:
    """``last`` -> 0, ``last~2`` -> 2; None for anything else."""
    if spec == "last":
        return 0
    head, sep, n = spec.partition("~")
    if head == "last" and sep and n.isdigit() and n.isascii():
        return int(n)
    return None


def repair(path: Path | None = None) -> Path | None:
    """Move an unreadable registry (and its -wal/-shm) aside; returns where it went, or None
    when the registry is fine or absent."""
    path = path or data_dir() / REGISTRY_FILE
    if not path.exists():
        return None
    try:
        Registry(path).check()
        return None
    except RegistryCorrupt:
        pass  # any other RegistryError (locked, not permitted) leaves a file that is fine
    stamp = time.strftime("%Y%m%dT%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    os.replace(path, target)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            os.replace(side, target.with_name(target.name + suffix))
    return target
