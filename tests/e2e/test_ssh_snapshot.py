"""``--snapshot`` with ``--host``: the copy is taken on the laptop and shipped with the job
to the cluster, so a later submission, whose sync overwrites the code in the remote
directory, does not change what a job still in the queue runs; a copy there that no job
needs is removed. Over the real ssh login node of ``test_ssh.py`` in front of the local
cluster."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from .conftest import Sandbox
from .test_ssh import Login, cj, laptop, login  # noqa: F401  (the fixtures, used by name)

pytestmark = pytest.mark.slurm


def test_a_queued_job_keeps_its_code_when_the_next_submit_syncs_new_code(
    login: Login,  # noqa: F811
    laptop: Path,  # noqa: F811
    tmp_path: Path,
    sandbox: Sandbox,
) -> None:
    data, remote = tmp_path / "data", tmp_path / "remote"
    host = ["--host", login.host, "--remote-dir", str(remote)]
    (laptop / "helper.py").write_text("VALUE = 'original'\n")
    (laptop / "train.py").write_text("import helper\nprint('ran', helper.VALUE)\n")
    stale = remote / ".clusterjob" / "snapshots" / "0ld"  # no job names it, made days ago
    stale.mkdir(parents=True)
    os.utime(stale, (time.time() - 3 * 86400,) * 2)
    held = ["--sbatch-arg=--hold", "--json"]
    first = cj(login, laptop, data, *host, "submit", "train.py", "--snapshot", *held)
    assert first.returncode == 0, first.stderr
    frozen = json.loads(first.stdout)["job_id"]
    (laptop / "helper.py").write_text("VALUE = 'edited'\n")
    second = cj(login, laptop, data, *host, "submit", "train.py", *held)  # syncs the edit
    assert second.returncode == 0, second.stderr
    live = json.loads(second.stdout)["job_id"]
    assert (remote / "helper.py").read_text() == "VALUE = 'edited'\n"
    (copy,) = (remote / ".clusterjob" / "snapshots").iterdir()  # the stale one removed
    assert (copy / "helper.py").read_text() == "VALUE = 'original'\n"
    assert stat.S_IMODE(copy.stat().st_mode) == 0o700
    assert stat.S_IMODE((copy / "helper.py").stat().st_mode) == 0o600
    assert not any((data / "snapshots").iterdir())  # the laptop's copy went with the job
    sandbox.run("scontrol", "release", f"{frozen},{live}")
    for job, value in ((frozen, "original"), (live, "edited")):
        waited = cj(login, laptop, data, *host, "wait", job, "--interval", "1")
        assert waited.returncode == 0, waited.stderr
        logs = cj(login, laptop, data, *host, "logs", job)
        assert logs.stdout.strip().splitlines()[-1] == f"ran {value}", logs.stdout
