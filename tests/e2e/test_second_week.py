"""What a researcher met in the second week of using clusterjob, on the real local cluster:
options() given to a command job, a function job found again by its id, the restart count
of a requeued job once it ended, `wait` on a job that will never start, and a job's name
and GPUs read one way whichever Slurm command answered."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from clusterjob.api.cluster import Cluster
from clusterjob.errors import UsageError
from clusterjob.jobs.status import JobStatus

from .conftest import REQUEUED_START, Cli, Sandbox, one, until

pytestmark = pytest.mark.slurm


def test_options_reach_a_command_job_in_slurm(here: Path, sandbox: Sandbox) -> None:
    """`options(gpus=..., model=..., time=...).submit([...])` once ran with no GPUs and no
    time limit; an unknown model in options() was submitted."""
    cluster = Cluster()
    job = cluster.options(gpus=1, model="V100", time="0:05:00", sbatch_args=["--hold"]).submit(
        ["nvidia-smi"]
    )
    try:
        fields = sandbox.job(job.id)
        assert fields["TimeLimit"] == "00:05:00"
        assert "gpu:v100:1" in fields.get("TresPerNode", ""), fields
    finally:
        sandbox.run("scancel", job.id)
    with pytest.raises(UsageError, match=r"^unknown GPU model 'A10O' at site sandbox \(did you"):
        cluster.options(gpus=1, model="A10O").submit(["nvidia-smi"])
    assert [r.job_id for r in cluster.registry().all()] == [job.id]


def test_a_function_job_found_again_by_id_returns_its_value(here: Path) -> None:
    def area(w: int, h: int) -> int:
        return w * h

    def broken() -> None:
        raise LookupError("nothing here")

    submitter = Cluster(poll_interval=0.5)
    ok = submitter.submit_function(area, 6, 7)
    bad = submitter.submit_function(broken)
    ok.wait(timeout=120)
    bad.wait(timeout=120)
    later = Cluster(poll_interval=0.5)  # as another Python session would
    assert later.job(ok.id).result(timeout=60) == 42
    with pytest.raises(LookupError, match="nothing here"):
        later.job(bad.id).result(timeout=60)
    command = submitter.submit(["true"])
    final = later.job(command.id).result(timeout=120)
    assert isinstance(final, JobStatus) and final.state == "COMPLETED"


def test_restarts_stay_the_true_count_after_the_job_ends(
    here: Path, sandbox: Sandbox, cj: Cli
) -> None:
    cluster = Cluster()
    job = cluster.submit(["sleep", "300"], requeue=True, time="0:10:00")
    for attempt in (1, 2):
        until(f"job {job.id} running", lambda: one(cluster, job.id).state == "RUNNING")
        sandbox.run("scontrol", "requeue", job.id)
        waiting = until(
            f"job {job.id} waiting after requeue {attempt}",
            lambda: (r := one(cluster, job.id)).reason == "BeginTime" and r,
        )
        assert waiting.restarts == attempt, waiting
        sandbox.run("scontrol", "update", f"JobId={job.id}", REQUEUED_START)
    until(f"job {job.id} running again", lambda: one(cluster, job.id).state == "RUNNING")
    assert one(cluster, job.id).restarts == 2  # running: the count seen, kept
    sandbox.run("scancel", job.id)
    ended = until(f"job {job.id} ended", lambda: (r := one(cluster, job.id)).exit_code is not None
                  and r.state == "CANCELLED" and r)  # fmt: skip
    assert ended.restarts == 2, ended
    done = cj("status", job.id, "--json")
    assert done.returncode == 0, done.stderr
    assert '"restarts": 2' in done.stdout, done.stdout


def test_wait_ends_for_a_dependency_that_can_never_be_satisfied(
    here: Path, sandbox: Sandbox, cj: Cli
) -> None:
    failing = cj("submit", "--parsable", "--", "false")
    assert failing.returncode == 0, failing.stderr
    first = failing.stdout.strip()
    after = cj("submit", "--parsable", "--dependency", f"afterok:{first}", "--", "true")
    assert after.returncode == 0, after.stderr
    second = after.stdout.strip()
    try:
        waited = cj("wait", second, "--interval", "1", "--timeout", "120")
        assert waited.returncode == 125, (waited.stdout, waited.stderr)
        assert waited.stderr.startswith(f"{second} PENDING (DependencyNeverSatisfied): ")
        assert "will never start" in waited.stderr, waited.stderr
    finally:
        sandbox.run("scancel", second)
    cancelled = cj("wait", second, "--interval", "1", "--timeout", "120")
    assert (cancelled.returncode, cancelled.stdout) == (1, f"{second} CANCELLED\n")


def test_a_jobs_name_and_gpus_read_one_way_around_its_end(here: Path, sandbox: Sandbox) -> None:
    cluster = Cluster()
    job = cluster.submit(["sleep", "300"], gpus=1, model="V100", job_name="one-way")
    running = until(f"job {job.id} running", lambda: (r := one(cluster, job.id)).state
                    == "RUNNING" and r)  # fmt: skip
    sandbox.run("scancel", job.id)
    seen = {(running.source, running.name, running.gpus)}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # right after the cancel, as `status --watch` shows it
        row = one(cluster, job.id)
        seen.add((row.source, row.name, row.gpus))
        if row.source == "registry":
            break
    assert row.source == "registry", seen
    assert {(name, gpus) for _, name, gpus in seen} == {
        ("one-way", "gres/gpu:v100=1,gres/gpu=1")
    }, seen
