"""Two local clusters brought up at the same moment, beside the running one, each on a block
of ports of its own (the second used to fail in MariaDB, "Address already in use"), each
answering with its own controller; both taken down, leaving nothing behind."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from trusted_tree import trusted_tmp_dir

from clusterjob.sandbox import cluster
from clusterjob.sandbox.config import Layout

from .conftest import Sandbox

pytestmark = pytest.mark.slurm


@pytest.fixture
def trusted() -> Iterator[Path]:
    yield from trusted_tmp_dir()


def _cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "clusterjob", "sandbox", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
    )  # fmt: skip


def test_two_sandboxes_brought_up_at_once_each_get_their_own_ports(
    sandbox: Sandbox, trusted: Path
) -> None:
    states = [trusted / "first", trusted / "second"]
    try:
        ups = [_cli("up", "--state-dir", str(s), "--timeout", "240") for s in states]
        for up in ups:
            out, err = up.communicate(timeout=400)
            assert up.returncode == 0, err
        blocks = {s: (s / "ports").read_text().strip() for s in (*states, sandbox.state_dir)}
        assert len(set(blocks.values())) == 3, blocks
        for state in states:
            env = {"SLURM_CONF": str(Layout(state).slurm_conf), "PATH": "/usr/bin:/bin"}
            ping = subprocess.run(["scontrol", "ping"], env=env, capture_output=True,
                                  text=True, timeout=30)  # fmt: skip
            assert "is UP" in ping.stdout, ping.stdout + ping.stderr
            assert cluster.status(state).up
    finally:
        downs = [_cli("down", "--state-dir", str(s), "--purge") for s in states]
        for down in downs:
            down.communicate(timeout=120)
    for state in states:
        assert not state.exists()
        assert not cluster.controller_running(state)
    assert cluster.status(sandbox.state_dir).up  # the running one was not disturbed
