"""The requeue limit (`--max-requeues`) and resubmitting some of an array's tasks.

A job Slurm requeues again and again (preemption, node failure) once ran six times; the job
script now stops an attempt past its limit with exit 79, and status, wait, show and the API
say "requeued N times, limit M reached". `resubmit 7_2` runs that one task again, `resubmit
--failed 7` the tasks that did not complete, as one new array; `--array`, `--env`, `--venv`
change a resubmission; over `--host` a resubmission renders the job again (it once needed
`--same-script`). The real Slurm runs these in tests/e2e/test_requeue_resubmit.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from slurm_fake import FakeSlurm

from clusterjob import resources
from clusterjob.api import worker
from clusterjob.api.cluster import Cluster, _failed
from clusterjob.cli.app import run
from clusterjob.errors import ConfigError, UsageError
from clusterjob.jobs.registry import Registry
from clusterjob.jobs.status import status
from clusterjob.jobs.submit import (
    Changes,
    Submitted,
    array_ranges,
    provenance,
    rerun_tasks,
    resubmit,
    submit,
)
from clusterjob.jobs.wait import WaitResult
from clusterjob.jobscript import requeues
from clusterjob.jobscript.render import render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site.loader import load_site
from clusterjob.site.model import Site
from clusterjob.slurm import ssh
from clusterjob.slurm.commands import SlurmClient
from clusterjob.slurm.runner import Runner, SlurmResult, SshTransport

SITE = resources.site_configs_dir() / "mllab.yaml"


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CLUSTERJOB_STATUS_CACHE_SECONDS", "0")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "data"


@pytest.fixture
def mllab() -> Site:
    return load_site(SITE)


def submitted(site: Site, slurm: FakeSlurm, **fields: object) -> Submitted:
    request = JobRequest(script="true", command=True, gpus=0, **fields)  # type: ignore[arg-type]
    resolved = resolve(site, request, choose_interpreter=False)
    result = submit(site, resolved, render(site, resolved), client=slurm.client())
    assert isinstance(result, Submitted)
    return result


# --- the limit, as given and as the site says ------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ok"), [(0, True), (3, True), (250, True), (-1, False), (True, False), ("3", False)]
)
def test_a_limit_is_a_whole_number_of_requeues(value: object, ok: bool) -> None:
    if ok:
        assert requeues.check_max_requeues(value) == value
    else:
        with pytest.raises(UsageError, match=r"^--max-requeues .*: give a whole number"):
            requeues.check_max_requeues(value)


def test_the_limit_is_the_users_then_the_sites_then_three(tmp_path: Path, mllab: Site) -> None:
    def limit(site: Site, **fields: object) -> int:
        request = JobRequest(script="true", command=True, gpus=0, **fields)  # type: ignore[arg-type]
        return resolve(site, request, choose_interpreter=False).max_requeues

    assert limit(mllab) == 3
    assert limit(mllab, max_requeues=0) == 0
    text = SITE.read_text()
    assert "\ndefaults:" not in text  # the site below gives its own
    mine = tmp_path / "site.yaml"
    mine.write_text(text.replace("\nmodels:", "\ndefaults: {max_requeues: 1}\nmodels:", 1))
    site = load_site(mine)
    assert (limit(site), limit(site, max_requeues=5)) == (1, 5)
    mine.write_text(text.replace("\nmodels:", "\ndefaults: {max_requeues: -2}\nmodels:", 1))
    with pytest.raises(ConfigError, match=r"defaults.max_requeues: expected an integer >= 0"):
        load_site(mine)


def test_a_bad_limit_is_one_line_and_exit_2(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        run(["submit", "--site", str(SITE), "--max-requeues", "-1", "--dry-run", "--", "true"]) == 2
    )
    err = capsys.readouterr().err
    assert (
        err == "clusterjob: error: --max-requeues -1: give a whole number of requeues, 0 or more\n"
    )


# --- the job script enforces it ---------------------------------------------------------------


def run_attempt(
    script: str, tmp_path: Path, restarts: int | None
) -> subprocess.CompletedProcess[str]:
    """The script's lines up to the program, as one attempt of the job would run them."""
    head = script.split("\nset -euo pipefail\n", 1)[0] + "\necho program-ran\n"
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77"}
    if restarts is not None:
        env["SLURM_RESTART_COUNT"] = str(restarts)
    path = tmp_path / "job.sh"
    path.write_text(head)
    return subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=30)


def test_an_attempt_past_the_limit_stops_with_exit_79(tmp_path: Path, mllab: Site) -> None:
    request = JobRequest(script="true", command=True, gpus=0, max_requeues=2)
    resolved = resolve(mllab, request, choose_interpreter=False)
    script = render(mllab, resolved).script
    assert requeues.recorded_limit(script) == 2
    for restarts in (None, 0, 1, 2):
        ran = run_attempt(script, tmp_path, restarts)
        assert (ran.returncode, ran.stdout) == (0, "program-ran\n"), ran.stderr
    stopped = run_attempt(script, tmp_path, 3)
    assert stopped.returncode == requeues.LIMIT_EXIT == 79
    assert stopped.stdout == (
        "clusterjob: requeued 3 times, limit 2 reached (--max-requeues): stopping without "
        "running the program\n"
    )
    apart = render(mllab, resolve(mllab, replace(request, error="e.err"), choose_interpreter=False))
    both = run_attempt(apart.script, tmp_path, 3)
    assert both.returncode == 79 and both.stdout == both.stderr != ""  # with -e: in both files


def test_a_function_job_does_not_requeue_itself_past_its_limit() -> None:
    assert worker.LIMIT_EXIT == requeues.LIMIT_EXIT  # the worker runs without clusterjob
    reached = worker.requeue_limit_reached
    assert reached({}) is None  # a job script from before the limit
    assert reached({"CLUSTERJOB_MAX_REQUEUES": "2"}) is None
    assert reached({"CLUSTERJOB_MAX_REQUEUES": "2", "SLURM_RESTART_COUNT": "1"}) is None
    assert reached({"CLUSTERJOB_MAX_REQUEUES": "2", "SLURM_RESTART_COUNT": "2"}) == (
        "clusterjob: requeued 2 times, limit 2 reached (--max-requeues): not requeued again"
    )
    assert reached({"CLUSTERJOB_MAX_REQUEUES": "0"}) is not None


# --- how it is told -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "restarts", "text"),
    [
        (3, 4, "requeued 4 times, limit 3 reached"),
        (3, 3, "requeued 3 times, limit 3 reached"),  # a function job stops at its limit
        (0, 1, "requeued once, limit 0 reached"),
        (3, None, "requeued at least 3 times, limit 3 reached"),  # Slurm forgot the count
        (3, 1, "requeued at least 3 times, limit 3 reached"),  # a count seen earlier
        (1, None, "requeued at least once, limit 1 reached"),
    ],
)
def test_limit_text(limit: int, restarts: int | None, text: str) -> None:
    said = requeues.limit_text(limit, restarts)
    assert said == f"{text}: the job stopped itself (--max-requeues)"


@pytest.mark.parametrize(
    ("code", "script", "limit"),
    [
        (79, "export CLUSTERJOB_MAX_REQUEUES=3\n", 3),
        (79, "#!/bin/bash\n", None),  # the program's own 79, from a script without a limit
        (1, "export CLUSTERJOB_MAX_REQUEUES=3\n", None),
        (None, "export CLUSTERJOB_MAX_REQUEUES=3\n", None),
    ],
)
def test_stopped_at_limit(code: int | None, script: str, limit: int | None) -> None:
    assert requeues.stopped_at_limit(code, script) == limit


def test_status_wait_show_and_the_api_say_the_limit_was_reached(data: Path, mllab: Site) -> None:
    slurm = FakeSlurm("mllab")
    job = submitted(mllab, slurm, max_requeues=3).job_id
    other = submitted(mllab, slurm).job_id
    slurm.jobs[job].update(state="FAILED", exit_code="79:0", restarts="4", nodes="gpu1")
    slurm.jobs[other].update(state="FAILED", exit_code="1:0", nodes="gpu1")
    rows = status([job, other], client=slurm.client())
    said = "requeued 4 times, limit 3 reached: the job stopped itself (--max-requeues)"
    assert [(r.requeue_limit, r.restarts, r.explanation) for r in rows] == [
        (3, 4, said),
        (None, None, rows[1].explanation),
    ]
    assert "limit" not in rows[1].explanation
    assert str(WaitResult(rows, timed_out=False)).splitlines() == [
        f"{job} FAILED (exit 79): {said}",
        f"{other} FAILED (exit 1)",
    ]
    assert str(_failed(job, rows[0])) == f"job {job} ended FAILED (exit 79): {said}"
    slurm.forgotten.add(job)  # the registry alone, later
    (later,) = status([job], client=slurm.client())
    assert (later.source, later.explanation) == ("registry", said)
    info = provenance(job)
    assert (info["max_requeues"], info["restarts"], info["requeue_limit_reached"]) == (3, 4, said)
    assert provenance(other)["requeue_limit_reached"] is None


def test_show_prints_the_requeues(data: Path, mllab: Site, capsys, monkeypatch) -> None:
    slurm = FakeSlurm("mllab")
    monkeypatch.setattr(Cluster, "client", lambda self, budget=None: slurm.client())
    job = submitted(mllab, slurm, max_requeues=2).job_id
    assert run(["show", job]) == 0
    assert "requeues:       0 so far, at most 2\n" in capsys.readouterr().out
    slurm.jobs[job].update(state="FAILED", exit_code="79:0", restarts="3", nodes="gpu1")
    status([job], client=slurm.client())
    assert run(["show", job]) == 0
    assert "requeues:       requeued 3 times, limit 2 reached" in capsys.readouterr().out


# --- resubmit: one task, the failed tasks, changes ------------------------------------------------


@pytest.mark.parametrize(
    ("ids", "value"),
    [([2], "2"), ([1, 3], "1,3"), ([3, 1, 2, 7], "1-3,7"), ([0, 1, 5, 6, 9], "0-1,5-6,9")],
)
def test_array_ranges(ids: list[int], value: str) -> None:
    assert array_ranges(ids) == value


def test_rerun_tasks_are_those_that_did_not_complete() -> None:
    states = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
              "PREEMPTED", "RUNNING", "PENDING", "BOOT_FAIL", "DEADLINE"]  # fmt: skip
    assert rerun_tasks(list(enumerate(states))) == [1, 2, 3, 4, 5, 6, 9, 10]


def sweep_of_four(site: Site, slurm: FakeSlurm) -> str:
    """A 4-task sweep whose tasks 1 and 3 failed."""
    job = submitted(site, slurm, task_args=(("--lr=1",), ("--lr=2",), ("--lr=3",), ("--lr=4",)),
                    array="%2").job_id  # fmt: skip
    del slurm.jobs[f"{job}_[0-3%2]"]
    for task, (state, code) in enumerate(
        [("COMPLETED", "0:0"), ("FAILED", "3:0"), ("COMPLETED", "0:0"), ("TIMEOUT", "0:15")]
    ):
        slurm.jobs[f"{job}_{task}"] = slurm._fields(
            f"{job}_{task}", state, "None", exit_code=code, comment=f"clusterjob:{_token(job)}"
        )
    return job


def _token(job: str) -> str:
    record = Registry().get(job)
    assert record is not None
    return record.token


def test_resubmit_one_task_of_a_sweep(data: Path, mllab: Site) -> None:
    slurm = FakeSlurm("mllab")
    job = sweep_of_four(mllab, slurm)
    again = resubmit(f"{job}_2", site=mllab, client=slurm.client())
    new = Registry().get(again.job_id)
    assert new is not None and new.resubmit_of == f"{job}_2"
    assert "#SBATCH --array=2\n" in new.script
    assert "2) task_args=(--lr=3) ;;" in new.script  # task 2 keeps its own arguments
    for bad, message in [
        (f"{job}_9", f"job {job} has no task 9 (its tasks: 0-3)"),
    ]:
        with pytest.raises(UsageError) as info:
            resubmit(bad, site=mllab, client=slurm.client())
        assert str(info.value) == message


def test_resubmit_failed_tasks_is_one_array_of_them(data: Path, mllab: Site) -> None:
    slurm = FakeSlurm("mllab")
    job = sweep_of_four(mllab, slurm)
    again = resubmit(job, site=mllab, failed=True, client=slurm.client())
    new = Registry().get(again.job_id)
    assert new is not None and new.resubmit_of == job and again.tasks == 2
    assert "#SBATCH --array=1,3%2\n" in new.script  # the tasks, with the sweep's own limit
    assert "3) task_args=(--lr=4) ;;" in new.script
    # that resubmission, resubmitted whole, is its two tasks again (not the whole sweep)
    twice = Registry().get(resubmit(again.job_id, site=mllab, client=slurm.client()).job_id)
    assert twice is not None and "#SBATCH --array=1,3%2\n" in twice.script
    # --same-script: the recorded script, its --array line the failed tasks
    same = resubmit(job, failed=True, same_script=True, client=slurm.client())
    replayed = Registry().get(same.job_id)
    original = Registry().get(job)
    assert replayed is not None and original is not None
    assert replayed.script == original.script.replace(original.token, replayed.token).replace(
        "#SBATCH --array=0-3%2\n", "#SBATCH --array=1,3%2\n"
    )


def test_resubmit_failed_refusals(data: Path, mllab: Site) -> None:
    slurm = FakeSlurm("mllab")
    plain = submitted(mllab, slurm).job_id
    job = sweep_of_four(mllab, slurm)
    for task in range(4):
        slurm.jobs[f"{job}_{task}"].update(state="COMPLETED", exit_code="0:0")
    for args, kwargs, message in [
        (plain, {"failed": True}, f"job {plain} is not an array job: it has no tasks to "
         "resubmit with --failed"),
        (f"{plain}_1", {}, f"job {plain} is not an array job: it has no task 1"),
        (f"{job}_1", {"failed": True}, f"--failed takes an array job's id ({job}), not one of "
         "its tasks"),
        (job, {"failed": True, "changes": Changes(array="0-1")},
         "--array and a task id (or --failed) exclude each other: give one"),
        (job, {"failed": True}, f"job {job}: no task failed, was cancelled or timed out (4 "
         "tasks: 4 COMPLETED); nothing to resubmit"),
    ]:  # fmt: skip
        with pytest.raises(UsageError) as info:
            resubmit(args, site=mllab, client=slurm.client(), **kwargs)
        assert str(info.value) == message
    assert len(slurm.commands("sbatch")) == 2  # nothing more was submitted


def test_resubmit_with_array_env_and_venv(data: Path, mllab: Site, tmp_path: Path) -> None:
    slurm = FakeSlurm("mllab")
    job = submitted(mllab, slurm, env=("A=1", "B=2"), python=sys.executable).job_id
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    changes = Changes(array="0-4%2", env=("B=3", "C=4"), venv=str(venv))
    again = resubmit(job, site=mllab, changes=changes, client=slurm.client())
    new = Registry().get(again.job_id)
    assert new is not None
    assert "#SBATCH --array=0-4%2\n" in new.script
    assert "export A=1\nexport B=3\nexport C=4\n" in new.script
    assert f"export VIRTUAL_ENV={venv}\n" in new.script
    assert json.loads(new.request)["python_why"] == "--venv"
    with pytest.raises(UsageError, match="takes no changes"):
        resubmit(job, same_script=True, changes=Changes(env=("A=2",)), client=slurm.client())


def test_cli_resubmit_options(data: Path, mllab: Site, capsys, monkeypatch) -> None:
    slurm = FakeSlurm("mllab")
    monkeypatch.setattr(Cluster, "client", lambda self, budget=None: slurm.client())
    job = sweep_of_four(mllab, slurm)
    site = ["--site", str(SITE)]
    assert run(["resubmit", f"{job}_3", "--parsable", "--env", "X=1", *site]) == 0
    one = Registry().get(capsys.readouterr().out.strip())
    assert one is not None and "#SBATCH --array=3\n" in one.script and "export X=1\n" in one.script
    assert run(["resubmit", job, "--failed", "--json", *site]) == 0
    some = json.loads(capsys.readouterr().out)
    assert some["tasks"] == 2
    assert run(["resubmit", f"{job}_7", *site]) == 2
    assert (
        capsys.readouterr().err == f"clusterjob: error: job {job} has no task 7 (its tasks: 0-3)\n"
    )


class SlurmRecordsFirst(FakeSlurm):
    """sbatch finds the submission already in the registry (Ctrl-C safety, as submit)."""

    def _sbatch(self, cmd: list[str], timeout: float) -> SlurmResult:
        script = Path(cmd[-1]).read_text()
        pending = [r for r in Registry().pending() if r.token in script]
        assert len(pending) == 1, "not recorded before sbatch"
        return super()._sbatch(cmd, timeout)


def test_a_resubmission_is_recorded_before_sbatch(data: Path, mllab: Site) -> None:
    slurm = SlurmRecordsFirst("mllab")
    job = sweep_of_four(mllab, slurm)
    resubmit(f"{job}_1", site=mllab, client=slurm.client())
    resubmit(job, failed=True, client=slurm.client(), site=mllab)
    resubmit(job, failed=True, same_script=True, client=slurm.client())
    assert len(slurm.commands("sbatch")) == 4


class StdinSlurm(FakeSlurm):
    """A Slurm over ssh: sbatch reads the script from stdin."""

    def __init__(self, cluster: str) -> None:
        super().__init__(cluster)
        self.stdin: list[str | None] = []

    def __call__(self, cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        self.stdin.append(input)
        return super().__call__(cmd, timeout, input)

    def _sbatch(self, cmd: list[str], timeout: float) -> SlurmResult:
        script = self.stdin[-1]
        assert script is not None
        path = Path(tempfile.mkdtemp()) / "stdin.sh"
        path.write_text(script)
        return super()._sbatch([*cmd, str(path)], timeout)


def test_resubmit_over_ssh_renders_the_job_again(data: Path, mllab: Site) -> None:
    """It used to refuse without --same-script."""
    slurm = StdinSlurm("mllab")
    transport = SshTransport(ssh.parse_target("ada@login1"))
    client = SlurmClient(Runner(slurm, transport=transport, sleep=slurm.sleep, clock=slurm.clock))
    request = JobRequest(script="true", command=True, gpus=0, python="/opt/py/bin/python3",
                         python_why="the site's job python")  # fmt: skip
    resolved = resolve(mllab, request, choose_interpreter=False)
    first = submit(mllab, resolved, render(mllab, resolved), client=client, workdir="/r/work")
    assert isinstance(first, Submitted)
    cluster = Cluster(str(SITE), host="ada@login1", exec=slurm, poll_interval=3600)
    again = cluster.resubmit(first.job_id, changes=Changes(time="0:10:00"))
    new = Registry(host="ada@login1").get(again.job_id)
    assert new is not None and new.resubmit_of == first.job_id and new.work_dir == "/r/work"
    assert "#SBATCH --time=0:10:00\n" in new.script and "python=/opt/py/bin/python3\n" in new.script
    assert json.loads(new.request)["python_why"] == "the site's job python"
    assert slurm.stdin[-1] == new.script
    assert slurm.commands("sbatch")[-1] == ["sbatch", "--parsable", "--chdir=/r/work"]
