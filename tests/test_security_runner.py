"""A Slurm command that times out is ended with everything it started (review finding 11)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from clusterjob.slurm.runner import subprocess_exec


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its (re)parent counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_timeout_kills_the_commands_children_too(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    fake = tmp_path / "squeue"
    fake.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pidfile}\nsleep 60\n")
    fake.chmod(0o755)
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess_exec([str(fake)], 1.0, None)
    assert time.monotonic() - start < 10  # not held until the child closes our pipes
    child = int(pidfile.read_text())
    for _ in range(50):
        if not _alive(child):
            break
        time.sleep(0.1)
    else:
        os.kill(child, 9)
        pytest.fail("the command's child outlived the timeout")


def test_normal_run_still_returns_output(tmp_path: Path) -> None:
    fake = tmp_path / "sinfo"
    fake.write_text('#!/bin/sh\necho "out $LC_ALL"; cat; echo err >&2; exit 3\n')
    fake.chmod(0o755)
    result = subprocess_exec([str(fake)], 10.0, "in\n")
    assert (result.returncode, result.stdout, result.stderr) == (3, "out C\nin\n", "err\n")
