"""GridEngineControl, the jobs layer's view of Grid Engine (clusterjob.jobscript.control), fed
with output recorded from the local Grid Engine cluster (tests/fixtures/gridengine)."""

from __future__ import annotations

from clusterjob.gridengine.commands import GridEngineClient
from clusterjob.gridengine.parse import parse_qstat_j
from clusterjob.jobscript.backends import BACKENDS, backend_named
from clusterjob.jobscript.control import GridEngineControl, TaskState, pending_text
from tests.test_gridengine_runner import Commands, recorded, runner


def control(fake: Commands) -> GridEngineControl:
    return GridEngineControl(GridEngineClient(runner(fake)))


def test_one_qstat_for_the_live_jobs_and_qacct_only_for_those_it_no_longer_lists() -> None:
    fake = Commands(
        {
            "qstat": [(0, recorded("qstat-xml-array.xml"), "")],
            "qacct": [
                (0, recorded("qacct-j-exit3.txt"), ""),
                (0, recorded("qacct-j-deleted.txt"), ""),
            ],
        }
    )
    found = control(fake).states(["14", "17", "19"])
    assert fake.seen == [
        ["qstat", "-xml", "-r", "-u", "*"],
        ["qacct", "-j", "17"],
        ["qacct", "-j", "19"],
    ]
    # an array: the running task 1 and the pending range 2-4, counted from 0 as --array's
    assert [(t.task, t.state) for t in found["14"]] == [
        (0, "RUNNING"),
        (1, "PENDING"),
        (2, "PENDING"),
        (3, "PENDING"),
    ]
    assert found["17"] == (TaskState(None, "FAILED", 3, None, found["17"][0].nodes, "qacct"),)
    (deleted,) = found["19"]
    assert (deleted.state, deleted.exit_code) == ("CANCELLED", 137)
    assert deleted.reason == "failed 100: assumedly after job"


def test_a_job_in_neither_is_left_out() -> None:
    fake = Commands(
        {
            "qstat": [(0, recorded("qstat-xml-empty.xml"), "")],
            "qacct": [(1, "", recorded("qacct-j-missing.txt"))],
        }
    )
    assert control(fake).states(["12"]) == {}


def test_a_job_waiting_for_gpus_says_which_hosts_lack_them() -> None:
    detail = parse_qstat_j(recorded("qstat-j-pending.txt"))
    assert pending_text(detail) == (
        "waiting for GPUs (it asks for 4): host3 has 2 free, host1 has 2 free, host2 has 0 free"
    )


def test_cancel_reports_the_jobs_qdel_did_not_know() -> None:
    fake = Commands(
        {"qdel": [(0, recorded("qdel-running.txt"), ""), (1, "", recorded("qdel-missing.txt"))]}
    )
    assert control(fake).cancel(["20", "99"]) == ["99"]


def test_the_registry_s_scheduler_names_the_backend() -> None:
    assert backend_named(None) is BACKENDS["slurm"]  # an older record: Slurm's
    assert backend_named("slurm").control() is None  # the jobs layer's own Slurm path
    assert isinstance(backend_named("gridengine").control(), GridEngineControl)
