"""An ordinary user's job on the sandbox: the root Prolog passes it, the TaskProlog and the
node_command run as that user (they failed with 126 when the interpreter was one only root
could run, e.g. a venv over a Python in root's home)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from unix_users import UnixUser, unix_user

from .conftest import Sandbox

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def user() -> Iterator[UnixUser]:
    with unix_user("cjjob") as u:
        yield u


def test_ordinary_users_job_runs_through_both_hooks(sandbox: Sandbox, user: UnixUser) -> None:
    out = Path(user.home) / "job.out"
    node_command = sandbox.layout.bin_dir / "clusterjob"
    script = (
        'echo "ORDER=$CUDA_DEVICE_ORDER UID=$(id -u)"; '
        f"{node_command} --help >/dev/null && echo NODE_COMMAND_OK"
    )
    submit = user.run(
        ["sbatch", "--parsable", "--gres=gpu:a100:1", "-o", str(out), "--wrap", script],
        env={"SLURM_CONF": str(sandbox.layout.slurm_conf)},
        cwd=user.home,
    )
    assert submit.returncode == 0, submit.stderr
    job_id = submit.stdout.strip().split(";")[0]
    fields = sandbox.wait_job(job_id, timeout=120)
    assert fields["JobState"] == "COMPLETED", fields
    assert fields["ExitCode"] == "0:0", fields
    deadline = time.monotonic() + 10
    while "NODE_COMMAND_OK" not in (out.read_text() if out.exists() else ""):
        assert time.monotonic() < deadline, out.read_text() if out.exists() else "no output"
        time.sleep(0.2)
    assert f"ORDER=PCI_BUS_ID UID={user.uid}" in out.read_text()
