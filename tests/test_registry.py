"""The job registry: concurrent submissions, `last`, and a corrupt file's way out."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterjob.cli import run
from clusterjob.errors import RegistryError, UsageError, exit_code
from clusterjob.jobs.registry import JobRecord, Registry, StateUpdate, data_dir, repair

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
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


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
