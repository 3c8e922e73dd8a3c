"""The requeue limit and resubmitting some tasks, on the real local cluster: a job requeued
past its `--max-requeues` stops with the message (and status, wait and the API say so),
`resubmit ID_2` runs that one task, and `resubmit --failed` of a 4-task sweep whose 2 tasks
failed submits a 2-task array of those."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterjob.api.cluster import Cluster
from clusterjob.errors import JobFailed
from clusterjob.jobs.registry import Registry

from .conftest import REQUEUED_START, Cli, Sandbox, one, until

pytestmark = pytest.mark.slurm

SAID = "requeued 2 times, limit 1 reached: the job stopped itself (--max-requeues)"


def waited(cj: Cli, job: str) -> tuple[int, str, str]:
    done = cj("wait", job, "--interval", "1", "--timeout", "240", timeout=270)
    return done.returncode, done.stdout, done.stderr


def test_a_job_requeued_past_its_limit_stops_and_says_so(
    here: Path, sandbox: Sandbox, cj: Cli
) -> None:
    cluster = Cluster(poll_interval=0.5)
    job = cluster.submit(["sleep", "300"], requeue=True, max_requeues=1, time="0:10:00")
    for attempt in (1, 2):
        until(f"job {job.id} running", lambda: one(cluster, job.id).state == "RUNNING")
        sandbox.run("scontrol", "requeue", job.id)
        until(
            f"job {job.id} waiting after requeue {attempt}",
            lambda: one(cluster, job.id).reason == "BeginTime",
        )
        sandbox.run("scontrol", "update", f"JobId={job.id}", REQUEUED_START)
    ended = until(
        f"job {job.id} stopped at its limit",
        lambda: (r := one(cluster, job.id)).exit_code is not None and r,
    )
    assert (ended.state, ended.exit_code, ended.requeue_limit) == ("FAILED", 79, 1), ended
    assert ended.explanation == SAID, ended
    assert int(sandbox.job(job.id)["Restarts"]) == 2  # Slurm did not start it a third time
    code, out, _ = waited(cj, job.id)
    assert (code, out) == (79, f"{job.id} FAILED (exit 79): {SAID}\n")
    log = cj("logs", job.id).stdout
    assert "attempt 3" not in log, log  # the third attempt stopped before anything ran
    assert log.endswith(
        "clusterjob: requeued 2 times, limit 1 reached (--max-requeues): stopping without "
        "running the program\n"
    ), log
    with pytest.raises(JobFailed) as failed:
        job.result(timeout=120)
    assert str(failed.value) == f"job {job.id} ended FAILED (exit 79): {SAID}"
    shown = cj("show", job.id)
    assert f"requeues:       {SAID}" in shown.stdout, shown.stdout


def test_resubmit_one_task_runs_exactly_that_task(here: Path, sandbox: Sandbox, cj: Cli) -> None:
    first = cj("submit", "--parsable", "--array", "0-3", "--", "bash", "-c",
               'echo "task=$SLURM_ARRAY_TASK_ID"')  # fmt: skip
    assert first.returncode == 0, first.stderr
    job = first.stdout.strip()
    assert waited(cj, job)[0] == 0
    again = cj("resubmit", f"{job}_2", "--json")
    assert again.returncode == 0, again.stderr
    new = json.loads(again.stdout)["job_id"]
    assert waited(cj, new)[0] == 0
    rows = json.loads(cj("status", new, "--tasks", "--json").stdout)
    assert [t["job_id"] for t in rows[0]["tasks"]] == [f"{new}_2"], rows
    assert cj("logs", f"{new}_2").stdout == "task=2\n"
    record = Registry().get(new)
    assert record is not None and record.resubmit_of == f"{job}_2"


def test_resubmit_failed_of_a_sweep_is_an_array_of_the_failed_tasks(
    here: Path, sandbox: Sandbox, cj: Cli
) -> None:
    first = cj("submit", "--parsable", "--sweep", "ok=yes,no,yes,no", "--", "bash", "-c",
               'test "$1" = --ok=yes', "task")  # fmt: skip
    assert first.returncode == 0, first.stderr
    job = first.stdout.strip()
    assert waited(cj, job)[0] == 1
    again = cj("resubmit", job, "--failed", "--json")
    assert again.returncode == 0, again.stderr
    resubmitted = json.loads(again.stdout)
    assert resubmitted["tasks"] == 2
    new = resubmitted["job_id"]
    waited(cj, new)
    rows = json.loads(cj("status", new, "--tasks", "--json").stdout)
    tasks = [(t["job_id"], t["state"], t["params"]) for t in rows[0]["tasks"]]
    assert tasks == [(f"{new}_1", "FAILED", "--ok=no"), (f"{new}_3", "FAILED", "--ok=no")], rows
    assert rows[0]["tasks_summary"] == "2 tasks: 2 FAILED (exit 1)", rows
