"""The job registry: concurrent submissions, `last`, and a corrupt file's way out."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterjob.cli.app import run
from clusterjob.errors import RegistryError, UsageError, exit_code
from clusterjob.jobs import registry
from clusterjob.jobs.registry import (
    SCHEMA_VERSION,
    JobRecord,
    Registry,
    StateUpdate,
    data_dir,
    repair,
)
from clusterjob.slurm import parse

REPO = Path(__file__).resolve().parent.parent


def record(job_id: str, token: str, at: float | None = None, **fields: object) -> JobRecord:
    values: dict[str, object] = {
        "cluster": "lab",
        "site": "mllab",
        "job_name": "train",
        "script": "#!/bin/bash\n",
        "script_path": "/tmp/x.sh",
        "command_line": "clusterjob submit --gpus 1 train.py",
        "work_dir": "/home/ana",
        "git_commit": None,
        "submitted_at": time.time() if at is None else at,
        **fields,
    }
    return JobRecord(job_id=job_id, token=token, **values)  # type: ignore[arg-type]


def test_data_dir_follows_override_then_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "xdg" / "clusterjob"
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "override"))
    assert data_dir() == tmp_path / "override"
    assert Registry().path == tmp_path / "override" / "jobs.sqlite"


def test_add_get_last_and_state_updates(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "jobs.sqlite")
    reg.add(record("10", "a", at=100.0))
    reg.add(record("12", "b", at=300.0))
    reg.add(record("11", "c", at=200.0))
    assert reg.resolve_id("last") == "12"
    assert reg.get("last").token == "b"  # type: ignore[union-attr]
    reg.update_states(
        [StateUpdate("b", "lab", "FAILED", "NonZeroExitCode", 3, "gpu1")], checked_at=400.0
    )
    got = reg.get("12")
    assert got is not None
    assert (got.state, got.exit_code, got.nodes, got.state_checked_at) == (
        "FAILED",
        3,
        "gpu1",
        400.0,
    )
    assert [r.job_id for r in reg.with_states(["FAILED"], exclude=True)] == ["10", "11"]
    assert reg.by_token("c").job_id == "11"  # type: ignore[union-attr]


def test_an_unknown_cluster_is_learned_from_the_first_status(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "jobs.sqlite")
    reg.add(record("10", "a", cluster=""))  # type: ignore[arg-type]
    reg.update_states([StateUpdate("a", "sandbox", "RUNNING")], checked_at=1.0)
    reg.update_states([StateUpdate("a", "elsewhere", "RUNNING")], checked_at=2.0)
    assert reg.get("10").cluster == "sandbox"  # type: ignore[union-attr]


@pytest.mark.parametrize("spec", ["abc", "", "12;x", "-1", "1_2_3"])
def test_bad_job_ids_are_usage_errors(tmp_path: Path, spec: str) -> None:
    with pytest.raises(UsageError):
        Registry(tmp_path / "jobs.sqlite").resolve_id(spec)


def test_last_without_any_job(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not submitted any job"):
        Registry(tmp_path / "jobs.sqlite").resolve_id("last")


_WRITER = """
import sys, time
from pathlib import Path
from clusterjob.jobs.registry import JobRecord, Registry
path, index, start = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
while time.time() < start:
    time.sleep(0.001)
reg = Registry(path)
for n in range(5):
    reg.add(JobRecord(str(1000 + index * 10 + n), "lab", "s", f"t{index}-{n}", "j", "#!",
                      "", "", "", None, time.time()))
    reg.newest()
print("ok")
"""


def test_twenty_concurrent_submitters_lose_nothing(tmp_path: Path) -> None:
    """20 processes start at the same instant on a registry that does not exist yet
    (so they also race to create it and switch it to WAL), 5 records each."""
    path = tmp_path / "data" / "jobs.sqlite"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.time() + 1.5
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), str(i), str(start)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(20)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    failures = [err for (out, err), p in zip(results, procs, strict=True) if p.returncode]
    assert failures == []
    records = Registry(path).all()
    assert len(records) == 100
    assert len({r.token for r in records}) == 100
    # closed here: Python 3.13 warns (ResourceWarning) about a connection left to the GC
    with contextlib.closing(sqlite3.connect(path)) as db:
        mode = db.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_a_connection_waits_the_busy_timeout_for_a_lock(tmp_path: Path) -> None:
    """The timeout is given to ``sqlite3.connect`` alone (no PRAGMA of its own): it must be
    SQLite's busy timeout all the same, or a sweep's submitters fail with "locked"."""
    with contextlib.closing(Registry(tmp_path / "jobs.sqlite")._open()) as conn:
        waits = conn.execute("PRAGMA busy_timeout").fetchone()[0]
    assert waits == registry.BUSY_TIMEOUT_MS


def test_in_a_served_command_a_failed_use_closes_at_once_a_good_one_after_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A served worker closes its connections after its answer (clusterjob/lifetime.py), but
    not one whose use failed: its write transaction would hold the registry's lock until then
    (here another writer would wait the busy timeout), and ``repair`` moves a corrupt file."""
    from clusterjob import lifetime

    monkeypatch.setattr(registry, "BUSY_TIMEOUT_MS", 300)
    path = tmp_path / "jobs.sqlite"
    first, other = Registry(path), Registry(path)
    other.check()
    closed: list[str] = []
    lifetime.answer_first()
    try:
        with pytest.raises(KeyError), first._connect(write=True):
            raise KeyError("interrupted in the middle of a write")
        other.add(record("1", "t1"))  # the failed write's lock went with its connection
        lifetime.after_answer(lambda: closed.append("the answer's turn"))
        with first._connect(write=False) as conn:
            conn.execute("SELECT count(*) FROM jobs").fetchone()
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (1,)  # still open
    finally:
        lifetime.answered()
    assert closed == ["the answer's turn"]
    with pytest.raises(sqlite3.ProgrammingError):  # closed once the answer was given
        conn.execute("SELECT 1")


def _corrupt(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is not an SQLite database, just some bytes " * 200)


def test_corrupt_registry_says_how_to_recover(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    _corrupt(path)
    with pytest.raises(RegistryError) as info:
        Registry(path).all()
    message = str(info.value)
    assert str(path) in message
    assert "clusterjob status --repair" in message
    assert "corrupt-" in message
    assert exit_code(info.value) == 6


def test_repair_moves_only_a_corrupt_file_aside(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    reg = Registry(path)
    reg.add(record("1", "a"))
    assert repair(path) is None  # a healthy registry stays
    assert len(Registry(path).all()) == 1
    _corrupt(path)
    moved = repair(path)
    assert moved is not None and moved.name.startswith("jobs.sqlite.corrupt-")
    assert moved.read_bytes().startswith(b"this is not")
    assert Registry(path).all() == []  # a fresh one


def test_cli_status_on_a_corrupt_registry_and_repair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path))
    _corrupt(tmp_path / "jobs.sqlite")
    assert run(["status"]) == 6
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--repair" in err and "Traceback" not in err
    assert run(["status", "--repair"]) == 0
    assert "moved aside to" in capsys.readouterr().out
    assert run(["status"]) == 0


# -- every field, every read (what mutation testing showed untested) -------------------------


def full_record(job_id: str, token: str, at: float) -> JobRecord:
    return JobRecord(
        job_id=job_id, cluster="lab", site="mllab", token=token, job_name="train",
        script="#!/bin/bash\necho hi\n", script_path="/d/x.sh",
        command_line="clusterjob submit x.py", work_dir="/home/ana", git_commit="abc123",
        submitted_at=at, resubmit_of="9", state="RUNNING", reason="None", exit_code=0,
        nodes="gpu1", stdout_path="/o", stderr_path="/e", state_checked_at=at + 1,
        gpus="gres/gpu:a100=2", elapsed="00:01:02", request='{"gpus": 2}', tasks="[]",
    )  # fmt: skip


def test_every_field_is_stored_and_read_back(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "jobs.sqlite")
    first, second = full_record("10", "a", 100.0), full_record("11", "b", 200.0)
    reg.add(first, second)  # one transaction, both kept
    assert reg.all() == [first, second]
    assert reg.get("10") == first and reg.get("11", "lab") == second
    assert reg.by_token("b") == second and reg.by_token("zz") is None
    assert reg.get("12") is None and reg.get("10", "elsewhere") is None
    assert reg.newest() == second
    assert first.submitted.timestamp() == 100.0


def test_state_updates_keep_what_a_query_did_not_say(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "jobs.sqlite")
    reg.add(full_record("10", "a", 100.0), record("11", "b", at=200.0, cluster=""))
    reg.update_states([], checked_at=5.0)  # nothing to do
    reg.update_states(
        [StateUpdate("a", "other", "COMPLETED"), StateUpdate("b", "lab", "PENDING", "Priority")],
        checked_at=300.0,
    )
    a, b = reg.get("10"), reg.get("11")
    assert a is not None and b is not None
    assert (a.cluster, a.state, a.reason, a.state_checked_at) == ("lab", "COMPLETED", None, 300.0)
    assert (a.exit_code, a.nodes, a.stdout_path, a.stderr_path) == (0, "gpu1", "/o", "/e")
    assert (a.gpus, a.elapsed, a.tasks) == ("gres/gpu:a100=2", "00:01:02", "[]")
    assert (b.cluster, b.state, b.reason) == ("lab", "PENDING", "Priority")
    reg.update_states(
        [StateUpdate("b", "lab", "FAILED", None, 2, "n1", "/o2", "/e2", "gpu=1", "1:00", "[1]")],
        checked_at=400.0,
    )
    b = reg.get("11")
    assert b is not None
    assert (b.state, b.exit_code, b.nodes, b.stdout_path, b.stderr_path) == (
        "FAILED", 2, "n1", "/o2", "/e2",
    )  # fmt: skip
    assert (b.gpus, b.elapsed, b.tasks, b.state_checked_at) == ("gpu=1", "1:00", "[1]", 400.0)


def test_reads_by_state_and_time_in_submission_order(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "jobs.sqlite")
    reg.add(record("12", "c", at=300.0, state="RUNNING"))
    reg.add(record("10", "a", at=100.0, state="PENDING"))
    reg.add(record("11", "b", at=200.0, state="RUNNING"))
    assert [r.job_id for r in reg.with_states(["RUNNING"])] == ["12", "11"]
    assert [r.job_id for r in reg.with_states(["RUNNING", "PENDING"])] == ["12", "10", "11"]
    assert [r.job_id for r in reg.with_states(["RUNNING"], exclude=True)] == ["10"]
    assert [r.job_id for r in reg.since(200.0)] == ["12", "11"]
    assert reg.since(301.0) == []
    assert reg.newest().job_id == "12"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("spec", "job_id"),
    [("last", "12"), ("last~0", "12"), ("last~1", "11"), ("last~2", "10"), (" 10 ", "10")],
)
def test_last_and_last_n(tmp_path: Path, spec: str, job_id: str) -> None:
    reg = Registry(tmp_path / "jobs.sqlite")
    reg.add(record("10", "a", at=100.0), record("11", "b", at=200.0), record("12", "c", at=200.0))
    assert reg.resolve_id(spec) == job_id


def test_job_id_refusals_say_why(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "jobs.sqlite")
    reg.add(record("10", "a", at=100.0))
    with pytest.raises(UsageError) as info:
        reg.resolve_id("last~3")
    assert str(info.value) == "`last~3`: clusterjob has not submitted 4 jobs yet"
    for spec in ("last~x", "last~", "last3", "1_2_3", "1__2"):
        with pytest.raises(UsageError) as info:
            reg.resolve_id(spec)
        assert str(info.value) == (
            f"not a job id: {spec!r} (expected digits such as 12345, or last)"
        )
    with pytest.raises(UsageError) as info:
        Registry(tmp_path / "empty.sqlite").resolve_id("last")
    assert str(info.value) == "`last`: clusterjob has not submitted any job yet"


def test_an_older_registry_gains_the_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, "
        "cluster TEXT NOT NULL DEFAULT '', site TEXT NOT NULL DEFAULT '', token TEXT NOT NULL "
        "UNIQUE, job_name TEXT NOT NULL DEFAULT '', script TEXT NOT NULL, script_path TEXT NOT "
        "NULL DEFAULT '', command_line TEXT NOT NULL DEFAULT '', work_dir TEXT NOT NULL DEFAULT "
        "'', git_commit TEXT, submitted_at REAL NOT NULL, resubmit_of TEXT, state TEXT NOT NULL "
        "DEFAULT 'SUBMITTED', reason TEXT, exit_code INTEGER, nodes TEXT, stdout_path TEXT, "
        "stderr_path TEXT, state_checked_at REAL, gpus TEXT, elapsed TEXT)"
    )
    conn.execute(
        "INSERT INTO jobs (job_id, token, script, submitted_at) VALUES ('7', 't', '#!', 1.0)"
    )
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    reg = Registry(path)
    old = reg.get("7")
    assert old is not None and (old.request, old.tasks, old.state) == (None, None, "SUBMITTED")
    assert old.host == "" and old.restarts is None  # the older file's job: this machine's
    reg.add(full_record("8", "u", 2.0))
    assert reg.get("8") == full_record("8", "u", 2.0)
    for restarts in (3, None, 2):  # the most seen stays, as a number
        reg.update_states([StateUpdate("t", "c", "RUNNING", restarts=restarts)], checked_at=3.0)
    assert reg.get("7").restarts == 3  # type: ignore[union-attr]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_a_registry_from_a_newer_clusterjob_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    Registry(path).check()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(RegistryError) as info:
        Registry(path).check()
    assert str(info.value) == (
        f"job registry {path} was written by a newer clusterjob "
        f"(schema {SCHEMA_VERSION + 1} > {SCHEMA_VERSION}); upgrade clusterjob"
    )


def test_data_dir_default_is_under_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CLUSTERJOB_DATA_DIR", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert data_dir() == tmp_path / ".local" / "share" / "clusterjob"
    monkeypatch.setenv("XDG_DATA_HOME", "")
    assert data_dir() == tmp_path / ".local" / "share" / "clusterjob"
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", "")
    assert data_dir() == tmp_path / ".local" / "share" / "clusterjob"


def test_an_unwritable_data_dir_is_a_registry_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RegistryError) as info:
        Registry(blocker / "jobs.sqlite").check()
    assert str(info.value) == f"cannot create {blocker}: File exists"


def test_repair_names_the_file_it_moved_aside_by_time(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    _corrupt(path)
    moved = repair(path)
    assert moved is not None
    assert re.fullmatch(r"jobs\.sqlite\.corrupt-\d{8}T\d{6}", moved.name), moved.name
    assert [p.name for p in tmp_path.iterdir()] == [moved.name]
    assert repair(path) is None  # nothing left to move


def test_newest_of_an_empty_registry_is_none(tmp_path: Path) -> None:
    assert Registry(tmp_path / "jobs.sqlite").newest() is None
    assert Registry(tmp_path / "jobs.sqlite").all() == []


def test_each_host_sees_its_own_jobs(tmp_path: Path) -> None:
    """Job ids are per cluster: a registry opened for a host (``--host``) reads only the jobs
    submitted through it, and the plain one only this machine's; ``last`` is per host too."""
    from dataclasses import replace

    path = tmp_path / "jobs.sqlite"
    Registry(path).add(
        full_record("7", "here", 1.0),
        replace(full_record("7", "there", 2.0), host="ada@login1:2222"),
        replace(full_record("9", "there2", 3.0), host="ada@login1:2222"),
    )
    here = Registry(path)
    there = Registry(path, host="ada@login1:2222")
    assert [r.token for r in here.all()] == ["here"]
    assert [r.token for r in there.all()] == ["there", "there2"]
    assert here.resolve_id("last") == "7" and there.resolve_id("last") == "9"
    record = there.get("7")
    assert record is not None and record.host == "ada@login1:2222"
    assert Registry(path, host="other").all() == []


# --- transactions and locks -------------------------------------------------------------------


def test_records_added_together_are_kept_together_or_not_at_all(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "jobs.sqlite")
    with pytest.raises(RegistryError):  # the second record reuses the first one's token
        reg.add(record("1", "same"), record("2", "same"))
    assert reg.all() == []


def test_state_updates_given_together_are_applied_together_or_not_at_all(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "jobs.sqlite")
    reg.add(record("1", "a"), record("2", "b"))
    bad = StateUpdate("b", "lab", None)  # type: ignore[arg-type]  # state may not be NULL
    with pytest.raises(RegistryError):
        reg.update_states([StateUpdate("a", "lab", "RUNNING"), bad], checked_at=5.0)
    assert [(r.state, r.state_checked_at) for r in reg.all()] == [("SUBMITTED", None)] * 2


@contextlib.contextmanager
def writer_holding(path: Path):
    """Another process's write transaction on the registry, held until the block ends."""
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        yield other
    finally:
        other.rollback()
        other.close()


def test_reads_of_an_open_registry_do_not_wait_for_a_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "BUSY_TIMEOUT_MS", 300)
    path = tmp_path / "jobs.sqlite"
    reg = Registry(path)
    reg.add(record("7", "a"))
    with writer_holding(path):
        reg.check()
        assert [r.job_id for r in reg.all()] == ["7"]
        assert reg.get("7") is not None
        with pytest.raises(RegistryError) as info:  # a write does wait, then says so
            reg.add(record("8", "b"))
    assert str(info.value) == (
        f"job registry {path} stayed locked for 0s by another clusterjob; try again"
    )


class StepClock:
    """``registry.time`` whose ``sleep`` records its delays and runs ``on_sleep`` instead."""

    def __init__(self, on_sleep) -> None:
        self.slept: list[float] = []
        self.on_sleep = on_sleep
        self.strftime = time.strftime

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.on_sleep(len(self.slept))


def registry_in_delete_mode(path: Path) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("CREATE TABLE t (x)")
    db.close()
    path.chmod(0o600)


def test_switching_to_wal_is_retried_while_another_process_holds_a_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "jobs.sqlite"
    registry_in_delete_mode(path)
    with contextlib.ExitStack() as stack:
        stack.enter_context(writer_holding(path))
        clock = StepClock(lambda n: n == 3 and stack.close())  # the writer ends after 3 waits
        monkeypatch.setattr(registry, "time", clock)
        Registry(path).check()
    assert clock.slept == [0.05, 0.05, 0.05]
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_switching_to_wal_gives_up_after_200_tries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "jobs.sqlite"
    registry_in_delete_mode(path)
    clock = StepClock(lambda n: None)
    monkeypatch.setattr(registry, "time", clock)
    with writer_holding(path), pytest.raises(RegistryError) as info:
        Registry(path).check()
    assert clock.slept == [0.05] * 199
    assert str(info.value) == (
        f"job registry {path} stayed locked for 60s by another clusterjob; try again"
    )


def test_repair_moves_a_shm_file_sqlite_left_beside_the_corrupt_one(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    _corrupt(path)
    (tmp_path / "jobs.sqlite-shm" / "inside").mkdir(parents=True)  # SQLite cannot remove it
    moved = repair(path)
    assert moved is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == [moved.name, f"{moved.name}-shm"]
    assert (tmp_path / f"{moved.name}-shm" / "inside").is_dir()


class NoWalConnection(sqlite3.Connection):
    """A connection on a filesystem without shared memory: SQLite keeps its old journal."""

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:  # type: ignore[override]
        if sql == "PRAGMA journal_mode = WAL":
            return super().execute("SELECT 'delete'")
        return super().execute(sql, *args)  # type: ignore[arg-type]


def test_a_filesystem_without_wal_gets_a_rollback_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_connect = sqlite3.connect
    monkeypatch.setattr(
        registry.sqlite3, "connect", functools.partial(real_connect, factory=NoWalConnection)
    )
    path = tmp_path / "jobs.sqlite"
    reg = Registry(path)
    reg.add(record("1", "a"))
    assert [r.job_id for r in reg.all()] == ["1"]
    with contextlib.closing(real_connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs.sqlite"]


def test_status_reads_pick_their_rows_in_an_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`status` asks for the live jobs and those of the last day: with thousands of ended
    jobs (each row holds its whole script), SQLite must find them in an index, not read
    every row."""
    now = time.time()
    reg = Registry(tmp_path / "jobs.sqlite")
    ended = [
        record(
            str(1000 + i), f"e{i}", at=now - 86_400 * 2 - i, state="COMPLETED", script="x" * 3000
        )
        for i in range(300)
    ]
    reg.add(*ended, record("9", "live", at=now - 60, state="RUNNING"))
    statements: list[str] = []
    connect = sqlite3.connect

    def traced(*args: object, **kwargs: object) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)  # type: ignore[arg-type]
        conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(registry.sqlite3, "connect", traced)
    final = ["CANCELLED", "COMPLETED", "FAILED", "TIMEOUT"]
    assert [r.job_id for r in reg.with_states(final, exclude=True)] == ["9"]
    assert [r.job_id for r in reg.since(now - 86_400)] == ["9"]
    assert [r.job_id for r in reg.with_states(["RUNNING", "PENDING"])] == ["9"]
    selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(selects) == 3
    plain = connect(tmp_path / "jobs.sqlite")
    try:
        for sql in selects:
            plan = " | ".join(row[3] for row in plain.execute(f"EXPLAIN QUERY PLAN {sql}"))
            assert "SCAN jobs USING COVERING INDEX" in plan or "USING COVERING INDEX" in plan, plan
            assert "SCAN jobs |" not in f"{plan} |" and not plan.startswith("SCAN jobs"), plan
    finally:
        plain.close()


def test_many_records_are_read_as_one_by_one(tmp_path: Path) -> None:
    """``get_many`` (one read for the API poller's thousand futures) answers as ``get`` does
    for each id: the newest record on id reuse, this host's only, none for an unknown id,
    past SQLite's limit on one statement's parameters."""
    path = tmp_path / "jobs.sqlite"
    here, there = Registry(path), Registry(path, host="ada@login1")
    here.add(*(record(str(i), f"t{i}", at=float(i)) for i in range(1200)))
    here.add(record("5", "again", at=5000.0))  # the id reused (another cluster's count)
    there.add(record("7", "remote", at=1.0, host="ada@login1"))
    asked = [str(i) for i in range(0, 1300, 3)] + ["5", "7"]
    many = here.get_many(asked)
    assert many == {i: r for i in asked if (r := here.get(i)) is not None}
    assert many["5"].token == "again" and "1299" not in many and len(many) == 402
    assert there.get_many(["7", "5"]) == {"7": there.get("7")}
    assert here.get_many([]) == {}


def test_jobs_outside_some_states_are_read_as_not_in_reads_them(tmp_path: Path) -> None:
    """``with_states(..., exclude=True)`` reads the ranges between the states through the
    index (``status``'s live jobs among thousands ended): the same rows as ``NOT IN``, for
    states at, between and around the bounds, however the excluded ones are given."""
    states = ["", "A", "BOOT_FAIL", "BOOT_FAIL ", "CANCELLED", "CANCELLED by 0", "COMPLETED",
              "COMPLETING", "PENDING", "RUNNING", "TIMEOUT", "ZZZ", "pending", "é"]  # fmt: skip
    reg = Registry(tmp_path / "r.db")
    reg.add(*(record(str(i), f"t{i}", state=state) for i, state in enumerate(states)))
    where, params = registry._outside("state", sorted(parse.FINAL_STATES))
    with contextlib.closing(sqlite3.connect(tmp_path / "r.db")) as conn:
        plan = " ".join(str(row) for row in conn.execute(
            f"EXPLAIN QUERY PLAN SELECT seq FROM jobs WHERE {where}", params
        ))  # fmt: skip
        for excluded in ([], ["COMPLETED"], ["TIMEOUT", "BOOT_FAIL", "COMPLETED", "BOOT_FAIL"],
                         ["", "é"], sorted(parse.FINAL_STATES)):  # fmt: skip
            marks = ", ".join("?" for _ in excluded)
            expected = [row[0] for row in conn.execute(
                f"SELECT job_id FROM jobs WHERE state NOT IN ({marks}) ORDER BY seq", excluded
            )]  # fmt: skip
            got = [r.job_id for r in reg.with_states(excluded, exclude=True)]
            assert got == expected, excluded
    assert "SEARCH jobs USING COVERING INDEX jobs_state" in plan and "SCAN" not in plan
