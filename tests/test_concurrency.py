"""Many `clusterjob submit` at once, and a registry that is not one, on the real cluster.

tests/test_registry.py already races 20 writer processes on the registry alone and checks
the corrupt-file message and `--repair` through `status`; here the whole command runs
against the sandbox: sbatch included, and a corrupt registry must stop a submission before
any job exists.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterjob.jobs.registry import REGISTRY_FILE, Registry
from clusterjob.sandbox import cluster

pytestmark = pytest.mark.slurm

TRAIN = str(Path(__file__).resolve().parents[1] / "examples" / "train.py")
TINY = ("--gpus", "1", "--model", "V100", "--sbatch-arg=--hold")  # held: costs no CPU


@pytest.fixture(scope="module")
def client_env() -> dict[str, str]:
    """The sandbox's client environment (brought up when not running, as tests/e2e does)."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm sandbox needs root")
    state_dir = cluster.resolve_state_dir()
    if not cluster.status(state_dir).up:
        cluster.up(state_dir)
    return {**os.environ, **cluster.client_env(state_dir)}


@pytest.fixture
def job_name(client_env: dict[str, str]) -> Iterator[str]:
    name = f"conc-{uuid.uuid4().hex[:10]}"
    yield name
    subprocess.run(["scancel", f"--name={name}"], env=client_env, capture_output=True, timeout=30)


def site_path(env: dict[str, str]) -> str:
    return str(Path(env["SLURM_CONF"]).parent / "site.yaml")


def submit_cmd(env: dict[str, str], name: str) -> list[str]:
    return [sys.executable, "-m", "clusterjob", "submit", TRAIN, "--site", site_path(env),
            *TINY, "--job-name", name]  # fmt: skip


def jobs_named(env: dict[str, str], name: str) -> dict[str, str]:
    out = subprocess.run(
        ["squeue", "--states=all", f"--name={name}", "-h", "-o", "%i|%k"],
        env=env, capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    return dict(line.split("|", 1) for line in out.splitlines() if line)


def test_twenty_submits_at_once(client_env: dict[str, str], job_name: str, tmp_path: Path) -> None:
    """20 processes, one registry that does not exist yet: 20 jobs, 20 records, no lock error."""
    env = {**client_env, "CLUSTERJOB_DATA_DIR": str(tmp_path / "data")}
    began = time.monotonic()
    procs = [
        subprocess.Popen(
            submit_cmd(env, job_name),
            env=env,
            cwd=tmp_path,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(20)
    ]
    outputs = [p.communicate(timeout=240) for p in procs]
    results = [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]
    took = time.monotonic() - began
    assert not any("database is locked" in err for _, _, err in results)
    assert [rc for rc, _, _ in results] == [0] * 20, [err for rc, _, err in results if rc]
    reported = {m.group(1) for _, out, _ in results if (m := re.search(r"job (\d+)", out))}
    records = Registry(tmp_path / "data" / REGISTRY_FILE).all()
    in_slurm = jobs_named(env, job_name)
    print(f"\nconcurrency figures: submits=20, jobs={len(in_slurm)}, records={len(records)}, "
          f"seconds={took:.1f}")  # fmt: skip
    assert len(reported) == 20
    assert set(in_slurm) == reported == {r.job_id for r in records}
    assert len({r.token for r in records}) == 20
    assert sorted(in_slurm.values()) == sorted(f"clusterjob:{r.token}" for r in records)


def test_corrupt_registry_stops_submit_before_any_job(
    client_env: dict[str, str], job_name: str, tmp_path: Path
) -> None:
    """Garbage where the registry should be: one line naming `--repair`, exit 6, no job in
    Slurm; after `clusterjob status --repair` the same submit works and is recorded."""
    data = tmp_path / "data"
    data.mkdir()
    (data / REGISTRY_FILE).write_bytes(os.urandom(64 * 1024))
    env = {**client_env, "CLUSTERJOB_DATA_DIR": str(data)}
    proc = subprocess.run(submit_cmd(env, job_name), env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 6, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "clusterjob status --repair" in proc.stderr
    assert jobs_named(env, job_name) == {}

    repair = subprocess.run([sys.executable, "-m", "clusterjob", "status", "--repair"],
                            env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert repair.returncode == 0 and "moved aside to" in repair.stdout, repair.stderr
    again = subprocess.run(submit_cmd(env, job_name), env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert again.returncode == 0, again.stderr
    (record,) = Registry(data / REGISTRY_FILE).all()
    assert list(jobs_named(env, job_name)) == [record.job_id]
