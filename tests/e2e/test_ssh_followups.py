"""`clusterjob --host` through a real OpenSSH server (the loopback login node of
test_ssh.py): the commands a submission prints to type next, typed as printed, reach the
same cluster."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .test_ssh import Login, laptop, login

__all__ = ["laptop", "login"]  # the fixtures, shared with test_ssh

pytestmark = pytest.mark.slurm


def test_the_printed_follow_up_typed_as_printed_reaches_the_cluster(
    login: Login, laptop: Path, tmp_path: Path
) -> None:
    env = {**login.env, "CLUSTERJOB_DATA_DIR": str(tmp_path / "data")}
    host = ["--host", login.host, "--remote-dir", str(tmp_path / "remote")]
    done = subprocess.run(
        [sys.executable, "-m", "clusterjob", *host, "submit", "train.py"],
        env=env, cwd=laptop, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    match = re.search(r"^Follow it with: (.*)$", done.stdout, re.MULTILINE)
    assert match, done.stdout
    job = re.search(r"Submitted job (\d+)", done.stdout).group(1)  # type: ignore[union-attr]
    status, logs = match.group(1).split("; ")
    assert status == f"clusterjob --host {login.host} status {job}"
    assert logs == f"clusterjob --host {login.host} logs {job} -f"
    typed = shlex.split(status)
    assert typed[0] == "clusterjob"
    ran = subprocess.run(
        [sys.executable, "-m", "clusterjob", *typed[1:], "--json"],
        env=env, cwd=laptop, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert f'"job_id": "{job}"' in ran.stdout
