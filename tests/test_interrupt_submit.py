"""Ctrl-C in the middle of a submission never leaves a job that clusterjob does not know.

A real SIGINT is sent to this process from inside the (fake) sbatch, as a terminal's Ctrl-C
reaches clusterjob while sbatch runs in its own session. The submission is recorded before
sbatch runs and completed after; one Ctrl-C waits for the record and then says which job was
submitted, a second stops at once and leaves the record for ``status`` to settle by its
token. The same on the real cluster: tests/e2e/test_interrupt_submit.py.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from slurm_fake import FakeSlurm

from clusterjob import resources
from clusterjob.errors import SlurmError, SlurmUnavailable
from clusterjob.jobs.registry import Registry
from clusterjob.jobs.status import status
from clusterjob.jobs.submit import Submitted, provenance, submit
from clusterjob.jobscript.render import render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site.loader import load_site
from clusterjob.slurm.commands import SlurmClient
from clusterjob.slurm.runner import Runner, SlurmResult

TRAIN = str(Path(__file__).resolve().parents[1] / "examples" / "train.py")


@pytest.fixture(autouse=True)
def ctrl_c_raises() -> Iterator[None]:
    """Python's own SIGINT handler, as in a terminal's foreground job: a test run started in
    the background (a CI script's `&`) inherits SIGINT ignored, and Python then installs none."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Registry:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    return Registry(tmp_path / "data" / "jobs.sqlite")


class InterruptedSlurm(FakeSlurm):
    """Ctrl-C (``interrupts`` SIGINTs to this process) while sbatch runs, before it answers."""

    def __init__(self, interrupts: int) -> None:
        super().__init__()
        self.interrupts = interrupts

    def __call__(self, cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        if cmd[0] == "sbatch":
            result = super().__call__(cmd, timeout, input)  # the job exists from here on
            for _ in range(self.interrupts):
                os.kill(os.getpid(), signal.SIGINT)
            return result
        return super().__call__(cmd, timeout, input)


def submit_job(slurm: FakeSlurm, registry: Registry) -> Submitted:
    site = load_site(resources.site_configs_dir() / "mllab.yaml")
    resolved = resolve(site, JobRequest(script=TRAIN, model="a100"))
    result = submit(
        site, resolved, render(site, resolved), client=slurm.client(), registry=registry,
        workdir="/w",
    )  # fmt: skip
    assert isinstance(result, Submitted)
    return result


def test_ctrl_c_while_sbatch_runs_waits_for_the_record_and_names_the_job(
    registry: Registry,
) -> None:
    slurm = InterruptedSlurm(interrupts=1)
    with pytest.raises(KeyboardInterrupt) as info:
        submit_job(slurm, registry)
    assert str(info.value) == (
        "interrupted: job 100 was submitted and is recorded; cancel it with `clusterjob cancel 100`"
    )
    (record,) = registry.all()
    assert record.job_id == "100" and list(slurm.jobs) == ["100"]
    assert slurm.jobs["100"]["comment"] == f"clusterjob:{record.token}"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back


def test_a_second_ctrl_c_stops_at_once_and_status_finds_the_job_by_its_token(
    registry: Registry,
) -> None:
    slurm = InterruptedSlurm(interrupts=2)
    with pytest.raises(KeyboardInterrupt) as info:
        submit_job(slurm, registry)
    (pending,) = registry.pending()
    assert str(info.value) == (
        "interrupted while sbatch ran: the job may or may not exist; `clusterjob status` "
        f"looks for it (its comment is clusterjob:{pending.token}) and records it"
    )
    assert list(slurm.jobs) == ["100"]  # sbatch created it before the interrupt
    assert registry.all() == []  # no id yet: not listed, not `last`
    # `show 100` settles it (one squeue --me) and knows where it came from
    shown = provenance("100", registry=registry, client=slurm.client())
    assert (shown["job_id"], shown["token"]) == ("100", pending.token)
    assert registry.pending() == []
    rows = status(client=slurm.client(), registry=registry)
    assert [(r.job_id, r.state) for r in rows] == [("100", "PENDING")]


def test_status_settles_an_interrupted_submission(registry: Registry) -> None:
    slurm = InterruptedSlurm(interrupts=2)
    with pytest.raises(KeyboardInterrupt):
        submit_job(slurm, registry)
    rows = status(client=slurm.client(), registry=registry)
    assert [r.job_id for r in rows] == ["100"]
    assert [r.job_id for r in registry.all()] == ["100"] and registry.pending() == []


def test_an_interrupted_submission_that_created_no_job_is_forgotten_after_its_window(
    registry: Registry,
) -> None:
    """sbatch killed before the controller had the request: no job with the token. Within
    the submission's window the record waits (the controller may still be at it), then goes."""
    slurm = InterruptedSlurm(interrupts=2)
    with pytest.raises(KeyboardInterrupt):
        submit_job(slurm, registry)
    slurm.jobs.clear()  # as if the request never reached the controller
    (pending,) = registry.pending()
    status(client=slurm.client(), registry=registry, now=pending.submitted_at + 10)
    assert registry.pending() == [pending]
    status(client=slurm.client(), registry=registry, now=pending.submitted_at + 600)
    assert registry.pending() == [] and registry.all() == []


def test_a_refused_submission_leaves_no_record(registry: Registry) -> None:
    slurm = FakeSlurm()
    slurm.sbatch_plan = ["sbatch: error: Batch job submission failed: Invalid account"]
    with pytest.raises(SlurmError):
        submit_job(slurm, registry)
    assert registry.pending() == [] and registry.all() == []


def test_an_uncertain_submission_keeps_its_record_for_status(registry: Registry) -> None:
    """sbatch timed out and Slurm could not be asked about the token: the record stays, so
    the job, if it exists, is found later."""
    slurm = FakeSlurm()
    slurm.sbatch_plan = ["timeout_created"]
    real = slurm.__call__

    def squeue_down(cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        if cmd[0] == "squeue":
            return SlurmResult(tuple(cmd), 1, "", "squeue: error: Invalid user for SlurmUser")
        return real(cmd, timeout, input)

    client = SlurmClient(Runner(squeue_down, sleep=slurm.sleep, clock=slurm.clock))
    site = load_site(resources.site_configs_dir() / "mllab.yaml")
    resolved = resolve(site, JobRequest(script=TRAIN, model="a100"))
    with pytest.raises(SlurmUnavailable, match="may or may not have created the job"):
        submit(site, resolved, render(site, resolved), client=client, registry=registry,
               workdir="/w")  # fmt: skip
    (pending,) = registry.pending()
    assert [r.job_id for r in status(client=slurm.client(), registry=registry)] == ["100"]
    assert registry.by_token(pending.token).job_id == "100"  # type: ignore[union-attr]
