"""Arrays, sweeps, wait, and the other parts of a job's life after submit, over the fake
Slurm (tests/slurm_fake.py) and over output recorded from the local cluster."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from slurm_fake import FakeSlurm

from clusterjob.api.cluster import Cluster
from clusterjob.cli.app import run
from clusterjob.errors import UsageError
from clusterjob.jobs import status as job_status
from clusterjob.jobs.logs import output_path
from clusterjob.jobs.registry import SCHEMA_VERSION, JobRecord, Registry
from clusterjob.jobs.status import StatusCache, StatusFilter, array_spec, status
from clusterjob.jobs.wait import wait
from clusterjob.slurm import parse
from clusterjob.slurm.commands import SlurmClient
from clusterjob.slurm.runner import Runner, SlurmResult
from clusterjob.slurm.syntax import array_task_ids

SLURM_FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def track_array(
    registry: Registry,
    job_id: str,
    spec: str,
    *,
    cluster: str = "fake",
    request: dict[str, object] | None = None,
    output: str | None = None,
    token: str | None = None,
    submitted_at: float | None = None,
) -> JobRecord:
    script = f"#!/bin/bash\n#SBATCH --array={spec}\n"
    if output:
        script += f"#SBATCH --output={output}\n"
    record = JobRecord(
        job_id=job_id,
        cluster=cluster,
        site="mllab",
        token=token or f"tok{job_id}",
        job_name="sweep",
        script=script + "#SBATCH --comment=clusterjob:tok\n",
        script_path="",
        command_line="",
        work_dir="/home/ana/run",
        git_commit=None,
        submitted_at=time.time() if submitted_at is None else submitted_at,
        state="PENDING",
        request=json.dumps(request) if request else None,
    )
    registry.add(record)
    return record


def ten_task_array(slurm: FakeSlurm) -> str:
    tasks = {n: ("COMPLETED", "0:0") for n in range(10)}
    tasks[3] = ("FAILED", "7:0")
    tasks[9] = ("RUNNING", "0:0")
    job = slurm.add_array(tasks)
    for n in range(5):  # ended over MinJobAge ago: only sacct knows them
        slurm.forgotten.add(f"{job}_{n}")
    return job


# --- arrays -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "ids"),
    [
        ("0-9%2", list(range(10))),
        ("[2-5%2]", [2, 3, 4, 5]),
        ("1,3,8-15:4", [1, 3, 8, 12]),
        ("7", [7]),
    ],
)
def test_array_task_ids(spec: str, ids: list[int]) -> None:
    assert array_task_ids(spec) == ids


@pytest.mark.parametrize(
    ("script", "spec"),
    [
        ("#!/bin/bash\n#SBATCH --array=0-9%2\necho\n", "0-9%2"),
        ("#SBATCH --array 1,3\n", "1,3"),
        ('#!/bin/sh\n#SBATCH  -a"4-7"\n', "4-7"),
        ("#!/bin/sh\n#SBATCH -a 5\n", "5"),
        ("#!/bin/bash\n#SBATCH --gpus=1\n", None),
        ("#!/bin/bash\necho '#SBATCH --array=1-3'\n", None),  # not at a line's start
        ("#!/bin/bash\nx#SBATCH --array=1-3\n#SBATCH --array=2-4\n", "2-4"),
        ("#!/bin/bash\n# SBATCH --array=1-3\n", None),
        ("#!/bin/bash\n#SBATCH --arrays=1-3\n", None),
    ],
)
def test_array_spec_reads_an_array_line_at_a_line_start(script: str, spec: str | None) -> None:
    assert array_spec(script) == spec


@pytest.mark.parametrize("spec", ["", "a-b", "5-1", "0-9%x", "0-3:0", "0-2000000"])
def test_bad_array_specs(spec: str) -> None:
    with pytest.raises(ValueError):
        array_task_ids(spec)


def test_an_array_is_one_row_summing_up_its_tasks(data: Path) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    job = ten_task_array(slurm)
    track_array(registry, job, "0-9%2")
    (row,) = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert row.state == "RUNNING"
    assert row.tasks_summary == "10 tasks: 8 COMPLETED, 1 FAILED (exit 7), 1 RUNNING"
    assert row.exit_code is None and row.tasks == ()
    assert len(slurm.calls) == 2  # one squeue, one sacct: no scontrol per task
    assert not parse.is_final(registry.get(job).state)

    slurm.jobs[f"{job}_9"]["state"] = "COMPLETED"
    (row,) = status(
        [job], tasks=True, client=slurm.client(), registry=registry, cache=StatusCache(ttl=0)
    )
    assert (row.state, row.exit_code) == ("FAILED", 7)
    assert row.tasks_summary == "10 tasks: 9 COMPLETED, 1 FAILED (exit 7)"
    states = {t.job_id: (t.state, t.exit_code, t.reason, t.site) for t in row.tasks}
    assert states[f"{job}_3"] == ("FAILED", 7, None, "mllab")
    assert states[f"{job}_0"] == ("COMPLETED", 0, None, "mllab")
    assert len(states) == 10

    # the end is recorded with every task: no Slurm call for it again, tasks still listed
    calls = len(slurm.calls)
    (again,) = status([job], tasks=True, client=slurm.client(), registry=registry)
    assert len(slurm.calls) == calls
    assert (again.source, again.state, again.tasks_summary) == (
        "registry",
        "FAILED",
        row.tasks_summary,
    )
    assert [t.state for t in again.tasks] == [t.state for t in row.tasks]


def test_a_task_has_its_own_state_reason_and_site(data: Path) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    job = slurm.add_array({0: ("COMPLETED", "0:0"), 1: ("RUNNING", "0:0")}, pending="2-5%2")
    slurm.jobs[f"{job}_0"]["reason"] = "JobArrayTaskLimit"  # what sacct keeps for it
    track_array(registry, job, "0-5%2")
    (whole,) = status([job], client=slurm.client(), registry=registry)
    assert (whole.state, whole.reason) == ("RUNNING", None)
    assert whole.tasks_summary == "6 tasks: 1 COMPLETED, 1 RUNNING, 4 PENDING"
    (done,) = status([f"{job}_0"], client=slurm.client(), registry=registry)
    assert (done.job_id, done.state, done.reason, done.site) == (
        f"{job}_0",
        "COMPLETED",
        None,
        "mllab",
    )
    (waiting,) = status([f"{job}_4"], client=slurm.client(), registry=registry)
    assert (waiting.state, waiting.reason, waiting.site) == (
        "PENDING",
        "JobArrayTaskLimit",
        "mllab",
    )
    assert "%" in waiting.explanation and "at once" in waiting.explanation
    with pytest.raises(UsageError, match="no task 9"):
        status([f"{job}_9"], client=slurm.client(), registry=registry)
    # an array clusterjob did not submit: a pending task is found in its range
    (other,) = status([f"{job}_5"], client=slurm.client(), registry=Registry(data / "o.db"))
    assert (other.job_id, other.state) == (f"{job}_5", "PENDING")
    (stranger,) = status([job], client=slurm.client(), registry=Registry(data / "o.db"))
    assert (stranger.job_id, stranger.state, stranger.site) == (job, "RUNNING", "")
    assert stranger.tasks_summary == "6 tasks: 1 COMPLETED, 1 RUNNING, 4 PENDING"


def test_a_throttled_array_waits_for_its_limit_not_for_resources(data: Path) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    job = slurm.add_array({}, pending="0-9%2")
    track_array(registry, job, "0-9%2")
    (row,) = status(client=slurm.client(), registry=registry)
    assert (row.state, row.reason) == ("PENDING", "JobArrayTaskLimit")
    assert row.tasks_summary == "10 tasks: 10 PENDING"
    assert "at once" in row.explanation


@pytest.mark.parametrize("n", [100, 1000])
def test_a_big_arrays_status_is_at_most_one_squeue_and_one_sacct(data: Path, n: int) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    tasks = {i: ("COMPLETED", "0:0") for i in range(n - 20)}
    tasks.update({i: ("RUNNING", "0:0") for i in range(n - 20, n - 10)})
    tasks[7] = ("FAILED", "7:0")
    job = slurm.add_array(tasks, pending=f"{n - 10}-{n - 1}%10")
    slurm.forgotten.update(f"{job}_{i}" for i in range(n - 30))
    track_array(registry, job, f"0-{n - 1}%10")
    (row,) = status([job], tasks=True, client=slurm.client(), registry=registry)
    assert len(slurm.commands("squeue")) == 1 and len(slurm.commands("sacct")) == 1
    assert len(slurm.calls) == 2
    assert len(row.tasks) == n
    assert (
        row.tasks_summary
        == f"{n} tasks: {n - 21} COMPLETED, 1 FAILED (exit 7), 10 RUNNING, 10 PENDING"
    )


def test_recorded_array_output_from_the_local_cluster(data: Path) -> None:
    """squeue/sacct output recorded on the local cluster: a 6-task `0-5%2` array whose task
    3 exits 7, while running (sacct had no line yet) and once done."""

    def exec_(name: str):
        def answer(cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
            tool = cmd[0]
            text = (
                (SLURM_FIXTURES / f"{tool}_array_{name}_sandbox.txt").read_text()
                if (SLURM_FIXTURES / f"{tool}_array_{name}_sandbox.txt").exists()
                else ""
            )
            return SlurmResult(tuple(cmd), 0, text, "")

        return answer

    registry = Registry()
    from datetime import datetime

    submitted = datetime(2026, 12, 1, 14, 53, 17).timestamp()  # as the recording says
    track_array(
        registry, "516", "0-5%2", cluster="sandbox", token="recarray01", submitted_at=submitted
    )
    running = SlurmClient(Runner(exec_("running")))
    (row,) = status(
        ["516"], tasks=True, client=running, registry=registry, cache=StatusCache(ttl=0)
    )
    assert row.state == "RUNNING"
    assert row.tasks_summary == "6 tasks: 2 RUNNING, 4 PENDING"
    assert row.reason is None
    done = SlurmClient(Runner(exec_("done")))
    (row,) = status(["516"], tasks=True, client=done, registry=registry, cache=StatusCache(ttl=0))
    assert (row.state, row.exit_code) == ("FAILED", 7)
    assert row.tasks_summary == "6 tasks: 5 COMPLETED, 1 FAILED (exit 7)"
    task3 = next(t for t in row.tasks if t.job_id == "516_3")
    assert (task3.state, task3.exit_code, task3.nodes) == ("FAILED", 7, "gpu1")
    assert all(t.reason is None for t in row.tasks if t.state == "COMPLETED")


def test_logs_of_an_array_task_never_use_slurms_no_val(data: Path) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    job = slurm.add_array({3: ("FAILED", "7:0")}, pending="4-9")
    track_array(registry, job, "0-9%2")
    with pytest.raises(UsageError, match=rf"array of 10 tasks.*logs {job}_0"):
        output_path(job, client=slurm.client(), registry=registry)
    # scontrol's path while Slurm remembers the task
    slurm.jobs[f"{job}_3"]["stdout"] = f"/home/ana/run/slurm-{job}_3.out"
    assert output_path(f"{job}_3", client=slurm.client()) == Path(
        f"/home/ana/run/slurm-{job}_3.out"
    )
    assert output_path(job, task=3, client=slurm.client()) == Path(
        f"/home/ana/run/slurm-{job}_3.out"
    )
    # forgotten: the script's pattern (default slurm-%A_%a.out), expanded for the task
    slurm.forgotten.add(f"{job}_3")
    slurm.jobs[f"{job}_3"]["stdout"] = "/x/slurm-4294967294.out"
    slurm.forgotten_by_scontrol.add(f"{job}_3")
    assert output_path(f"{job}_3", client=slurm.client()) == Path(
        f"/home/ana/run/slurm-{job}_3.out"
    )
    other = slurm.add_array({}, pending="0-1")
    track_array(registry, other, "0-1", output="logs/%x-%A_%3a.out")
    slurm.forgotten_by_scontrol.add(f"{other}_1")
    assert output_path(f"{other}_1", client=slurm.client()) == Path(
        f"/home/ana/run/logs/sweep-{other}_001.out"
    )
    with pytest.raises(UsageError, match="no task 5"):
        output_path(f"{other}_5", client=slurm.client())
    # an array clusterjob did not submit: scontrol names the array's own record with NO_VAL
    stranger = slurm.add_job(state="PENDING", stdout="/w/slurm-%j_4294967294.out")
    with pytest.raises(UsageError, match=rf"is an array: name one task.*{stranger}_0"):
        output_path(stranger, client=slurm.client(), registry=Registry(data / "o.db"))


# --- wait -------------------------------------------------------------------------------------


def test_wait_returns_the_jobs_exit_code(data: Path) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    job = slurm.add_job(state="RUNNING", reason="None")
    registry.add(JobRecord(job, "fake", "s", "t1", "train", "#!", "", "", "/w", None, time.time()))
    polls: list[float] = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        slurm.jobs[job].update(state="FAILED", exit_code="3:0")

    result = wait(
        [job],
        interval=5,
        client=slurm.client(),
        registry=registry,
        sleep=sleep,
        cache=StatusCache(ttl=0),
    )
    assert (result.exit_code, result.timed_out, polls) == (3, False, [5])
    assert "FAILED (exit 3)" in str(result)


def test_wait_for_an_array_is_non_zero_if_any_task_failed(data: Path) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    job = ten_task_array(slurm)
    track_array(registry, job, "0-9")

    def sleep(seconds: float) -> None:
        slurm.jobs[f"{job}_9"]["state"] = "COMPLETED"

    result = wait(
        [job],
        interval=1,
        client=slurm.client(),
        registry=registry,
        sleep=sleep,
        cache=StatusCache(ttl=0),
    )
    assert result.exit_code == 7
    assert "1 FAILED (exit 7)" in str(result)


def test_wait_polls_for_the_code_of_a_task_squeue_shows_failed_before_sacct(data: Path) -> None:
    # Seen in a CI run: the array read FAILED while sacct had not recorded task 3's end (so
    # its code), and `wait` exited 1 instead of 7.
    slurm = FakeSlurm()
    registry = Registry()
    job = ten_task_array(slurm)
    slurm.jobs[f"{job}_9"]["state"] = "COMPLETED"
    slurm.forgotten.discard(f"{job}_3")  # squeue still shows the failed task...
    slurm.unrecorded_end.add(f"{job}_3")  # ...and sacct has not recorded its end
    track_array(registry, job, "0-9")
    polls: list[float] = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        slurm.unrecorded_end.clear()

    result = wait([job], interval=1, client=slurm.client(), registry=registry, sleep=sleep,
                  cache=StatusCache(ttl=0))  # fmt: skip
    assert (result.exit_code, polls) == (7, [1])


@pytest.mark.parametrize(
    ("squeue_code", "exit_code", "waited"),
    [
        ("2:0", 2, 0),  # squeue's exit code, taken at once
        ("4294967294", 1, 30),  # Slurm's NO_VAL: an end without a code, final after the grace
    ],
)
def test_wait_without_accounting_takes_squeues_exit_code(
    data: Path, squeue_code: str, exit_code: int, waited: int
) -> None:
    slurm = FakeSlurm(accounting=False)  # no sacct: squeue's code is the only one
    registry = Registry()
    job = slurm.add_job(state="FAILED", reason="NonZeroExitCode", exit_code=squeue_code)
    registry.add(JobRecord(job, "fake", "s", "t1", "train", "#!", "", "", "/w", None, time.time()))
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    result = wait([job], interval=10, client=slurm.client(), registry=registry, sleep=sleep,
                  clock=lambda: clock[0], cache=StatusCache(ttl=0))  # fmt: skip
    assert (result.exit_code, result.timed_out, clock[0]) == (exit_code, False, waited)


def test_wait_times_out_with_124(data: Path) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    job = slurm.add_job(state="RUNNING", reason="None")
    registry.add(JobRecord(job, "fake", "s", "t1", "train", "#!", "", "", "/w", None, time.time()))
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    result = wait(
        [job], timeout=30, interval=10, client=slurm.client(), registry=registry,
        sleep=sleep, clock=lambda: clock[0],
    )  # fmt: skip
    assert (result.timed_out, result.exit_code) == (True, 124)
    assert clock[0] == 30


def test_wait_ends_for_a_job_whose_dependency_can_never_be_satisfied(
    data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm keeps such a job PENDING forever (unless the site sets kill_invalid_depend):
    `wait` says so and exits 125, after the other jobs named have ended."""
    slurm = FakeSlurm()
    monkeypatch.setattr(Cluster, "client", lambda self, budget=None: slurm.client())
    registry = Registry()
    stuck = slurm.add_job(state="PENDING", reason="DependencyNeverSatisfied")
    running = slurm.add_job(state="RUNNING", reason="None")
    for n, job in enumerate((stuck, running)):
        registry.add(JobRecord(job, "fake", "s", f"t{n}", "x", "#!", "", "", "/w", None,
                               time.time()))  # fmt: skip
    polls: list[float] = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        assert len(polls) < 5, "wait did not end"
        slurm.jobs[running].update(state="COMPLETED", exit_code="0:0")

    result = wait([stuck, running], interval=5, client=slurm.client(), registry=registry,
                  sleep=sleep, cache=StatusCache(ttl=0))  # fmt: skip
    assert (result.exit_code, result.timed_out, result.ended, polls) == (125, False, False, [5])
    assert str(result).splitlines() == [
        f"{stuck} PENDING (DependencyNeverSatisfied): a job it depends on failed or was "
        "cancelled, so it will never start: cancel it",
        f"{running} COMPLETED (exit 0)",
    ]
    assert run(["wait", stuck, "--interval", "1"]) == 125
    out = capsys.readouterr()
    assert out.out == "" and "will never start" in out.err and out.err.count("\n") == 1


@pytest.mark.parametrize(
    ("state", "code", "line", "exit_code"),
    [
        ("CANCELLED", "0:0", "CANCELLED", 1),  # cancelled while pending: no program ran
        ("CANCELLED", "0:15", "CANCELLED", 1),  # cancelled while running: killed by signal
        ("TIMEOUT", "0:0", "TIMEOUT", 1),
        ("FAILED", "2:0", "FAILED (exit 2)", 2),
        ("COMPLETED", "0:0", "COMPLETED (exit 0)", 0),
    ],
)
def test_wait_shows_an_exit_code_only_where_the_program_gave_one(
    data: Path, state: str, code: str, line: str, exit_code: int
) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    job = slurm.add_job(state=state, reason="None", exit_code=code)
    registry.add(JobRecord(job, "fake", "s", "t1", "x", "#!", "", "", "/w", None, time.time()))
    result = wait([job], interval=1, client=slurm.client(), registry=registry,
                  sleep=lambda s: None, cache=StatusCache(ttl=0))  # fmt: skip
    assert (str(result), result.exit_code) == (f"{job} {line}", exit_code)


def test_cli_wait_exits_with_the_code_and_bad_input_is_exit_2(data, capsys, monkeypatch) -> None:
    slurm = FakeSlurm()
    monkeypatch.setattr(Cluster, "client", lambda self, budget=None: slurm.client())

    monkeypatch.setattr(Cluster, "client", lambda self, budget=None: slurm.client())
    job = slurm.add_job(state="COMPLETED", reason="None", exit_code="0:0")
    Registry().add(
        JobRecord(job, "fake", "s", "t1", "train", "#!", "", "", "/w", None, time.time())
    )
    assert run(["wait", job]) == 0
    slurm.jobs[job].update(state="FAILED", exit_code="5:0")
    other = slurm.add_job(state="FAILED", reason="None", exit_code="5:0")
    Registry().add(JobRecord(other, "fake", "s", "t2", "x", "#!", "", "", "/w", None, time.time()))
    assert run(["wait", "last"]) == 5
    capsys.readouterr()
    assert run(["wait", "nope"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# --- status filters and the table -------------------------------------------------------------


def test_status_filters(data: Path) -> None:
    now = time.time()
    rows = [
        job_status.JobStatus("1", "c", "lr-1", "FAILED", None, "", None, None, 1, None, "s", "x"),
        job_status.JobStatus(
            "2", "c", "bs-2", "RUNNING", None, "", None, None, None, None, "s", "x"
        ),
    ]
    old = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now - 7200))
    rows[0] = job_status.JobStatus(**{**rows[0].to_dict(), "submitted": old})  # type: ignore[arg-type]
    fresh = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now - 60))
    rows[1] = job_status.JobStatus(**{**rows[1].to_dict(), "submitted": fresh})  # type: ignore[arg-type]
    pick = lambda **kw: [r.job_id for r in StatusFilter.parse(now=now, **kw).apply(rows)]  # noqa: E731
    assert pick(state="failed") == ["1"]
    assert pick(state="FAILED,RUNNING") == ["1", "2"]
    assert pick(name="lr*") == ["1"]
    assert pick(since="1h") == ["2"]
    assert pick(since="3h") == ["1", "2"]
    with pytest.raises(UsageError, match="--since"):
        StatusFilter.parse(since="yesterday")


def test_cli_status_tasks_table(data, capsys, monkeypatch) -> None:
    slurm = FakeSlurm()
    monkeypatch.setattr(Cluster, "client", lambda self, budget=None: slurm.client())
    job = ten_task_array(slurm)
    track_array(
        registry := Registry(),
        job,
        "0-9",
        request={"task_args": [[f"--lr={i}"] for i in range(10)]},
    )
    assert registry.get(job) is not None
    assert run(["status", job, "--tasks"]) == 0
    out = capsys.readouterr().out
    assert "PARAMS" in out.splitlines()[0]
    assert f"{job}: 10 tasks: 8 COMPLETED, 1 FAILED (exit 7), 1 RUNNING" in out
    line3 = next(ln for ln in out.splitlines() if ln.startswith(f"{job}_3 "))
    assert "FAILED (7)" in line3 and "--lr=3" in line3 and "mllab" in line3
    assert run(["status", job, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["tasks_summary"].startswith("10 tasks") and row["tasks"] == []


# --- sweeps, signals, requests ----------------------------------------------------------------


def test_sweep_is_the_cartesian_product_last_varying_fastest() -> None:
    from clusterjob.jobscript.request import sweep_task_args

    assert sweep_task_args(["lr=1e-4,3e-4", "bs=32,64"]) == (
        ("--lr=1e-4", "--bs=32"),
        ("--lr=1e-4", "--bs=64"),
        ("--lr=3e-4", "--bs=32"),
        ("--lr=3e-4", "--bs=64"),
    )


@pytest.mark.parametrize(
    ("sweeps", "words"),
    [
        (["lr"], "NAME=V1,V2"),
        (["=1,2"], "NAME=V1,V2"),
        (["lr=1,,2"], "empty value"),
        (["lr=1", "lr=2"], "twice"),
        (["l r=1"], "NAME=V1,V2"),
    ],
)
def test_bad_sweeps_are_one_line_errors(sweeps: list[str], words: str) -> None:
    from clusterjob.jobscript.request import sweep_task_args

    with pytest.raises(UsageError, match=words):
        sweep_task_args(sweeps)


def test_params_lines_are_shell_words_or_json() -> None:
    from clusterjob.jobscript.request import params_task_args

    text = '# header\n--lr 1e-4\n\n--name \'two words\'\n["--x", "$(y)"]\n'
    assert params_task_args(text) == (("--lr", "1e-4"), ("--name", "two words"), ("--x", "$(y)"))
    bad_files = [
        ("", "no task lines"),
        ("--a 'open\n", ":1: cannot split"),
        ("[1, 2]\n", "list of strings"),
        ("[oops\n", "not a JSON list"),
    ]
    for bad, words in bad_files:
        with pytest.raises(UsageError, match=words):
            params_task_args(bad, "p.txt")


@pytest.fixture
def mllab():
    from clusterjob import resources
    from clusterjob.site.loader import load_site

    return load_site(resources.site_configs_dir() / "mllab.yaml")


def test_a_sweep_becomes_one_array_and_signal_goes_to_the_batch_shell(mllab) -> None:
    from clusterjob.jobscript.request import JobRequest, resolve

    job = resolve(
        mllab,
        JobRequest(
            "train.py", gpus=1, model="a100", array="%2", signal="USR1@90",
            task_args=(("--a=1",), ("--a=2",), ("--a=3",)),
        ),
    )  # fmt: skip
    assert job.request.array == "0-2%2"
    assert job.request.signal == "B:USR1@90"
    assert len(job.notes) == 1 and "B:USR1@90" in job.notes[0]
    two = resolve(mllab, JobRequest("train.py", gpus=1, model="v100", nodes=2, signal="USR1@9"))
    assert two.request.signal == "USR1@9" and two.notes == ()  # several nodes: the steps get it
    for request, words in [
        (JobRequest("t.py", model="a100", array="0-3", task_args=(("x",),)), "only a limit"),
        (JobRequest("t.py", model="a100", array="3-1"), "--array"),
        (JobRequest("t.py", model="a100", signal="USR1@@"), "--signal"),
    ]:
        with pytest.raises(UsageError, match=words):
            resolve(mllab, request)


def test_output_directories_must_exist_or_are_made(tmp_path: Path) -> None:
    from clusterjob.jobs.submit import check_output_dirs

    check_output_dirs("slurm-%j.out", "/tmp/%j/x.err", tmp_path)  # nothing to check
    with pytest.raises(UsageError, match=r"--output logs/%j.out: directory .*logs does not exist"):
        check_output_dirs("logs/%j.out", None, tmp_path)
    assert check_output_dirs("logs/%j.out", "errs/x", tmp_path, mkdir=True) == [
        tmp_path / "logs",
        tmp_path / "errs",
    ]
    assert check_output_dirs("logs/%j.out", None, tmp_path) == []


def test_last_in_a_dependency(data: Path) -> None:
    from clusterjob.jobs.submit import expand_dependency

    registry = Registry()
    with pytest.raises(UsageError, match="not submitted any job"):
        expand_dependency("afterok:last", registry)
    for n in (10, 11, 12):
        registry.add(JobRecord(str(n), "c", "s", f"t{n}", "x", "#!", "", "", "/w", None, n))
    assert expand_dependency("afterok:last", registry) == "afterok:12"
    assert expand_dependency("afterok:last~1:last~2,afterany:5", registry) == (
        "afterok:11:10,afterany:5"
    )
    assert expand_dependency("singleton", registry) == "singleton"
    assert expand_dependency("after:last+5", registry) == "after:12+5"
    with pytest.raises(UsageError, match="4 jobs"):
        expand_dependency("afterok:last~3", registry)


# --- submit --json/--parsable, resubmit with changes, show ------------------------------------


TRAIN = str(Path(__file__).resolve().parent.parent / "examples" / "train.py")


def test_cli_submit_json_parsable_and_resubmit_with_changes(
    data: Path, capsys, monkeypatch, tmp_path: Path
) -> None:
    from clusterjob import resources

    slurm = FakeSlurm(cluster="mllab")
    monkeypatch.setattr(Cluster, "client", lambda self, budget=None: slurm.client())
    monkeypatch.chdir(tmp_path)
    site = ["--site", str(resources.site_configs_dir() / "mllab.yaml")]
    assert (
        run(["submit", TRAIN, "--gpus", "1", "-m", "a100", "--json", *site, "--", "--lr", "1"]) == 0
    )
    first = json.loads(capsys.readouterr().out)
    assert first["cluster"] == "mllab" and first["sbatch_command"].startswith("sbatch --parsable")
    assert run(["submit", TRAIN, "--gpus", "1", "-m", "a100", "--parsable", *site,
                "--sweep", "lr=1,2,3", "-d", "afterok:last"]) == 0  # fmt: skip
    sweep_id = capsys.readouterr().out.strip()
    assert sweep_id.isdigit() and len(slurm.commands("sbatch")) == 2
    record = Registry().get(sweep_id)
    assert f"--dependency=afterok:{first['job_id']}\n" in record.script
    assert "#SBATCH --array=0-2\n" in record.script

    assert run(["resubmit", first["job_id"], "--gpus", "2", "--json", *site, "--", "--new"]) == 0
    again = json.loads(capsys.readouterr().out)
    new = Registry().get(again["job_id"])
    assert new.resubmit_of == first["job_id"]
    assert "--gres=gpu:a100:2" in new.script and "train.py --new\n" in new.script
    assert run(["resubmit", sweep_id, "--parsable", *site]) == 0
    resweep = Registry().get(capsys.readouterr().out.strip())
    assert "#SBATCH --array=0-2\n" in resweep.script and "--dependency" in resweep.script
    assert run(["resubmit", first["job_id"], "--same-script", "--parsable"]) == 0
    same = Registry().get(capsys.readouterr().out.strip())
    old = Registry().get(first["job_id"])
    assert same.script == old.script.replace(old.token, same.token)
    capsys.readouterr()
    assert run(["resubmit", first["job_id"], "--same-script", "--gpus", "2"]) == 2
    assert "takes no changes" in capsys.readouterr().err

    assert run(["show", first["job_id"]]) == 0
    out = capsys.readouterr().out
    assert "command line:" in out and f"working dir:    {tmp_path}" in out
    assert run(["show", again["job_id"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["resubmit_of"] == first["job_id"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--sweep", "lr"],
        ["--sweep", "lr=1", "--params", "p.txt"],
        ["--params", "missing.txt"],
        ["--array", "5-1"],
        ["--json", "--parsable"],
        ["-o", "nodir/x.out"],
        ["-d", "afterok:last~5"],
        ["--signal", "USR1@x"],
    ],
)
def test_bad_submit_input_is_one_line_exit_2_and_nothing_submitted(
    data: Path, capsys, monkeypatch, tmp_path: Path, argv: list[str]
) -> None:
    from clusterjob import resources

    slurm = FakeSlurm(cluster="mllab")
    monkeypatch.setattr(Cluster, "client", lambda self, budget=None: slurm.client())
    monkeypatch.chdir(tmp_path)
    site = ["--site", str(resources.site_configs_dir() / "mllab.yaml")]
    assert run(["submit", TRAIN, "--gpus", "1", "-m", "a100", *site, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert slurm.calls == [] and not (tmp_path / "nodir").exists()


# --- the registry migrates in place -----------------------------------------------------------


def test_a_version_1_registry_gains_the_new_columns_in_place(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "jobs.sqlite"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, "
        "cluster TEXT NOT NULL DEFAULT '', site TEXT NOT NULL DEFAULT '', token TEXT NOT NULL "
        "UNIQUE, job_name TEXT NOT NULL DEFAULT '', script TEXT NOT NULL, script_path TEXT NOT "
        "NULL DEFAULT '', command_line TEXT NOT NULL DEFAULT '', work_dir TEXT NOT NULL DEFAULT "
        "'', git_commit TEXT, submitted_at REAL NOT NULL, resubmit_of TEXT, state TEXT NOT NULL "
        "DEFAULT 'SUBMITTED', reason TEXT, exit_code INTEGER, nodes TEXT, stdout_path TEXT, "
        "stderr_path TEXT, state_checked_at REAL, gpus TEXT, elapsed TEXT)"
    )
    conn.execute(
        "INSERT INTO jobs (job_id, token, script, submitted_at) VALUES ('7', 't7', '#!', 1)"
    )
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    registry = Registry(path)
    old = registry.get("7")
    assert old is not None and old.request is None and old.tasks is None
    registry.add(JobRecord("8", "c", "s", "t8", "x", "#!", "", "", "/w", None, 2, request="{}"))
    assert registry.get("8").request == "{}"
    check = sqlite3.connect(path)  # sqlite3's `with` commits, it does not close
    try:
        assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        check.close()


def test_a_rebuilt_clusters_job_with_an_old_id_is_not_taken_for_the_old_one(data: Path) -> None:
    """A rebuilt cluster starts its job ids again: the registry's old job 100 is not the new
    job 100 (squeue shows another token; sacct a submit time far from the record's)."""
    slurm = FakeSlurm()
    registry = Registry()
    new = slurm.add_job(state="RUNNING", reason="None", comment="clusterjob:someone-else")
    old = JobRecord(new, "fake", "s", "old-token", "x", "#!", "", "", "/w", None, time.time())
    registry.add(old)
    (row,) = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert row.state == "UNKNOWN" and "another job now" in row.explanation
    slurm.jobs[new].update(state="COMPLETED", comment="")
    slurm.forgotten.add(new)
    registry = Registry(data / "other.db")
    registry.add(
        JobRecord(
            new, "fake", "s", "old-token", "x", "#!", "", "", "/w", None, time.time() - 7 * 86400
        )
    )
    (row,) = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert row.state == "UNKNOWN"
    # the same job requeued later (Slurm does so after a node failure, --requeue or not):
    # a later submit time under the same name is still this job
    registry = Registry(data / "third.db")
    registry.add(JobRecord(new, "fake", "s", "tok3", "train", "#!", "", "", "/w", None,
                           time.time() - 3600))  # fmt: skip
    (row,) = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    assert (row.state, row.source) == ("COMPLETED", "sacct")


# --- explanations as Slurm 22.05 gives them ---------------------------------------------------


@pytest.mark.parametrize(
    ("state", "reason", "words"),
    [
        # afterok on a job that was cancelled (seen on the local cluster: 22.05)
        ("PENDING", "DependencyNeverSatisfied", "failed or was cancelled"),
        # a requeued job waits for its restart delay with reason BeginTime
        ("PENDING", "BeginTime", "after a requeue"),
        # an array held back by its %N limit
        ("PENDING", "JobArrayTaskLimit", "at once"),
        # sacct keeps the last pending reason of a job that since ran: no stale text
        ("COMPLETED", "Dependency", ""),
        ("FAILED", "JobArrayTaskLimit", ""),
        ("OUT_OF_MEMORY", "Resources", "host memory"),
    ],
)
def test_explanations_fit_the_state(state: str, reason: str, words: str) -> None:
    from clusterjob.jobs.explain import explain

    text = explain(state, reason, "42")
    assert words in text
    assert bool(text) is bool(words)


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "--since", "yesterday"],
        ["status", "--watch", "--interval", "0"],
        ["wait", "1", "--interval", "0"],
        ["wait"],
        ["logs", "5_1", "--task", "2"],
        ["logs", "5_x"],
        ["show", "424242"],
        ["resubmit", "424242"],
    ],
)
def test_bad_lifecycle_input_is_one_line_exit_2(data: Path, capsys, argv: list[str]) -> None:
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err


def test_a_requeued_job_says_so_with_its_restart_count(data: Path) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    job = slurm.add_job(state="PENDING", reason="BeginTime", restarts="2",
                        start="2026-12-01T15:05:22")  # fmt: skip
    plain = slurm.add_job(state="PENDING", reason="BeginTime")
    for job_id, script in ((job, "#SBATCH --requeue\n"), (plain, "#!/bin/bash\n")):
        registry.add(JobRecord(job_id, "fake", "s", f"t{job_id}", "x", script, "", "", "/w",
                               None, time.time()))  # fmt: skip
    rows = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
    by_id = {r.job_id: r for r in rows}
    assert by_id[job].restarts == 2
    assert by_id[job].explanation == "requeued (restart 2), eligible at 15:05"
    assert by_id[plain].restarts is None and "--begin" in by_id[plain].explanation
    assert len(slurm.commands("scontrol")) == 1  # only for the job that may have been requeued


@pytest.mark.parametrize("first", ["squeue", "sacct"])
def test_a_requeued_jobs_restarts_stay_its_true_count_once_it_ends(data: Path, first: str) -> None:
    """Seen: `status --json` said "restarts": 1 while the requeued job waited and null once it
    ended (null for a job requeued six times). Only scontrol has the count: it is asked while
    the job waits after a requeue and once more when it ends, and the registry keeps it for
    the rows of every source after that (squeue, sacct, the registry)."""
    slurm = FakeSlurm()
    registry = Registry()
    job = slurm.add_job(state="PENDING", reason="BeginTime", restarts="1")
    registry.add(JobRecord(job, "fake", "s", "t1", "x", "#SBATCH --requeue\n", "", "", "/w",
                           None, time.time()))  # fmt: skip
    seen: list[tuple[str, str, int | None]] = []

    def look(**fields: str) -> None:
        slurm.jobs[job].update(fields)
        (row,) = status(client=slurm.client(), registry=registry, cache=StatusCache(ttl=0))
        seen.append((row.source, row.state, row.restarts))

    look()
    look(state="RUNNING", reason="None")
    look(state="PENDING", reason="BeginTime", restarts="2")
    look(state="RUNNING", reason="None", restarts="5")  # requeued meanwhile, unseen
    if first == "squeue":
        slurm.unrecorded_end.add(job)  # squeue sees the end before slurmdbd has it
    look(state="COMPLETED", exit_code="0:0", restarts="6")
    slurm.forgotten.add(job)
    look()  # the registry
    assert seen == [
        ("squeue", "PENDING", 1), ("squeue", "RUNNING", 1), ("squeue", "PENDING", 2),
        ("squeue", "RUNNING", 2), (first, "COMPLETED", 6), ("registry", "COMPLETED", 6),
    ]  # fmt: skip
    assert registry.get(job).restarts == 6


def test_an_array_recorded_as_ended_without_its_tasks_stays_as_recorded(data: Path) -> None:
    slurm = FakeSlurm()
    registry = Registry()
    record = track_array(registry, "77", "0-3")
    registry.update_states(
        [job_status.StateUpdate(record.token, "fake", "COMPLETED", None, 0)], checked_at=1.0
    )
    (row,) = status(["77"], client=slurm.client(), registry=registry)
    assert (row.state, row.exit_code, row.source) == ("COMPLETED", 0, "registry")
    assert slurm.calls == []


def test_an_array_with_tasks_nobody_knows_is_unknown_not_pending_forever(data: Path) -> None:
    slurm = FakeSlurm(accounting=False)
    registry = Registry()
    job = slurm.add_array({0: ("COMPLETED", "0:0"), 1: ("FAILED", "2:0")})
    slurm.forgotten.add(f"{job}_0")  # ended over MinJobAge ago, and no accounting
    track_array(registry, job, "0-1")
    (row,) = status([job], client=slurm.client(), registry=registry)
    assert row.state == "UNKNOWN" and row.exit_code is None
    assert row.tasks_summary == "2 tasks: 1 FAILED, 1 UNKNOWN"  # squeue has no exit codes
    assert not parse.is_final(registry.get(job).state)
