"""The Prolog starts its NVML read (in its forked child) before it imports its checks and
reads its config; a read it never asks for is ended with the Prolog, never left behind."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_hooks_nvml import Node, mixed
from trusted_tree import trusted_tmp_dir


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """The Prolog trusts no path through sticky /tmp: these trees live under a root-owned dir."""
    yield from trusted_tmp_dir()


@pytest.fixture
def node(tmp_path: Path, standin_lib: Path) -> Node:
    return Node(tmp_path, standin_lib.parent)


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                    if text.encode() in fh.read():
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_refused_config_ends_the_hung_reader(node: Node) -> None:
    """NVML hangs and the config is refused: the Prolog says so at once (not after its
    deadline) and its reader child, stuck in the driver, does not outlive it."""
    node.setup(mixed(**{"0": {"hang_seconds": 60}}), deadline=30)
    node.site.chmod(0o666)  # writable by anyone: refused before anything is parsed
    start = time.monotonic()
    done = node.prolog()
    assert time.monotonic() - start < 10
    assert done.returncode == 1
    assert "GPUs not checked: site config: refusing" in done.stderr
    assert _processes_naming(str(node.site)) == []


def test_the_early_read_is_the_one_checked(node: Node) -> None:
    node.setup(mixed())
    done = node.prolog()
    assert (done.returncode, done.stderr) == (0, "")
    (record,) = node.log_records()
    assert record["outcome"] == "ok"
