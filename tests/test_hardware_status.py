"""A job failed by a GPU says so: ``status`` reads the Epilog's drain reason on the job's node
(one ``scontrol show node``, only for jobs that ended badly) and tells it apart from a program
that exited non-zero. The node records are parsed from recorded ``scontrol show node -o``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from clusterjob.jobs.hardware import finding_in_reason, node_in, with_hardware
from clusterjob.jobs.status import JobStatus, StatusCache
from clusterjob.jobs.wait import WaitResult
from clusterjob.slurm import parse

XID_REASON = (
    "clusterjob: Xid 79 (GPU fell off the bus) on gpu2 0000:3b:00.0 during job 123 "
    "[root@2026-12-03T22:10:01]"
)


def _node(name: str, state: str, reason: str | None) -> str:
    tail = f" Reason={reason}" if reason else ""
    return (
        f"NodeName={name} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=8 "
        f"Gres=gpu:a100:4 NodeAddr=127.0.0.1 State={state} Partitions=gpu{tail}"
    )


class NodeClient:
    """``SlurmClient.nodes`` over recorded output; counts its calls."""

    def __init__(self, *lines: str) -> None:
        self.output = "\n".join(lines) + "\n"
        self.calls: list[str | None] = []

    def nodes(self, names: str | None = None) -> list[parse.NodeRecord]:
        self.calls.append(names)
        return parse.parse_scontrol_nodes(self.output)


def _row(job_id: str = "123", state: str = "FAILED", exit_code: int | None = 1) -> JobStatus:
    return JobStatus(job_id, "c", "train", state, None, "", "gpu[1-2]", "00:05:00", exit_code,
                     None, "lab", "sacct")  # fmt: skip


@pytest.fixture
def cache(tmp_path: Path) -> StatusCache:
    return StatusCache(tmp_path / "cache.json", ttl=10)


@pytest.mark.parametrize(
    ("reason", "job", "found"),
    [
        (XID_REASON, "123", "Xid 79 (GPU fell off the bus) on gpu2 0000:3b:00.0"),
        (XID_REASON, "1234", None),  # another job's
        (XID_REASON, "123_4", "Xid 79 (GPU fell off the bus) on gpu2 0000:3b:00.0"),
        (
            "clusterjob: Xid 48 (double-bit ECC error) on gpu0 0000:07:00.0 during job 9 (+1 more)",
            "9",
            "Xid 48 (double-bit ECC error) on gpu0 0000:07:00.0 (+1 more)",
        ),  # fmt: skip
        ("clusterjob: model-mismatch: slot 0", "123", None),  # the Prolog's: no job named
        ("bad fan, ticket 1234 during job 123", "123", None),  # an admin's words
        (None, "123", None),
    ],
)
def test_finding_in_reason(reason: str | None, job: str, found: str | None) -> None:
    assert finding_in_reason(reason, job) == found


def test_a_gpu_failure_is_named_and_not_blamed_on_the_program(cache: StatusCache) -> None:
    client = NodeClient(_node("gpu1", "IDLE", None), _node("gpu2", "IDLE+DRAIN", XID_REASON))
    (row,) = with_hardware([_row()], client, cache, 1000.0)  # type: ignore[arg-type]
    assert row.hardware == "Xid 79 (GPU fell off the bus) on gpu2 0000:3b:00.0 on node gpu2"
    assert row.explanation == (
        "hardware: Xid 79 (GPU fell off the bus) on gpu2 0000:3b:00.0 on node gpu2 during the "
        "job, not your program (its exit 1 followed from it); the node is drained"
    )
    assert row.to_dict()["hardware"] == row.hardware  # --json carries it
    assert client.calls == ["gpu[1-2]"]
    assert str(WaitResult([row], False)).endswith(
        ": hardware: Xid 79 (GPU fell off the bus) on gpu2 0000:3b:00.0 on node gpu2 during the job"
    )


def test_a_program_that_failed_on_its_own_says_nothing_of_hardware(cache: StatusCache) -> None:
    client = NodeClient(_node("gpu1", "IDLE", None), _node("gpu2", "IDLE", None))
    (row,) = with_hardware([_row()], client, cache, 1000.0)  # type: ignore[arg-type]
    assert (row.hardware, row.explanation) == (None, "")
    assert str(WaitResult([row], False)) == "123 FAILED (exit 1)"


def test_no_slurm_call_for_jobs_that_completed_or_still_run(cache: StatusCache) -> None:
    client = NodeClient(_node("gpu2", "IDLE+DRAIN", XID_REASON))
    rows = [_row(state="COMPLETED", exit_code=0), _row(state="RUNNING", exit_code=None)]
    assert with_hardware(rows, client, cache, 1000.0) == rows  # type: ignore[arg-type]
    assert client.calls == []


def test_the_answer_is_shared_through_the_status_cache(cache: StatusCache) -> None:
    client = NodeClient(_node("gpu2", "IDLE+DRAIN", XID_REASON))
    for now in (1000.0, 1005.0):
        (row,) = with_hardware([_row()], client, cache, now)  # type: ignore[arg-type]
        assert row.hardware is not None
    assert len(client.calls) == 1


def test_a_job_the_registry_serves_costs_no_call_and_keeps_its_finding(
    cache: StatusCache,
) -> None:
    client = NodeClient(_node("gpu2", "IDLE+DRAIN", XID_REASON))
    with_hardware([_row(), _row("124")], client, cache, 1000.0)  # type: ignore[arg-type]
    later = [replace(_row(), source="registry"), replace(_row("124"), source="registry")]
    rows = with_hardware(later, client, cache, 5000.0)  # type: ignore[arg-type]
    assert [r.hardware is not None for r in rows] == [True, False]
    assert len(client.calls) == 1


def test_slurms_epilog_error_is_asked_about_again(cache: StatusCache) -> None:
    early = NodeClient(_node("gpu2", "IDLE+DRAIN", "Epilog error [slurm@2026-12-03T22:10:00]"))
    (row,) = with_hardware([_row()], early, cache, 1000.0)  # type: ignore[arg-type]
    assert row.hardware is None
    late = NodeClient(_node("gpu2", "IDLE+DRAIN", XID_REASON))
    (row,) = with_hardware([_row()], late, cache, 1100.0)  # type: ignore[arg-type]
    assert row.hardware is not None


def test_a_drain_reason_on_a_node_the_job_did_not_use_is_not_its(cache: StatusCache) -> None:
    client = NodeClient(_node("gpu7", "IDLE+DRAIN", XID_REASON))
    (row,) = with_hardware([_row()], client, cache, 1000.0)  # type: ignore[arg-type]
    assert row.hardware is None


def test_node_in_hostlist() -> None:
    assert node_in("gpu2", "gpu[1-3]") and not node_in("gpu4", "gpu[1-3]")
    assert node_in("a1", "a1,b2") and not node_in("a", "a1,b2")


def test_a_row_already_said_is_left_alone(cache: StatusCache) -> None:
    client = NodeClient(_node("gpu2", "IDLE+DRAIN", XID_REASON))
    said = replace(_row(), hardware="x")
    assert with_hardware([said], client, cache, 1000.0) == [said]  # type: ignore[arg-type]
    assert client.calls == []


def test_status_of_a_job_whose_gpu_fell_off_the_bus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through ``status``: the Epilog's drain reason on the job's node names the fault, the
    end is recorded, and the next call serves both from the registry without Slurm."""
    from slurm_fake import FakeSlurm
    from test_jobs import track

    from clusterjob.jobs.registry import Registry
    from clusterjob.jobs.status import status

    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    slurm = FakeSlurm()
    registry = Registry()
    hit = slurm.add_job(state="FAILED", reason="NonZeroExitCode", exit_code="1:0", nodes="gpu2")
    own = slurm.add_job(state="FAILED", reason="NonZeroExitCode", exit_code="1:0", nodes="gpu1")
    slurm.drained["gpu2"] = XID_REASON.replace("job 123", f"job {hit}")
    for job_id in (hit, own):
        track(registry, slurm, job_id, state="RUNNING")
    for _ in range(2):
        rows = {r.job_id: r for r in status(client=slurm.client(), registry=registry)}
        assert rows[hit].hardware == (
            "Xid 79 (GPU fell off the bus) on gpu2 0000:3b:00.0 on node gpu2"
        )
        assert rows[hit].explanation.startswith("hardware: Xid 79 (GPU fell off the bus)")
        assert (rows[own].hardware, rows[own].exit_code) == (None, 1)
    assert len(slurm.commands("scontrol")) == 1


def test_show_carries_what_status_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_fake import FakeSlurm
    from test_jobs import track

    from clusterjob.jobs.registry import Registry
    from clusterjob.jobs.status import status
    from clusterjob.jobs.submit import provenance

    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    slurm = FakeSlurm()
    registry = Registry()
    job = slurm.add_job(state="FAILED", reason="NonZeroExitCode", exit_code="1:0", nodes="gpu2")
    track(registry, slurm, job, state="RUNNING")
    assert provenance(job, registry=registry)["hardware"] is None
    slurm.drained["gpu2"] = XID_REASON.replace("job 123", f"job {job}")
    status(client=slurm.client(), registry=registry)
    assert provenance(job, registry=registry)["hardware"] == (
        "Xid 79 (GPU fell off the bus) on gpu2 0000:3b:00.0 on node gpu2"
    )
