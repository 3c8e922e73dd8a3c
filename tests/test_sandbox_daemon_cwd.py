"""A daemon the sandbox starts does not keep its caller's working directory: when that was
a temporary directory, removed later, slurmd's job steps each printed "slurmstepd: error:
Unable to get current working directory" into the job's output."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterjob.sandbox import host


def test_a_spawned_daemon_works_in_the_root_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    caller = tmp_path / "caller"
    caller.mkdir()
    monkeypatch.chdir(caller)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    record = host.spawn("sleeper", ["sleep", "60"], pid_dir=pid_dir, log=tmp_path / "log")
    try:
        assert record.alive()
        assert os.readlink(f"/proc/{record.pid}/cwd") == "/"
    finally:
        host.stop(record, pid_dir, timeout=5)
